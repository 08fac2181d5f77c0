"""Reference KV-cache quantization formats (QT-12; lecture 001 §5.2): int8 and FP8 per token
and head, int4 KIVI (keys per channel over groups of tokens, values per token, the recent tokens
in full precision), as the contract's ``KVFormat`` says; float64 throughout
(:func:`quantize_kv`, :func:`dequantize_kv`, :func:`kv_nbytes`, :class:`KVOps`).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from inference_conformance.conformance.contracts.quantization import levels
from inference_conformance.conformance.contracts.quantization.kv import KVFormat, kv_quantized_tokens
from inference_conformance.conformance.contracts.quantization.fp8 import FP8_FORMATS
from inference_conformance.reference.quantization.fp8 import fp8_cast


@dataclass(frozen=True)
class QuantizedKV:
    """Keys and values (B, H, T, D) in a :class:`KVFormat`: ``k_codes``, ``v_codes`` the first
    Tq = kv_quantized_tokens(T) tokens' codes (int8 for int8 and KIVI, one code per element;
    FP8 grid values as float64 for FP8), ``k_scales``, ``v_scales`` float64 ((B, H, Tq, 1) per
    token; KIVI keys (B, H, Tq / G, D), one per group of G tokens and channel), ``k_rest``,
    ``v_rest`` the remaining T - Tq tokens in full precision (x's dtype), ``fmt``, ``dtype``."""

    k_codes: torch.Tensor
    v_codes: torch.Tensor
    k_scales: torch.Tensor
    v_scales: torch.Tensor
    k_rest: torch.Tensor
    v_rest: torch.Tensor
    fmt: KVFormat
    dtype: torch.dtype

    @property
    def tokens(self) -> int:
        return self.k_codes.shape[2] + self.k_rest.shape[2]


def _absmax_codes(x64: torch.Tensor, s: torch.Tensor, qmax: int) -> torch.Tensor:
    safe = torch.where(s > 0, s, 1.0)
    return torch.round(x64 / safe).clamp(-qmax, qmax).to(torch.int8)


def quantize_kv(k: torch.Tensor, v: torch.Tensor, fmt: KVFormat) -> QuantizedKV:
    """Quantize a cache's keys and values (B, H, T, D), float64 throughout (QT-12; the step of
    each element is the contract's ``kv_step``). Raises ValueError for k, v of other shapes."""
    if k.dim() != 4 or tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"k and v must both be (B, H, T, D), got {tuple(k.shape)} and {tuple(v.shape)}")
    B, H, T, D = k.shape
    Tq = kv_quantized_tokens(T, fmt)
    k64, v64 = k.detach().to(torch.float64)[:, :, :Tq], v.detach().to(torch.float64)[:, :, :Tq]
    if fmt.kind in FP8_FORMATS:
        top = FP8_FORMATS[fmt.kind].max
        ks, vs = k64.abs().amax(-1, keepdim=True) / top, v64.abs().amax(-1, keepdim=True) / top
        kc = torch.where(ks > 0, fp8_cast(k64 / torch.where(ks > 0, ks, 1.0), fmt.kind), 0.0)
        vc = torch.where(vs > 0, fp8_cast(v64 / torch.where(vs > 0, vs, 1.0), fmt.kind), 0.0)
    else:
        qmax = levels(fmt.code_bits, True)
        vs = v64.abs().amax(-1, keepdim=True) / qmax
        vc = _absmax_codes(v64, vs, qmax)
        if fmt.kind == "int4_kivi":                                   # keys per channel, per group of G tokens
            grouped = k64.reshape(B, H, Tq // fmt.group, fmt.group, D)
            ks = grouped.abs().amax(dim=3) / qmax                      # (B, H, Tq / G, D)
            kc = _absmax_codes(grouped, ks[:, :, :, None], qmax).reshape(B, H, Tq, D)
        else:
            ks = k64.abs().amax(-1, keepdim=True) / qmax
            kc = _absmax_codes(k64, ks, qmax)
    return QuantizedKV(kc, vc, ks, vs, k[:, :, Tq:].clone(), v[:, :, Tq:].clone(), fmt, k.dtype)


def dequantize_kv(qkv: QuantizedKV) -> tuple[torch.Tensor, torch.Tensor]:
    """(k_hat, v_hat) (B, H, T, D) in the cache's dtype: codes x scales in float64, rounded once,
    the full-precision tokens as stored."""
    fmt = qkv.fmt
    kc, vc = qkv.k_codes.to(torch.float64), qkv.v_codes.to(torch.float64)
    if fmt.kind == "int4_kivi":
        ks = qkv.k_scales.repeat_interleave(fmt.group, dim=2)          # group g covers tokens gG .. gG + G - 1
    else:
        ks = qkv.k_scales
    k_hat = torch.cat([(kc * ks).to(qkv.dtype), qkv.k_rest], dim=2)
    v_hat = torch.cat([(vc * qkv.v_scales).to(qkv.dtype), qkv.v_rest], dim=2)
    return k_hat, v_hat


def kv_nbytes(qkv: QuantizedKV, scale_bytes: int = 4) -> int:
    """Bytes the format holds, counted from its tensors: one byte per int8 / FP8 code, half a
    byte per int4 code (two per byte, as packed), ``scale_bytes`` per scale (float32 scales, as
    ``inference_conformance.optimized.quantization`` holds them), the full-precision tokens at their dtype's size."""
    codes = (qkv.k_codes.numel() + qkv.v_codes.numel()) * qkv.fmt.code_bits // 8
    scales = (qkv.k_scales.numel() + qkv.v_scales.numel()) * scale_bytes
    rest = qkv.k_rest.numel() * qkv.k_rest.element_size() + qkv.v_rest.numel() * qkv.v_rest.element_size()
    return codes + scales + rest


class KVOps:
    """One KV-cache quantization implementation: ``quantize_kv(k, v, fmt)``, ``dequantize_kv(qkv)``
    and ``kv_nbytes(qkv)`` of a module (this one's by default)."""

    def __init__(self, name: str, ops=None):
        self.name = name
        self._ops = ops if ops is not None else sys.modules[__name__]

    def quantize_kv(self, k, v, fmt):
        return self._ops.quantize_kv(k, v, fmt)

    def dequantize_kv(self, qkv):
        return self._ops.dequantize_kv(qkv)

    def kv_nbytes(self, qkv):
        return self._ops.kv_nbytes(qkv)


KV_REFERENCE = KVOps("reference")
