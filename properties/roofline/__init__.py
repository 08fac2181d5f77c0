"""The roofline laws (one subpackage per technique)."""
