"""The speculative_tree laws (one subpackage per technique)."""
