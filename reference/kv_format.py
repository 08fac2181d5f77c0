"""The float64 reference of the ``kv_format`` contract (claim QT-12): the formats of
:mod:`inference_conformance.reference.quantization.kv` (int8 and FP8 per token and head, int4
KIVI), computed in float64, held compactly as the contract counts bytes: int8 codes as int8, FP8
codes in torch's 8-bit dtype (each is on the grid: exact), int4 codes u = q + 8 packed two per
byte along D, low nibble first; float64 scales; the full-precision tokens as given.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from inference_conformance.conformance.contracts.kv_format import validate
from inference_conformance.conformance.contracts.quantization.fp8 import FP8_FORMATS
from inference_conformance.reference.quantization import kv as ref_kv


@dataclass(frozen=True)
class StoredKV:
    """What the reference holds: the :class:`~inference_conformance.reference.quantization.kv.QuantizedKV`
    fields with compact codes (see the module) and ``D``, the head dim."""

    k_codes: torch.Tensor
    v_codes: torch.Tensor
    k_scales: torch.Tensor
    v_scales: torch.Tensor
    k_rest: torch.Tensor
    v_rest: torch.Tensor
    fmt: object
    dtype: torch.dtype
    D: int


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """int4 codes q (..., D) in -7..7 -> u = q + 8 two per byte along D, low nibble first,
    (..., ceil(D / 2)) uint8 (an odd D's last byte holds one code)."""
    u = (q.to(torch.int64) + 8)
    u = torch.nn.functional.pad(u, (0, u.shape[-1] % 2))
    return (u[..., 0::2] | (u[..., 1::2] << 4)).to(torch.uint8)


def unpack_nibbles(c: torch.Tensor, D: int) -> torch.Tensor:
    """Inverse of :func:`pack_nibbles`: (..., ceil(D / 2)) uint8 -> (..., D) int64 in -7..7."""
    c = c.to(torch.int64)
    u = torch.stack([c & 15, c >> 4], dim=-1).flatten(-2)[..., :D]
    return u - 8


def _compact(codes: torch.Tensor, fmt) -> torch.Tensor:
    if fmt.kind in FP8_FORMATS:
        return codes.to(getattr(torch, FP8_FORMATS[fmt.kind].torch_dtype))
    return pack_nibbles(codes) if fmt.kind == "int4_kivi" else codes


def _wide(codes: torch.Tensor, fmt, D: int) -> torch.Tensor:
    return unpack_nibbles(codes, D) if fmt.kind == "int4_kivi" else codes.to(torch.float64)


def quantize_kv(k: torch.Tensor, v: torch.Tensor, *, format) -> StoredKV:
    """The contract's quantize_kv in float64 (steps as ``quantization.kv.kv_step``). Raises as
    the contract's ``validate``."""
    D = validate(k, v, format)[3]
    q = ref_kv.quantize_kv(k, v, format)
    return StoredKV(_compact(q.k_codes, format), _compact(q.v_codes, format), q.k_scales, q.v_scales,
                    q.k_rest, q.v_rest, format, k.dtype, D)


def dequantize_kv(stored: StoredKV) -> tuple[torch.Tensor, torch.Tensor]:
    """(k_hat, v_hat) (B, H, T, D) in the cache's dtype: codes x scales in float64, rounded once.
    TypeError naming ``stored`` for anything but a :class:`StoredKV`."""
    if not isinstance(stored, StoredKV):
        raise TypeError(f"stored must be what this quantize_kv returned (a StoredKV), got {type(stored).__name__}")
    f, D = stored.fmt, stored.D
    q = ref_kv.QuantizedKV(_wide(stored.k_codes, f, D), _wide(stored.v_codes, f, D), stored.k_scales,
                           stored.v_scales, stored.k_rest, stored.v_rest, f, stored.dtype)
    return ref_kv.dequantize_kv(q)


def implementations():
    """The float64 reference of the kv_format contract."""
    import sys

    from inference_conformance.conformance.registry import builtin

    return (builtin("kv_format", "reference", sys.modules[__name__]),)
