"""What the inference_engine technique measures outside pytest-benchmark: :mod:`.serving`, a server under load."""
