"""The FP8 cast laws (claim QT-11)."""
