"""The attention laws (one subpackage per technique)."""
