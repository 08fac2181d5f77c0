"""The laws of weight quantization, by scheme: integer (QT-1, QT-2) and every scheme's product
(QT-9; ``integer.py``), FP8 (QT-11; ``fp8.py``), FP4 (QT-13; ``fp4.py``), the kernels'
launches (``kernels.py``) and the W8A8 product (QT-9; ``w8a8.py``). The plugin collects each
module's laws as their tests; a law with no test of its own (the W8A8 laws, the launch variants)
is run by the test files that import it."""
