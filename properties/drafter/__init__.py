"""Laws of drafters (SD-12, SD-14): see test_drafter.py."""
