"""Vectorized PyTorch weight quantization (the ``torch`` and ``torch_asym`` implementations of the
``quantization`` contract), the packed layout the Triton kernel reads
(``optimized/quant_matmul.py``), and the ``triton`` / ``triton_asym`` schemes (this module's
quantize, the kernel's matmul: :class:`TritonScheme`). Same arithmetic as the reference (``reference/quantization.py``:
w_hat = (u - z) * s, scale rounded up to 16 significant bits, codes packed along K low bits
first), computed on whole tensors at once; claims QT-1, QT-2, QT-9 (lecture 001 §5.1–5.2).

Layout of :class:`PackedWeight`: ``codes`` (N, ceil(K / per)) uint8, per = 2 for 4 bits, 4 for
2 bits, else 1, element k of a row in byte k // per at bit offset (k % per) * bits;
``scales`` (N, groups) float32 (float64 for float64 weights), (1, 1) for "tensor" (a step
below float32's normal range is stored rounded up, and the codes use the stored scale);
``zeros`` (N, groups) uint8, unpacked (one zero point per group, the stored value is z);
``g_idx`` (K,) int32, the group of every column under GPTQ's act-order (None: k // group_size).

FP8 (QT-11): :class:`PackedFP8`, codes in torch's ``float8_e4m3fn`` / ``float8_e5m2`` (the cast
clamped to ±F first: :func:`to_fp8`), float32 scales; the ``torch_fp8_e4m3`` / ``torch_fp8_e5m2``
schemes. KV-cache formats (QT-12): :class:`PackedKV` (int8 / FP8 per token, int4 KIVI packed two
per byte) and :class:`QuantizedKVCache`, the model's attention backend over them.
"""
from __future__ import annotations

from dataclasses import dataclass

import sys

import torch

from inference_conformance.conformance.contracts.quantization import (
    FP8_FORMATS,
    KVFormat,
    fp8_format,
    kv_quantized_tokens,
    levels,
    validate_g_idx,
    validate_matmul,
    validate_quantize,
)
from inference_conformance.reference.quantization import FP8Scheme, KVOps, Scheme

#: Significant bits kept in a stored scale (as the reference).
SCALE_BITS = 16


def codes_per_byte(bits: int) -> int:
    """2 for 4 bits, 4 for 2 bits, else 1."""
    return 8 // bits if bits in (2, 4) else 1


@dataclass(frozen=True)
class PackedWeight:
    """The packed weight (see the module docstring); ``dtype`` is w's, ``group_size`` K for
    "channel" and "tensor"."""

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


def quantize(w: torch.Tensor, *, bits: int, granularity, symmetric: bool = True,
             g_idx: torch.Tensor | None = None) -> PackedWeight:
    """Quantize w (N, K) at once: groups reshaped to (rows, groups, group size), scales and
    zero points per group; with ``g_idx`` (act-order, an int granularity) the columns are first
    sorted by group, quantized, and the codes put back in column order. Raises
    TypeError/ValueError as the contract's validate_quantize and validate_g_idx."""
    shape = validate_quantize(w, bits, granularity)
    if g_idx is not None:
        idx = validate_g_idx(g_idx, shape.K, granularity).to(w.device)
        order = torch.argsort(idx, stable=True)
        qw = quantize(w[:, order], bits=bits, granularity=granularity, symmetric=symmetric)
        u = torch.empty(shape.N, shape.K, dtype=torch.int32, device=w.device)
        u[:, order] = unpack(qw.codes, qw.bits, qw.K)
        return PackedWeight(pack(u, qw.bits), qw.scales, qw.zeros, qw.bits, qw.group_size, granularity,
                            qw.N, qw.K, qw.dtype, symmetric, idx.to(torch.int32))
    N, K, b = shape.N, shape.K, shape.bits
    w64 = w.detach().to(torch.float64)
    grp = w64.reshape(1, 1, N * K) if granularity == "tensor" else w64.reshape(N, K // shape.group_size, shape.group_size)
    sdt = torch.float64 if w.dtype == torch.float64 else torch.float32
    if symmetric:
        s = storable(round_scale(grp.abs().amax(dim=-1) / levels(b, True)), sdt)
        z = torch.full_like(s, 2 ** (b - 1))
        lo, hi = 1, 2 ** b - 1
    else:
        lo_w, hi_w = grp.amin(dim=-1).clamp(max=0), grp.amax(dim=-1).clamp(min=0)
        s = storable(round_scale((hi_w - lo_w) / levels(b, False)), sdt)
        z = torch.where(s > 0, torch.round(-lo_w / torch.where(s > 0, s, 1.0)), 0.0).clamp(0, 2 ** b - 1)
        lo, hi = 0, 2 ** b - 1
    safe = torch.where(s > 0, s, 1.0)[..., None]
    u = torch.where(s[..., None] > 0, (torch.round(grp / safe) + z[..., None]).clamp(lo, hi), z[..., None])
    u = u.reshape(N, K).to(torch.int32)
    return PackedWeight(pack(u, b), s.to(sdt), z.to(torch.uint8), b, shape.group_size, granularity, N, K,
                        w.dtype, symmetric)


def check_packed(qw) -> PackedWeight:
    """TypeError unless ``qw`` is a :class:`PackedWeight`."""
    if not isinstance(qw, PackedWeight):
        raise TypeError(f"qw must be an inference_conformance.optimized.quantization.PackedWeight (what quantize returned), "
                        f"got {type(qw).__name__}")
    return qw


def dequantize(qw: PackedWeight) -> torch.Tensor:
    """(N, K) in w's dtype: (u - z) * s in the scales' dtype (exact: 8 + 16 bits), rounded once."""
    qw = check_packed(qw)
    u = unpack(qw.codes, qw.bits, qw.K)
    if qw.granularity == "tensor":
        z, s = qw.zeros.expand(qw.N, qw.K), qw.scales.expand(qw.N, qw.K)
    elif qw.g_idx is not None:                    # act-order: column k reads group g_idx[k]
        idx = qw.g_idx.to(torch.int64)
        z, s = qw.zeros[:, idx], qw.scales[:, idx]
    else:
        z = qw.zeros.repeat_interleave(qw.group_size, dim=1)
        s = qw.scales.repeat_interleave(qw.group_size, dim=1)
    return ((u - z.to(torch.int32)).to(s.dtype) * s).to(qw.dtype)


def matmul(x: torch.Tensor, qw: PackedWeight) -> torch.Tensor:
    """x (M, K) @ dequantize(qw).T in x's dtype (torch.matmul). Raises TypeError/ValueError for
    an x of the wrong K, dtype or device."""
    qw = check_packed(qw)
    validate_matmul(x, K=qw.K, dtype=qw.dtype, device=qw.codes.device)
    return x @ dequantize(qw).T


SYMMETRIC = Scheme(True, sys.modules[__name__])
ASYMMETRIC = Scheme(False, sys.modules[__name__])


class TritonScheme:
    """The ``triton`` implementation: quantize and dequantize as this module (float32 scales;
    with GPTQ's act-order ``g_idx`` (K,), an int group size, stored in the packed weight as
    int32), matmul by the Triton kernels of :func:`inference_conformance.optimized.quant_matmul.quant_matmul` (with the
    stored g_idx). Refuses float64 weights (NotImplementedError) after validating the call."""

    def __init__(self, symmetric: bool):
        self.symmetric = symmetric

    def quantize(self, w, *, bits, granularity, g_idx=None):
        qw = quantize(w, bits=bits, granularity=granularity, symmetric=self.symmetric, g_idx=g_idx)
        if qw.dtype == torch.float64:
            raise NotImplementedError("the Triton quantized matmul has no float64 path (float32 scales)")
        return qw

    def dequantize(self, qw):
        return dequantize(qw)

    def matmul(self, x, qw):
        from inference_conformance.optimized.quant_matmul import quant_matmul

        qw = check_packed(qw)
        validate_matmul(x, K=qw.K, dtype=qw.dtype, device=qw.codes.device)
        return quant_matmul(x, qw.codes, qw.scales, qw.zeros, bits=qw.bits, group_size=qw.group_size,
                            N=qw.N, K=qw.K, g_idx=qw.g_idx)

    def __repr__(self) -> str:
        return f"inference_conformance.optimized.quantization.TritonScheme(symmetric={self.symmetric})"


TRITON_SYMMETRIC = TritonScheme(True)
TRITON_ASYMMETRIC = TritonScheme(False)


# ------------------------------------------------------------------------------ FP8 (QT-11)
def to_fp8(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """x cast to torch's FP8 dtype of ``fmt`` (round to nearest even), saturating: clamped to ±F
    first (torch's cast of E5M2 overflows to inf, and the E4M3fn behaviour above 448 differs
    between torch versions). Returns a float8 tensor of x's shape; NaN stays NaN."""
    f = fp8_format(fmt)
    return x.clamp(-f.max, f.max).to(getattr(torch, f.torch_dtype))


def fp8_cast(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """x rounded to the FP8 grid (:func:`to_fp8`), returned in x's dtype (exact: every FP8 value
    is a float16 / bfloat16 / float32 value). float64 inputs go through float32 first."""
    src = x.to(torch.float32) if x.dtype == torch.float64 else x
    return to_fp8(src, fmt).to(x.dtype)


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
        raise TypeError(f"qw must be an inference_conformance.optimized.quantization.PackedFP8 (what quantize returned), got {type(qw).__name__}")
    return qw


def dequantize_fp8(qw: PackedFP8) -> torch.Tensor:
    """(N, K) in w's dtype: code x scale in the scales' dtype, rounded once."""
    qw = check_fp8(qw)
    s = qw.scales.expand(qw.N, qw.K) if qw.granularity == "tensor" else qw.scales.repeat_interleave(qw.group_size, dim=1)
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
    (float32 scales), matmul by the Triton kernels of :func:`inference_conformance.optimized.quant_matmul.quant_matmul`
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
        from inference_conformance.optimized.quant_matmul import quant_matmul

        qw = check_fp8(qw)
        validate_matmul(x, K=qw.K, dtype=qw.dtype, device=qw.codes.device)
        return quant_matmul(x, qw.codes, qw.scales, None, bits=8, group_size=qw.group_size, N=qw.N, K=qw.K,
                            number_format=qw.fmt)

    def __repr__(self) -> str:
        return f"inference_conformance.optimized.quantization.TritonFP8Scheme({self.number_format!r})"


TRITON_FP8_E4M3 = TritonFP8Scheme("fp8_e4m3fn")
TRITON_FP8_E5M2 = TritonFP8Scheme("fp8_e5m2")


# ------------------------------------------------------------------- KV-cache formats (QT-12)
@dataclass(frozen=True)
class PackedKV:
    """Keys and values (B, H, T, D) in a :class:`KVFormat`, as held: the first Tq tokens'
    ``k_codes`` / ``v_codes`` (int8 for int8; FP8 dtypes for FP8; int4 KIVI codes u = q + 8 packed
    two per byte along D, low nibble first, (B, H, Tq, ceil(D / 2)) uint8), ``k_scales`` /
    ``v_scales`` float32 ((B, H, Tq, 1); KIVI keys (B, H, Tq / G, D)), ``k_rest`` / ``v_rest``
    the other tokens in the cache's dtype, ``fmt``, ``dtype``, ``D``."""

    k_codes: torch.Tensor
    v_codes: torch.Tensor
    k_scales: torch.Tensor
    v_scales: torch.Tensor
    k_rest: torch.Tensor
    v_rest: torch.Tensor
    fmt: KVFormat
    dtype: torch.dtype
    D: int

    @property
    def tokens(self) -> int:
        return self.k_codes.shape[2] + self.k_rest.shape[2]


def _kv_codes(x64: torch.Tensor, amax: torch.Tensor, fmt: KVFormat):
    """(codes, float32 scales) of x64 with per-slice maxima ``amax`` (broadcastable)."""
    if fmt.kind in FP8_FORMATS:
        s = storable(amax / FP8_FORMATS[fmt.kind].max, torch.float32)
        y = torch.where(s > 0, x64 / torch.where(s > 0, s, 1.0), 0.0)
        return to_fp8(y.to(torch.float32), fmt.kind), s.to(torch.float32)
    qmax = levels(fmt.code_bits, True)
    s = storable(amax / qmax, torch.float32)
    q = torch.where(s > 0, torch.round(x64 / torch.where(s > 0, s, 1.0)), 0.0).clamp(-qmax, qmax)
    return q.to(torch.int8), s.to(torch.float32)


def _pack4(q: torch.Tensor) -> torch.Tensor:
    """int4 codes q (B, H, T, D) in -7..7 -> u = q + 8 packed two per byte along D, (B, H, T, ceil(D / 2))."""
    B, H, T, D = q.shape
    if q.numel() == 0:                                     # no token quantized yet
        return torch.empty(B, H, T, -(-D // 2), dtype=torch.uint8, device=q.device)
    return pack((q.to(torch.int32) + 8).reshape(-1, D), 4).reshape(B, H, T, -1)


def _unpack4(c: torch.Tensor, D: int) -> torch.Tensor:
    """Inverse of :func:`_pack4`: (B, H, T, ceil(D / 2)) uint8 -> (B, H, T, D) int32 in -7..7."""
    B, H, T, _ = c.shape
    if c.numel() == 0:
        return torch.empty(B, H, T, D, dtype=torch.int32, device=c.device)
    return (unpack(c.reshape(B * H * T, -1), 4, D) - 8).reshape(B, H, T, D)


def quantize_kv(k: torch.Tensor, v: torch.Tensor, fmt: KVFormat) -> PackedKV:
    """Quantize keys and values (B, H, T, D) into ``fmt`` at once (QT-12; steps as the
    contract's ``kv_step``, scales stored float32 rounded up). Raises ValueError for k, v of
    other shapes."""
    if k.dim() != 4 or tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"k and v must both be (B, H, T, D), got {tuple(k.shape)} and {tuple(v.shape)}")
    B, H, T, D = k.shape
    Tq = kv_quantized_tokens(T, fmt)
    k64, v64 = k.detach().to(torch.float64)[:, :, :Tq], v.detach().to(torch.float64)[:, :, :Tq]
    vc, vs = _kv_codes(v64, v64.abs().amax(-1, keepdim=True), fmt)
    if fmt.kind == "int4_kivi":
        grouped = k64.reshape(B, H, Tq // fmt.group, fmt.group, D)
        kc, ks = _kv_codes(grouped, grouped.abs().amax(dim=3, keepdim=True), fmt)
        kc, ks = _pack4(kc.reshape(B, H, Tq, D)), ks[:, :, :, 0]
        vc = _pack4(vc)
    else:
        kc, ks = _kv_codes(k64, k64.abs().amax(-1, keepdim=True), fmt)
    return PackedKV(kc, vc, ks, vs, k[:, :, Tq:].clone(), v[:, :, Tq:].clone(), fmt, k.dtype, D)


def dequantize_kv(p: PackedKV) -> tuple[torch.Tensor, torch.Tensor]:
    """(k_hat, v_hat) (B, H, T, D) in the cache's dtype: code x scale in float32 (float64 for a
    float64 cache), rounded once, then the full-precision tokens."""
    wdt = torch.float64 if p.dtype == torch.float64 else torch.float32
    if p.fmt.kind == "int4_kivi":
        kc, vc = _unpack4(p.k_codes, p.D), _unpack4(p.v_codes, p.D)
        ks = p.k_scales.repeat_interleave(p.fmt.group, dim=2)
    else:
        kc, vc, ks = p.k_codes, p.v_codes, p.k_scales
    k_hat = (kc.to(wdt) * ks.to(wdt)).to(p.dtype)
    v_hat = (vc.to(wdt) * p.v_scales.to(wdt)).to(p.dtype)
    return torch.cat([k_hat, p.k_rest], dim=2), torch.cat([v_hat, p.v_rest], dim=2)


def kv_nbytes(p: PackedKV) -> int:
    """Bytes held, measured from the tensors (numel x element size of codes, scales and the
    full-precision tokens)."""
    return sum(t.numel() * t.element_size() for t in (p.k_codes, p.v_codes, p.k_scales, p.v_scales, p.k_rest, p.v_rest))


KV_TORCH = KVOps("torch", sys.modules[__name__])


class QuantizedKVCache:
    """An attention backend (:class:`inference_conformance.reference.transformer.AttentionCache`) holding every
    layer's keys and values in a quantized :class:`KVFormat`, for B rows of equal length (a
    right-padded batch: padding sits after every real token, so no real query sees it).

    ``attend(layer, q, k, v)`` appends the T new tokens, quantizes the groups they complete
    (tokens ``[Tq_before, Tq_after)``, Tq = kv_quantized_tokens(length)) and attends: query i of
    the T new ones, at position p = length_before + i, sees tokens 0..p as a decode engine holds
    them when p is its newest token: token t dequantized when t < kv_quantized_tokens(p + 1),
    else in full precision. A prefill of T tokens therefore gives the logits of T decode steps,
    so the quantization's effect shows in one forward. ``ops``: a :class:`KVOps` (default
    :data:`KV_TORCH`). ``nbytes()``: the bytes held over all layers (codes, scales, full-precision
    tokens); ``tokens``: the length. The paged kernel's quantized reads take the same
    :class:`PackedKV` layout per block."""

    def __init__(self, fmt: KVFormat, ops: KVOps | None = None):
        self.fmt, self.ops = fmt, ops if ops is not None else KV_TORCH
        self._segments: dict[int, list] = {}
        self._pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._quantized: dict[int, int] = {}

    @property
    def tokens(self) -> int:
        return self._quantized.get(0, 0) + (self._pending[0][0].shape[2] if 0 in self._pending else 0)

    def nbytes(self) -> int:
        """Bytes held over all layers (measured from the tensors)."""
        total = sum(self.ops.kv_nbytes(seg) for segs in self._segments.values() for seg in segs)
        return total + sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self._pending.values())

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (B, Hq, T, D), k, v (B, Hkv, T, D) after RoPE -> (B, Hq, T, D) in q's dtype."""
        fmt = self.fmt
        segs = self._segments.setdefault(layer, [])
        tq0 = self._quantized.get(layer, 0)
        if layer in self._pending:
            kp, vp = (torch.cat([a, b], dim=2) for a, b in zip(self._pending[layer], (k, v)))
        else:
            kp, vp = k, v
        L, T = tq0 + kp.shape[2], q.shape[2]
        n = kv_quantized_tokens(L, fmt) - tq0                         # tokens this append quantizes
        held = [self.ops.dequantize_kv(seg) for seg in segs]
        if n > 0:
            seg = self.ops.quantize_kv(kp[:, :, :n], vp[:, :, :n], KVFormat(fmt.kind, 0, fmt.group))
            segs.append(seg)
            new_k, new_v = self.ops.dequantize_kv(seg)
        else:
            new_k, new_v = kp[:, :, :0], vp[:, :, :0]
        old_k = torch.cat([h[0] for h in held], dim=2) if held else kp[:, :, :0]
        old_v = torch.cat([h[1] for h in held], dim=2) if held else vp[:, :, :0]
        k_fp, v_fp = torch.cat([old_k, kp], dim=2), torch.cat([old_v, vp], dim=2)
        k_q = torch.cat([old_k, new_k, kp[:, :, n:]], dim=2)
        v_q = torch.cat([old_v, new_v, vp[:, :, n:]], dim=2)
        self._pending[layer] = (kp[:, :, n:], vp[:, :, n:])
        self._quantized[layer] = tq0 + n
        pos = torch.arange(L - T, L, device=q.device)                  # the new queries' positions
        tq_at = torch.tensor([kv_quantized_tokens(int(p) + 1, fmt) for p in pos], device=q.device)
        t = torch.arange(L, device=q.device)
        sel = t[None, :] < tq_at[:, None]                              # (T, L): read the quantized token
        causal = t[None, :] <= pos[:, None]
        return _two_source_attention(q, k_q, v_q, k_fp, v_fp, sel, causal)


def _two_source_attention(q, k_q, v_q, k_fp, v_fp, sel, causal):
    """softmax(q k^T / sqrt(D)) v where key/value t of query i is (k_q, v_q)[t] if sel[i, t]
    else (k_fp, v_fp)[t], over the keys ``causal`` allows; GQA by head groups; the softmax in
    float32 for 16-bit inputs (as inference_conformance.reference.transformer.naive_attention)."""
    group = q.shape[1] // k_q.shape[1]
    cdt = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    rep = (lambda x: x.repeat_interleave(group, dim=1).to(cdt))
    qc = q.to(cdt) * q.shape[-1] ** -0.5
    scores = torch.where(sel, qc @ rep(k_q).transpose(-1, -2), qc @ rep(k_fp).transpose(-1, -2))
    p = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    zero = torch.zeros((), dtype=cdt, device=q.device)
    return (torch.where(sel, p, zero) @ rep(v_q) + torch.where(sel, zero, p) @ rep(v_fp)).to(q.dtype)


def implementations():
    """The vectorized PyTorch schemes (integer and FP8), the Triton quantized matmul (same
    quantize, Triton matmul), torchao's weight-only quantization and the CPU libraries of
    optimized/outside_quantization.py (unavailable where their package is missing)."""
    from inference_conformance.conformance.registry import builtin
    from inference_conformance.optimized import outside_adapters, outside_quantization as oq, quant_matmul

    return (
        builtin("quantization", "torch", SYMMETRIC),
        builtin("quantization", "torch_asym", ASYMMETRIC),
        builtin("quantization", "triton", TRITON_SYMMETRIC, kernel_modules=(quant_matmul,)),
        builtin("quantization", "triton_asym", TRITON_ASYMMETRIC, kernel_modules=(quant_matmul,)),
        builtin("quantization", "torch_fp8_e4m3", FP8_E4M3),
        builtin("quantization", "torch_fp8_e5m2", FP8_E5M2),
        builtin("quantization", "triton_fp8_e4m3", TRITON_FP8_E4M3, kernel_modules=(quant_matmul,)),
        builtin("quantization", "triton_fp8_e5m2", TRITON_FP8_E5M2, kernel_modules=(quant_matmul,)),
        builtin("quantization", "torchao_int8", outside_adapters.torchao_int8, needs="torchao", adapter=True),
        builtin("quantization", "torchao_intx", outside_adapters.torchao_intx, needs="torchao", adapter=True),
        # CPU libraries (optimized/outside_quantization.py; requirements/peers-libs.txt, tox -e peers-libs)
        builtin("quantization", "bnb_int8", oq.bnb_int8, needs="bitsandbytes", adapter=True, peer="libs"),
        builtin("quantization", "compressed_tensors", oq.ct, needs="compressed_tensors", adapter=True, peer="libs"),
        builtin("quantization", "compressed_tensors_asym", oq.ct_asym, needs="compressed_tensors", adapter=True, peer="libs"),
        builtin("quantization", "quanto_int8", oq.quanto_int8, needs="optimum.quanto", adapter=True, peer="libs"),
        builtin("quantization", "quanto_intx", oq.quanto_intx, needs="optimum.quanto", adapter=True, peer="libs"),
        builtin("quantization", "gguf_q8_0", oq.gguf_q8_0, needs="gguf", adapter=True, peer="libs"),
        builtin("quantization", "gguf_q4_0", oq.gguf_q4_0, needs="gguf", adapter=True, peer="libs"),
    )
