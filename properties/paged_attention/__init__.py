"""The paged_attention laws (one subpackage per technique)."""
