"""The world laws (one subpackage per technique)."""
