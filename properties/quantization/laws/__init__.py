"""The laws of weight quantization, by scheme: integer (QT-1, QT-2) and every scheme's product
(QT-9; ``integer.py``), FP8 (QT-11; ``fp8.py``), FP4 (QT-13; ``fp4.py``) and the kernels'
launches (``kernels.py``). The plugin collects each module's laws as their tests."""
