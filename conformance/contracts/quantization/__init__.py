"""The ``quantization`` contract, in parts: the contract (``contract.py``: its text, ``CONTRACT``,
the argument checks, the step, cases, coverage classes and bad calls), QT-1's bound and the
declared schemes (``bounds.py``), the FP8 formats (``fp8.py``), the FP4 block formats
(``fp4.py``) and the KV-cache formats (``kv.py``). The contract's names are re-exported here:
``contracts.quantization.X`` is ``contract.py``'s ``X``; the others are imported from their
module (``contracts.quantization.fp8``)."""
from inference_conformance.conformance.contracts.quantization.contract import (
    CONTRACT,
    COVERAGE,
    DTYPES,
    GROUP_KINDS,
    NAMED_GRANULARITIES,
    QUANT_MATMUL_RULE,
    SCALE_SLACK,
    QuantShape,
    act_order_g_idx,
    cases,
    invalid,
    levels,
    step,
    validate_bits,
    validate_g_idx,
    validate_granularity,
    validate_matmul,
    validate_quantize,
)

__all__ = ["CONTRACT", "COVERAGE", "DTYPES", "GROUP_KINDS", "NAMED_GRANULARITIES", "QUANT_MATMUL_RULE", "SCALE_SLACK",
           "QuantShape", "act_order_g_idx", "cases", "invalid", "levels", "step", "validate_bits", "validate_g_idx",
           "validate_granularity", "validate_matmul", "validate_quantize"]
