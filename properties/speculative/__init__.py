"""The speculative laws (one subpackage per technique)."""
