"""Reference FP8 weight quantization (QT-11; lecture 001 §5.2): w_hat = fp8(w / s) s with
s = max|w_group| / F per group, the cast computed in float64 (:func:`fp8_cast`: round to nearest
even on the format's grid, saturating at ±F). The FP8 oracle of the ``quantization`` contract
(``conformance/contracts/quantization/contract.py``); the integer schemes are in
``reference/quantization/__init__.py``.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from inference_conformance.conformance.contracts.quantization import validate_matmul, validate_quantize
from inference_conformance.conformance.contracts.quantization.fp8 import fp8_format, fp8_round


def fp8_cast(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """x rounded to the FP8 format's grid, computed in float64 (the contract's
    :func:`~inference_conformance.conformance.contracts.quantization.fp8.fp8_round`: round to
    nearest, ties to even), then saturated at ±F (F = 448 for E4M3fn, 57344 for E5M2; inf
    saturates too, NaN stays NaN). Returns float64 of x's shape (the value, not the 8-bit code).
    Raises ValueError for an unknown format (``number_format``)."""
    f = fp8_format(fmt)
    return torch.clamp(fp8_round(x, fmt), -f.max, f.max)


@dataclass(frozen=True)
class FP8Weight:
    """The reference's FP8 weight: ``values`` (N, K) float64, each on the format's grid (the
    FP8 number, code x 1), ``scales`` (N or 1, groups) float64, ``fmt`` the format's name,
    ``granularity`` as given, ``group_size`` (K for "channel" and "tensor"), ``N``, ``K``,
    ``dtype`` (w's)."""

    values: torch.Tensor
    scales: torch.Tensor
    fmt: str
    granularity: object
    group_size: int
    N: int
    K: int
    dtype: torch.dtype


def quantize_fp8(w: torch.Tensor, *, bits: int, granularity, fmt: str) -> FP8Weight:
    """FP8 quantization of w (N, K): s = max|w_group| / F per group (one for "tensor", one per
    row for "channel", per g columns for an int g), values fp8_cast(w / s) (QT-11). bits must
    be 8 (NotImplementedError otherwise, after validating the call). Raises TypeError/ValueError
    as the contract's validate_quantize."""
    shape = validate_quantize(w, bits, granularity)
    if shape.bits != 8:
        raise NotImplementedError(f"an FP8 scheme stores 8 bits; bits={bits} is not one of its formats")
    f = fp8_format(fmt)
    w64 = w.detach().to("cpu", torch.float64)
    N, K, g = shape.N, shape.K, shape.group_size
    values = torch.zeros(N, K, dtype=torch.float64)
    if granularity == "tensor":
        s = float(w64.abs().max()) / f.max
        scales = torch.tensor([[s]], dtype=torch.float64)
        values = fp8_cast(w64 / s, fmt) if s > 0 else values
    else:
        scales = torch.zeros(N, K // g, dtype=torch.float64)
        for n in range(N):
            for j in range(K // g):
                v = w64[n, j * g:(j + 1) * g]
                s = float(v.abs().max()) / f.max
                scales[n, j] = s
                if s > 0:
                    values[n, j * g:(j + 1) * g] = fp8_cast(v / s, fmt)
    return FP8Weight(values.to(w.device), scales.to(w.device), fmt, granularity, g, N, K, w.dtype)


def _check_fp8(qw) -> FP8Weight:
    if not isinstance(qw, FP8Weight):
        raise TypeError(f"qw must be a inference_conformance.reference.quantization.fp8.FP8Weight (what quantize returned), got "
                        f"{type(qw).__name__}")
    return qw


def element_scales(qw) -> torch.Tensor:
    """Every element's scale (N, K) of an FP8 weight (this module's or the optimized one's): its
    ``scales`` per group of ``group_size`` columns, or the one scale of "tensor"."""
    if qw.granularity == "tensor":
        return qw.scales.expand(qw.N, qw.K)
    return qw.scales.repeat_interleave(qw.group_size, dim=1)


def dequantize_fp8(qw: FP8Weight) -> torch.Tensor:
    """(N, K) in w's dtype: value x scale in float64, rounded once."""
    qw = _check_fp8(qw)
    return (qw.values * element_scales(qw)).to(qw.dtype)


def matmul_fp8(x: torch.Tensor, qw: FP8Weight) -> torch.Tensor:
    """x (M, K) @ dequantize_fp8(qw).T in float64, rounded once to x's dtype (validate_matmul)."""
    qw = _check_fp8(qw)
    validate_matmul(x, K=qw.K, dtype=qw.dtype, device=qw.values.device)
    return (x.to(torch.float64) @ dequantize_fp8(qw).to(torch.float64).T).to(x.dtype)


class FormatScheme:
    """A scheme of the contract over a module's ``quantize_<kind>``, ``dequantize_<kind>`` and
    ``matmul_<kind>`` (the defining module's by default): the FP8 and FP4 schemes of the reference
    and of the vectorized built-ins. ``kind`` and ``format_of`` (name -> format, raising
    ValueError for an unknown one) are set by each subclass."""

    symmetric = True
    kind = ""

    @staticmethod
    def format_of(fmt: str):
        raise NotImplementedError

    def __init__(self, fmt: str, ops=None):
        self.number_format = self.format_of(fmt).name
        self._ops = ops if ops is not None else sys.modules[type(self).__module__]

    def quantize(self, w, *, bits, granularity):
        return getattr(self._ops, f"quantize_{self.kind}")(w, bits=bits, granularity=granularity, fmt=self.number_format)

    def dequantize(self, qw):
        return getattr(self._ops, f"dequantize_{self.kind}")(qw)

    def matmul(self, x, qw):
        return getattr(self._ops, f"matmul_{self.kind}")(x, qw)

    def __repr__(self) -> str:
        return f"{self._ops.__name__}.{type(self).__name__}({self.number_format!r})"


class FP8Scheme(FormatScheme):
    """An FP8 scheme of the contract (``number_format`` E4M3fn or E5M2) over a module's
    ``quantize_fp8``, ``dequantize_fp8`` and ``matmul_fp8`` (this module's by default)."""

    kind = "fp8"
    format_of = staticmethod(fp8_format)


FP8_E4M3 = FP8Scheme("fp8_e4m3fn")


FP8_E5M2 = FP8Scheme("fp8_e5m2")
