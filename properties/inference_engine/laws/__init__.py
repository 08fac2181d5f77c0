"""The laws of the inference engine, by what they judge: generation (EN-1, EN-2, EN-3, KV-2;
``engine.py``), serving (PA-6, PA-7, PA-8 for a whole engine; ``serving.py``) and the
capabilities an engine declares absent (``declared.py``). The plugin collects each module's laws
as their tests."""
