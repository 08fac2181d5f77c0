"""The quantization laws (one subpackage per technique)."""
