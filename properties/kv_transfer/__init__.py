"""The kv_transfer laws (one subpackage per technique)."""
