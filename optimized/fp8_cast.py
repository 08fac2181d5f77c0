"""The optimized built-in of the ``fp8_cast`` contract (claim QT-11): "torch", PyTorch's own cast
``x.to(torch.float8_e4m3fn / float8_e5m2)``, clamped to ±F first for ``saturate=True`` (NaN stays
NaN: the clamp keeps it), and as it is for ``saturate=False``. It is PyTorch's conversion, not
the suite's: where it departs from the contract (``expectations/fp8_cast-torch.toml``) the law
says so. (The suite has no Triton FP8 encoder: its kernels decode FP8 codes, they never round to
them.)
"""
from __future__ import annotations

import torch

from inference_conformance.conformance.contracts.fp8_cast import fp8_dtype, validate


def torch_cast(x: torch.Tensor, *, format: str, saturate: bool) -> torch.Tensor:
    """``x.clamp(-F, F).to(float8)`` with ``saturate``, else ``x.to(float8)``: x's shape and
    device. Raises as the contract's ``validate``."""
    f = validate(x, format, saturate)
    src = x.clamp(-f.max, f.max) if saturate else x
    return src.to(fp8_dtype(format))


def implementations():
    """PyTorch's cast as the fp8_cast contract's optimized built-in."""
    from inference_conformance.conformance.registry import builtin

    return (builtin("fp8_cast", "torch", torch_cast),)
