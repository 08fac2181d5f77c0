"""Vectorized PyTorch FP8 weight quantization (QT-11; lecture 001 §5.2): :class:`PackedFP8`,
codes in torch's ``float8_e4m3fn`` / ``float8_e5m2`` (the cast clamped to ±F first:
:func:`to_fp8`), float32 scales rounded up where the cast rounds down; the ``torch_fp8_e4m3`` /
``torch_fp8_e5m2`` schemes and the ``triton_fp8_*`` schemes (:class:`TritonFP8Scheme`: this
module's quantize, the Triton kernel's matmul). The integer schemes are in
``optimized/quantization/__init__.py``.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from inference_conformance.conformance.contracts.quantization import validate_matmul, validate_quantize
from inference_conformance.conformance.contracts.quantization.fp8 import fp8_format
from inference_conformance.optimized.quantization.packing import storable
from inference_conformance.reference.quantization.fp8 import FP8Scheme, element_scales


def to_fp8(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """x cast to torch's FP8 dtype of ``fmt`` (round to nearest even), saturating: clamped to ±F
    first (torch's cast of E5M2 overflows to inf, and the E4M3fn behaviour above 448 differs
    between torch versions). Returns a float8 tensor of x's shape; NaN stays NaN."""
    f = fp8_format(fmt)
    return x.clamp(-f.max, f.max).to(getattr(torch, f.torch_dtype))


@dataclass(frozen=True)
class PackedFP8:
    """The FP8 weight: ``codes`` (N, K) uint8, the bit patterns of torch's float8 dtype of ``fmt``
    (:meth:`values` views them as that dtype), ``scales`` (N or 1,
    groups) float32 (float64 for float64 weights), rounded up where the cast rounds down (codes
    use the stored scale); ``granularity``, ``group_size``, ``N``, ``K``, ``dtype`` as
    :class:`PackedWeight`."""

    codes: torch.Tensor
    scales: torch.Tensor
    fmt: str
    granularity: object
    group_size: int
    N: int
    K: int
    dtype: torch.dtype

    def values(self) -> torch.Tensor:
        """The codes as torch's float8 dtype (a view, no copy)."""
        return self.codes.view(getattr(torch, fp8_format(self.fmt).torch_dtype))


def quantize_fp8(w: torch.Tensor, *, bits: int, granularity, fmt: str) -> PackedFP8:
    """FP8 quantization of w (N, K) at once: s = max|w_group| / F per group, codes to_fp8(w / s)
    (w / s computed in float64, rounded to float32, then cast). bits must be 8
    (NotImplementedError otherwise, after validating). Raises as validate_quantize."""
    shape = validate_quantize(w, bits, granularity)
    if shape.bits != 8:
        raise NotImplementedError(f"an FP8 scheme stores 8 bits; bits={bits} is not one of its formats")
    f = fp8_format(fmt)
    N, K = shape.N, shape.K
    w64 = w.detach().to(torch.float64)
    grp = w64.reshape(1, 1, N * K) if granularity == "tensor" else w64.reshape(N, K // shape.group_size, shape.group_size)
    sdt = torch.float64 if w.dtype == torch.float64 else torch.float32
    s = storable(grp.abs().amax(dim=-1) / f.max, sdt)
    y = torch.where(s[..., None] > 0, grp / torch.where(s > 0, s, 1.0)[..., None], 0.0)
    codes = to_fp8(y.to(torch.float32), fmt).reshape(N, K).view(torch.uint8)
    return PackedFP8(codes, s.to(sdt), f.name, granularity, shape.group_size, N, K, w.dtype)


def check_fp8(qw) -> PackedFP8:
    """TypeError unless ``qw`` is a :class:`PackedFP8`."""
    if not isinstance(qw, PackedFP8):
        raise TypeError(f"qw must be an inference_conformance.optimized.quantization.fp8.PackedFP8 (what quantize returned), got "
                        f"{type(qw).__name__}")
    return qw


def dequantize_fp8(qw: PackedFP8) -> torch.Tensor:
    """(N, K) in w's dtype: code x scale in the scales' dtype, rounded once."""
    qw = check_fp8(qw)
    s = element_scales(qw)
    return (qw.values().to(s.dtype) * s).to(qw.dtype)


def matmul_fp8(x: torch.Tensor, qw: PackedFP8) -> torch.Tensor:
    """x (M, K) @ dequantize_fp8(qw).T in x's dtype (torch.matmul; validate_matmul)."""
    qw = check_fp8(qw)
    validate_matmul(x, K=qw.K, dtype=qw.dtype, device=qw.codes.device)
    return x @ dequantize_fp8(qw).T


FP8_E4M3 = FP8Scheme("fp8_e4m3fn", sys.modules[__name__])
FP8_E5M2 = FP8Scheme("fp8_e5m2", sys.modules[__name__])


class TritonFP8Scheme:
    """The ``triton_fp8_*`` implementations: quantize and dequantize as :func:`quantize_fp8`
    (float32 scales), matmul by the Triton kernels of :func:`inference_conformance.optimized.quantization.quant_matmul.quant_matmul`
    with ``number_format`` (each byte bitcast to the FP8 format in registers). Refuses float64
    weights (NotImplementedError) after validating the call."""

    symmetric = True

    def __init__(self, fmt: str):
        self.number_format = fp8_format(fmt).name

    def quantize(self, w, *, bits, granularity):
        qw = quantize_fp8(w, bits=bits, granularity=granularity, fmt=self.number_format)
        if qw.dtype == torch.float64:
            raise NotImplementedError("the Triton quantized matmul has no float64 path (float32 scales)")
        return qw

    def dequantize(self, qw):
        return dequantize_fp8(qw)

    def matmul(self, x, qw):
        from inference_conformance.optimized.quantization.quant_matmul import quant_matmul

        qw = check_fp8(qw)
        validate_matmul(x, K=qw.K, dtype=qw.dtype, device=qw.codes.device)
        return quant_matmul(x, qw.codes, qw.scales, None, bits=8, group_size=qw.group_size, N=qw.N, K=qw.K,
                            number_format=qw.fmt)

    def __repr__(self) -> str:
        return f"inference_conformance.optimized.quantization.fp8.TritonFP8Scheme({self.number_format!r})"


TRITON_FP8_E4M3 = TritonFP8Scheme("fp8_e4m3fn")


TRITON_FP8_E5M2 = TritonFP8Scheme("fp8_e5m2")
