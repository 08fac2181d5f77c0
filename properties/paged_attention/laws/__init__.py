"""The laws of paged attention, by the call they judge: decode over a block table (PA-1,
``decode.py``), the mixed batch of decode tokens and prefill chunks (PA-8, ``prefill.py``), and
the attention options over both (FA-8, ``options.py``). The plugin collects each module's laws as
their tests."""
