"""The KV-cache format laws (claim QT-12)."""
