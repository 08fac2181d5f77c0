"""The float64 reference of the ``fp8_cast`` contract (claim QT-11): x's exact value (every input
dtype is exact in float64) rounded to nearest, ties to even, on the format's grid by the one
definition of the grid (:func:`inference_conformance.conformance.contracts.quantization.fp8.fp8_round`),
then :func:`encode`: a value past F saturates to ±F or overflows (NaN for E4M3fn, ±inf for E5M2),
and the grid value is stored in torch's 8-bit dtype (exact: it is on the grid).
"""
from __future__ import annotations

import torch

from inference_conformance.conformance.contracts.fp8_cast import fp8_dtype, validate
from inference_conformance.conformance.contracts.quantization.fp8 import fp8_round


def encode(y: torch.Tensor, format: str, saturate: bool) -> torch.Tensor:
    """``y`` (float64, on the format's grid unbounded above, or ±inf / NaN) as the contract's
    result: |y| > F (inf included) becomes ±F with ``saturate``, else NaN (E4M3fn) or ±inf
    (E5M2); NaN stays NaN; then stored in torch's 8-bit dtype of ``format``, on y's device."""
    f = validate(y, format, saturate)
    over = y.abs() > f.max                                   # NaN: False
    if saturate:
        past = torch.full_like(y, f.max)
    else:
        past = torch.full_like(y, float("nan") if format == "e4m3fn" else float("inf"))
    return torch.where(over, torch.copysign(past, y), y).to(fp8_dtype(format))


def fp8_cast(x: torch.Tensor, *, format: str, saturate: bool) -> torch.Tensor:
    """The contract's cast (``conformance/contracts/fp8_cast.py``) computed in float64: x's shape,
    torch's 8-bit dtype of ``format``, x's device. Raises as the contract's ``validate``."""
    f = validate(x, format, saturate)
    return encode(fp8_round(x, f.name), format, saturate)


def implementations():
    """The float64 reference of the fp8_cast contract."""
    from inference_conformance.conformance.registry import builtin

    return (builtin("fp8_cast", "reference", fp8_cast),)
