"""Checks several contracts share, each raising the contract's documented error with the
argument's name: the softmax ``scale`` of the attention contracts (:func:`check_scale`).
No contract is declared here (the registry finds none: no ``CONTRACT``).
"""
from __future__ import annotations

import math
import numbers

import torch


def check_scale(scale, dtype: torch.dtype) -> None:
    """``scale`` must be a real number (not a bool), finite, and representable in the dtype the
    scores of ``dtype`` inputs are computed in (float64 for float64, else float32).

    Raises TypeError for a non-real (or bool) scale, ValueError for a non-finite one or one
    beyond that dtype's largest finite value, each naming ``scale``.
    """
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number (e.g. 1/sqrt(D)), got {type(scale).__name__}")
    if not math.isfinite(float(scale)):
        raise ValueError(f"scale must be finite, got {scale}")
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    if abs(float(scale)) > torch.finfo(acc).max:
        raise ValueError(f"scale must be representable in {str(acc).replace('torch.', '')}, the dtype the "
                         f"scores of {str(dtype).replace('torch.', '')} inputs are computed in "
                         f"(|scale| <= {torch.finfo(acc).max:.4g}), got {scale}")
