"""Naive, readable reference implementations (float64-capable), one module per technique."""
