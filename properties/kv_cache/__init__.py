"""The kv_cache laws (one subpackage per technique)."""
