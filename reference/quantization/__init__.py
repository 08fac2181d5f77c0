"""Reference weight quantization: symmetric absmax and asymmetric zero point, 2..8 bits, per
tensor, per channel or per group along K; the packed storage and its probes. Naive and readable:
one group at a time, float64 throughout. The oracle of the ``quantization`` contract
(``conformance/contracts/quantization/contract.py``; claims QT-1, QT-2, QT-9; lecture 001 §5.1–5.2).

Storage (:class:`QuantizedWeight`), one convention for both schemes:

    w_hat = (u - z) * s

with ``u`` the stored unsigned code in 0..2^b - 1, ``z`` the stored zero point and ``s`` the
group's scale.

- Symmetric (absmax): s = max|w_group| / (2^(b-1) - 1), q = round(w / s) in
  [-(2^(b-1) - 1), 2^(b-1) - 1], stored as u = q + z with z = 2^(b-1) (so code 0 is unused:
  the range is symmetric). A 4-bit group's zero point is 8 and code 8 is exactly 0.
- Asymmetric (zero point): s = (max(max w, 0) - min(min w, 0)) / (2^b - 1), z = round(-min(min w,
  0) / s) in 0..2^b - 1, u = clamp(round(w / s) + z, 0, 2^b - 1): zero is exactly
  representable (code z).
- The zero point convention: the stored value IS z (not z - 1, as some checkpoint formats store
  it, e.g. GPTQ's original int32 zeros); :func:`probe_zero_point` checks it.
- The scale is rounded up to 16 significant bits (:func:`round_scale`), so that every code x
  scale (at most 8 + 16 bits) is exact in float32 and quantize(dequantize(.)) is idempotent
  (QT-2); rounding up keeps every |w / s| within the code range, and costs at most 2^-16 of
  the step.
- An all-zero group has s = 0: every code is z and it dequantizes to zeros.
- Act-order (GPTQ's ``g_idx``, optional): with an int group size, ``g_idx`` (K,) names the group of
  every column (each group holds exactly g columns, in any positions); the codes stay in column
  order and column k uses the scale and zero point of group ``g_idx[k]``. Without it, column k
  is in group k // g. GPTQ with ``act_order=True``
  (``reference/quantization/methods.py``) forms the groups in decreasing order of the Hessian's
  diagonal.

Packing (:func:`pack` / :func:`unpack`), along K, for codes and for zero points alike: with 4
bits two codes per byte, with 2 bits four; element j of a row goes to byte j // (8 // b) at bit
offset (j % (8 // b)) * b: the FIRST element sits in the LOW bits ("low nibble first": codes
0, 1 pack to 0x10). Rows are padded with zero codes to whole bytes. Other bit widths store one
code per byte. :func:`probe_packing` checks the order with a known pattern (pack 0..7, compare
the bytes, unpack, compare).

FP8 (QT-11) is in ``reference/quantization/fp8.py``, the KV-cache formats (QT-12) in
``reference/quantization/kv.py``.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import torch

from inference_conformance.conformance.contracts.quantization import (
    levels,
    validate_g_idx,
    validate_matmul,
    validate_quantize,
)

#: Significant bits kept in a stored scale (see the module docstring).
SCALE_BITS = 16


def codes_per_byte(bits: int) -> int:
    """Codes stored in one byte: 2 for 4 bits, 4 for 2 bits, else 1."""
    return 8 // bits if bits in (2, 4) else 1


def pack(u: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack codes (R, L) (integers in 0..2^bits - 1) along the last dimension into (R,
    ceil(L / per)) uint8, per = :func:`codes_per_byte`; element j -> byte j // per, bits
    [(j % per) * bits, (j % per + 1) * bits) (first element in the low bits). Raises ValueError
    for a code out of range."""
    u = u.to(torch.int64)
    if u.numel() and (int(u.min()) < 0 or int(u.max()) >= 2 ** bits):
        raise ValueError(f"codes must lie in 0..{2 ** bits - 1} for {bits} bits, got {int(u.min())}..{int(u.max())}")
    per = codes_per_byte(bits)
    R, L = u.shape
    padded = torch.zeros(R, -(-L // per) * per, dtype=torch.int64, device=u.device)
    padded[:, :L] = u
    packed = torch.zeros(R, padded.shape[1] // per, dtype=torch.int64, device=u.device)
    for j in range(per):                                 # element j of each byte's run
        packed |= padded[:, j::per] << (j * bits)
    return packed.to(torch.uint8)


def unpack(packed: torch.Tensor, bits: int, L: int) -> torch.Tensor:
    """Inverse of :func:`pack`: (R, ceil(L / per)) uint8 -> (R, L) int64 codes."""
    per = codes_per_byte(bits)
    p = packed.to(torch.int64)
    R = p.shape[0]
    u = torch.zeros(R, p.shape[1] * per, dtype=torch.int64, device=p.device)
    for j in range(per):
        u[:, j::per] = (p >> (j * bits)) & (2 ** bits - 1)
    return u[:, :L]


def round_scale(s: float) -> float:
    """s rounded UP to :data:`SCALE_BITS` significant bits (0 stays 0)."""
    if s == 0:
        return 0.0
    m, e = math.frexp(s)                                  # s = m * 2^e, m in [0.5, 1)
    return math.ldexp(math.ceil(m * 2 ** SCALE_BITS) / 2 ** SCALE_BITS, e)


@dataclass(frozen=True)
class QuantizedWeight:
    """The reference's packed weight.

    ``codes`` (N, ceil(K / per)) uint8, packed along K; ``scales`` (N, groups per row) float64
    (or (1, 1) for granularity "tensor"); ``zeros`` the zero points, the same rows, packed along
    the groups like the codes; ``bits``, ``group_size`` (K for "channel" and "tensor"),
    ``granularity`` as given, ``N``, ``K``, ``dtype`` (w's), ``symmetric``; ``g_idx`` (K,) int64
    the group of every column (act-order), or None for k // group_size.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    bits: int
    group_size: int
    granularity: object
    N: int
    K: int
    dtype: torch.dtype
    symmetric: bool
    g_idx: torch.Tensor | None = None

    @property
    def groups(self) -> int:
        """Scale columns: 1 for "tensor", else K // group_size."""
        return self.scales.shape[1]


def quantize_group(v: torch.Tensor, bits: int, symmetric: bool) -> tuple[torch.Tensor, float, int]:
    """Quantize one group (a float64 vector): returns (codes u (int64), scale s, zero point z)."""
    if symmetric:
        z = 2 ** (bits - 1)
        s = round_scale(float(v.abs().max()) / levels(bits, True))
        lo, hi = z - levels(bits, True), z + levels(bits, True)
    else:
        lo_w, hi_w = min(float(v.min()), 0.0), max(float(v.max()), 0.0)
        s = round_scale((hi_w - lo_w) / levels(bits, False))
        z = min(max(round(-lo_w / s), 0), 2 ** bits - 1) if s > 0 else 0
        lo, hi = 0, 2 ** bits - 1
    if s == 0:                                            # an all-zero group
        return torch.full(v.shape, z, dtype=torch.int64), 0.0, z
    u = (torch.round(v / s) + z).clamp(lo, hi).to(torch.int64)
    return u, s, z


def group_columns(K: int, group_size: int, g_idx: torch.Tensor | None) -> list[torch.Tensor]:
    """The columns of each group, in column order: k // group_size, or ``g_idx``'s groups."""
    if g_idx is None:
        return [torch.arange(j * group_size, (j + 1) * group_size) for j in range(K // group_size)]
    g_idx = g_idx.cpu()
    return [torch.nonzero(g_idx == j).flatten() for j in range(K // group_size)]


def quantize(w: torch.Tensor, *, bits: int, granularity, symmetric: bool = True,
             g_idx: torch.Tensor | None = None) -> QuantizedWeight:
    """Quantize a Linear weight w (N, K) (see the module docstring); ``g_idx`` (K,) the group of
    every column (act-order; an int granularity only). Raises TypeError/ValueError as the
    contract's ``validate_quantize`` and ``validate_g_idx``."""
    shape = validate_quantize(w, bits, granularity)
    w64 = w.detach().to("cpu", torch.float64)
    N, K, g = shape.N, shape.K, shape.group_size
    if g_idx is not None:
        g_idx = validate_g_idx(g_idx, K, granularity).to(w.device)
    u = torch.zeros(N, K, dtype=torch.int64)
    if granularity == "tensor":
        codes, s, z = quantize_group(w64.reshape(-1), shape.bits, symmetric)
        u = codes.reshape(N, K)
        scales = torch.tensor([[s]], dtype=torch.float64)
        zeros = torch.tensor([[z]], dtype=torch.int64)
    else:
        scales = torch.zeros(N, K // g, dtype=torch.float64)
        zeros = torch.zeros(N, K // g, dtype=torch.int64)
        for j, cols in enumerate(group_columns(K, g, g_idx)):
            for n in range(N):
                codes, s, z = quantize_group(w64[n, cols], shape.bits, symmetric)
                u[n, cols] = codes
                scales[n, j], zeros[n, j] = s, z
    return QuantizedWeight(pack(u, shape.bits).to(w.device), scales.to(w.device), pack(zeros, shape.bits).to(w.device),
                           shape.bits, g, granularity, N, K, w.dtype, symmetric, g_idx)


def _check_qw(qw) -> QuantizedWeight:
    if not isinstance(qw, QuantizedWeight):
        raise TypeError(f"qw must be a inference_conformance.reference.quantization.QuantizedWeight (what quantize returned), "
                        f"got {type(qw).__name__}")
    return qw


def dequantize64(qw: QuantizedWeight) -> torch.Tensor:
    """(u - z) * s of every element, (N, K) float64."""
    qw = _check_qw(qw)
    u = unpack(qw.codes, qw.bits, qw.K).to(torch.float64)                        # (N, K)
    z = unpack(qw.zeros, qw.bits, qw.groups).to(torch.float64)                   # (N or 1, groups)
    if qw.granularity == "tensor":
        return (u - z[0, 0]) * qw.scales[0, 0]
    if qw.g_idx is not None:                       # act-order: column k reads group g_idx[k]
        idx = qw.g_idx.to(z.device)
        return (u - z[:, idx]) * qw.scales.to(z.device)[:, idx]
    per_element = qw.group_size
    return (u - z.repeat_interleave(per_element, dim=1)) * qw.scales.repeat_interleave(per_element, dim=1)


def dequantize(qw: QuantizedWeight) -> torch.Tensor:
    """(N, K) in w's dtype: (u - z) * s computed in float64, rounded once to the dtype."""
    return dequantize64(qw).to(qw.dtype)


def matmul(x: torch.Tensor, qw: QuantizedWeight) -> torch.Tensor:
    """x (M, K) @ dequantize(qw).T -> (M, N) in x's dtype, computed in float64 and rounded once.
    The weight is dequantize(qw), i.e. rounded to w's dtype first: in 16-bit dtypes the float64
    (u - z) * s differs from it by that rounding, which a product with heavy cancellation shows.
    Raises TypeError/ValueError for an x of the wrong K, dtype or device (``validate_matmul``)."""
    qw = _check_qw(qw)
    validate_matmul(x, K=qw.K, dtype=qw.dtype, device=qw.codes.device)
    d = dequantize(qw).to(torch.float64)
    return (x.to(torch.float64) @ d.to(x.device).T).to(x.dtype)


class Scheme:
    """One scheme of the contract (``symmetric`` True: absmax; False: zero point) over a module's
    ``quantize(w, *, bits, granularity, symmetric, g_idx)``, ``dequantize(qw)`` and
    ``matmul(x, qw)`` (this module's by default; ``inference_conformance.optimized.quantization`` uses it for its own)."""

    def __init__(self, symmetric: bool, ops=None):
        self.symmetric = symmetric
        self._ops = ops if ops is not None else sys.modules[__name__]

    def quantize(self, w, *, bits, granularity, g_idx=None):
        return self._ops.quantize(w, bits=bits, granularity=granularity, symmetric=self.symmetric, g_idx=g_idx)

    def dequantize(self, qw):
        return self._ops.dequantize(qw)

    def matmul(self, x, qw):
        return self._ops.matmul(x, qw)

    def __repr__(self) -> str:
        return f"{self._ops.__name__}.Scheme(symmetric={self.symmetric})"


SYMMETRIC = Scheme(True)
ASYMMETRIC = Scheme(False)


# ------------------------------------------------------------------------------------ probes
#: The documented bytes of the known patterns (low bits first).
PACKED_0_TO_7_4BIT = (0x10, 0x32, 0x54, 0x76)
PACKED_0123_2BIT = (0xE4, 0xE4)                          # 0 | 1 << 2 | 2 << 4 | 3 << 6, twice


def probe_packing() -> dict:
    """Pack the known patterns (4 bits: 0..7; 2 bits: 0, 1, 2, 3, 0, 1, 2, 3), compare the bytes
    with the documented order and unpack again. Returns {"4": (bytes, round trip ok), "2": ...}."""
    out = {}
    for bits, pattern, expected in ((4, list(range(8)), PACKED_0_TO_7_4BIT),
                                    (2, [0, 1, 2, 3] * 2, PACKED_0123_2BIT)):
        u = torch.tensor([pattern])
        p = pack(u, bits)
        out[str(bits)] = (tuple(int(b) for b in p[0]), bool(torch.equal(unpack(p, bits, len(pattern)), u)),
                          tuple(int(b) for b in p[0]) == expected)
    return out


def probe_zero_point() -> float:
    """The zero-point convention: a symmetric 4-bit group whose stored zero is 8 and code 8
    dequantizes to exactly 0 (the stored value is z itself). Returns that value."""
    qw = QuantizedWeight(codes=pack(torch.tensor([[8, 8]]), 4), scales=torch.tensor([[0.37]], dtype=torch.float64),
                         zeros=pack(torch.tensor([[8]]), 4), bits=4, group_size=2, granularity=2, N=1, K=2,
                         dtype=torch.float64, symmetric=True)
    return float(dequantize(qw)[0, 0])


def implementations():
    """The quantization references: symmetric absmax and asymmetric (zero point) schemes, and
    the FP8 schemes E4M3fn and E5M2 (QT-11) and the FP4 block schemes MXFP4 and NVFP4 (QT-13)."""
    from inference_conformance.conformance.registry import builtin
    from inference_conformance.reference.quantization.fp4 import MXFP4, NVFP4
    from inference_conformance.reference.quantization.fp8 import FP8_E4M3, FP8_E5M2

    return (builtin("quantization", "reference", SYMMETRIC), builtin("quantization", "reference_asym", ASYMMETRIC),
            builtin("quantization", "reference_fp8_e4m3", FP8_E4M3), builtin("quantization", "reference_fp8_e5m2", FP8_E5M2),
            builtin("quantization", "reference_mxfp4", MXFP4), builtin("quantization", "reference_nvfp4", NVFP4))
