"""Checks several contracts share, each raising the contract's documented error with the
argument's name: a tensor argument's type, rank and dtype (:func:`check_tensor`) and the softmax
``scale`` of the attention contracts (:func:`check_scale`).
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


def check_tensor(name: str, t, rank: int, dims: str, dtypes: tuple, technique: str) -> None:
    """``t`` (the argument ``name``) must be a torch.Tensor of ``rank`` dimensions (``dims`` names
    them, e.g. "(B, H, T, D)") with a dtype in ``dtypes``, those of the ``technique`` contract.

    Raises TypeError for a non-tensor or another dtype, ValueError for another rank, each naming
    ``name``.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"{name} must have {rank} dimensions {dims}, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} has dtype {t.dtype}; the {technique} contract takes "
                        f"{[str(d).replace('torch.', '') for d in dtypes]}")
