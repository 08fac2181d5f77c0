"""The packed storage the vectorized quantization and the Triton quantized matmul share
(claims QT-2, QT-9; lecture 001 §5.1): :func:`pack` / :func:`unpack` (codes along the last
dimension, ``codes_per_byte(bits)`` per byte, first element in the low bits, as
``reference/quantization/__init__.py``), :func:`round_scale` (scales rounded up to ``SCALE_BITS``
significant bits) and :func:`storable` (a scale as it will be stored, rounded up where the cast
rounds down).
"""
from __future__ import annotations

import torch

from inference_conformance.reference.quantization import SCALE_BITS, codes_per_byte


def pack(u: torch.Tensor, bits: int) -> torch.Tensor:
    """(R, L) codes -> (R, ceil(L / per)) uint8, first element in the low bits."""
    per = codes_per_byte(bits)
    R, L = u.shape
    pad = (-L) % per
    u = torch.nn.functional.pad(u.to(torch.int32), (0, pad)).reshape(R, -1, per)
    shifts = torch.arange(per, device=u.device, dtype=torch.int32) * bits
    return (u << shifts).sum(dim=-1).to(torch.uint8)


def unpack(codes: torch.Tensor, bits: int, L: int) -> torch.Tensor:
    """(R, ceil(L / per)) uint8 -> (R, L) int32."""
    per = codes_per_byte(bits)
    shifts = torch.arange(per, device=codes.device, dtype=torch.int32) * bits
    u = (codes.to(torch.int32)[..., None] >> shifts) & (2 ** bits - 1)
    return u.reshape(codes.shape[0], -1)[:, :L]


def round_scale(s: torch.Tensor) -> torch.Tensor:
    """float64 scales rounded up to 16 significant bits (0 stays 0)."""
    m, e = torch.frexp(s)
    return torch.ldexp(torch.ceil(m * 2 ** SCALE_BITS) / 2 ** SCALE_BITS, e.to(torch.float64))


def storable(s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 scales as they will be stored in ``dtype``, rounded UP where the cast rounds down
    (only a step below float32's normal range, from a group made of subnormals, is not exact), so
    codes are computed with the stored scale and never clip; returned in float64."""
    st = s.to(dtype)
    st = torch.where(st.to(torch.float64) < s, torch.nextafter(st, torch.full_like(st, float("inf"))), st)
    return st.to(torch.float64)
