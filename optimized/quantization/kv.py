"""Vectorized PyTorch KV-cache quantization formats (QT-12; lecture 001 §5.2): :class:`PackedKV`
(int8 / FP8 per token, int4 KIVI packed two per byte along D, low nibble first) and
:class:`QuantizedKVCache`, the model's attention backend over them (its reads of token t switch
from full precision to the dequantized code once t's group is complete, as a decode engine
holds it).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from inference_conformance.conformance.contracts.quantization import levels
from inference_conformance.conformance.contracts.quantization.kv import KVFormat, kv_quantized_tokens
from inference_conformance.conformance.contracts.quantization.fp8 import FP8_FORMATS
from inference_conformance.optimized.quantization.packing import pack, storable, unpack
from inference_conformance.optimized.quantization.fp8 import to_fp8
from inference_conformance.reference.quantization.kv import KVOps, QuantizedKV


@dataclass(frozen=True)
class PackedKV(QuantizedKV):
    """Keys and values (B, H, T, D) in a :class:`KVFormat`, as held: the reference's fields
    (:class:`inference_conformance.reference.quantization.kv.QuantizedKV`) with the first Tq
    tokens' ``k_codes`` / ``v_codes`` int8 for int8, FP8 dtypes for FP8, int4 KIVI codes u = q + 8
    packed two per byte along D, low nibble first, (B, H, Tq, ceil(D / 2)) uint8; ``k_scales`` /
    ``v_scales`` float32 ((B, H, Tq, 1); KIVI keys (B, H, Tq / G, D)); and ``D``, the head dim."""

    D: int


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
