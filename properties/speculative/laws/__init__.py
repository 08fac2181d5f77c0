"""The laws of speculative decoding, by what they judge: a ``verify`` function (SD-1, ``verify.py``)
and the suite's speculative engine (``engine.py``). The plugin collects each module's laws as
their tests."""
