"""KV-cache quantization formats of the ``quantization`` contract (QT-12; lecture 001 §5.4, Liu
et al. 2024, KIVI): :class:`KVFormat` (int8 and FP8 per token and head, int4 KIVI keys per
channel over groups of G tokens with the R most recent tokens in full precision), which tokens
are held quantized (:func:`kv_quantized_tokens`), every element's step (:func:`kv_step`) and
bound (:func:`kv_bound`), and the bound on attention over such a cache (:func:`attention_bound`).
Not a contract function: the formats the model's quantized cache and the paged kernels read.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from inference_conformance.conformance.contracts.quantization.contract import SCALE_SLACK, levels
from inference_conformance.conformance.contracts.quantization.fp8 import FP8_FORMATS, fp8_value_bound


@dataclass(frozen=True)
class KVFormat:
    """A quantized KV-cache format (QT-12): ``kind`` "int8" (absmax per token and head over D),
    "int4_kivi" (keys per channel over groups of ``group`` tokens, values per token, at 4 bits
    absmax; the most recent ``residual`` tokens and an incomplete group kept in full precision) or
    an FP8 format name (per token and head, s = max|x_t| / F). ``residual`` R and ``group`` G
    are 0 and 1 for the per-token kinds (every token quantized when written)."""

    kind: str
    residual: int = 0
    group: int = 1

    @property
    def name(self) -> str:
        return self.kind if self.kind != "int4_kivi" else f"int4_kivi_r{self.residual}_g{self.group}"

    @property
    def code_bits(self) -> int:
        """Bits of one stored code: 8 (int8, FP8) or 4 (KIVI)."""
        return 4 if self.kind == "int4_kivi" else 8


def kv_format(kind: str, residual: int = 0, group: int = 1) -> KVFormat:
    """A :class:`KVFormat`, checked: ValueError naming ``kind``, ``residual`` or ``group``."""
    if kind not in ("int8", "int4_kivi") + tuple(FP8_FORMATS):
        raise ValueError(f"kind must be 'int8', 'int4_kivi' or an FP8 format {list(FP8_FORMATS)}, got {kind!r}")
    if kind != "int4_kivi" and (residual, group) != (0, 1):
        raise ValueError(f"residual and group apply to int4_kivi only, got residual={residual}, group={group}")
    if not (isinstance(group, int) and group >= 1):
        raise ValueError(f"group must be an int >= 1, got {group!r}")
    if not (isinstance(residual, int) and residual >= 0):
        raise ValueError(f"residual must be an int >= 0, got {residual!r}")
    return KVFormat(kind, residual, group)


#: The formats of QT-12 (KIVI with R = G = 8 tokens, scaled to the small world's short documents;
#: KIVI's paper uses G = 32, R = 128).
KV_FORMATS = {f.name: f for f in (kv_format("int8"), kv_format("int4_kivi", 8, 8),
                                   kv_format("fp8_e4m3fn"), kv_format("fp8_e5m2"))}


def kv_quantized_tokens(T: int, fmt: KVFormat) -> int:
    """How many of T cached tokens are held quantized: floor(max(T - R, 0) / G) * G (the rest,
    at least the R most recent, in full precision). Groups never change once quantized."""
    return max(T - fmt.residual, 0) // fmt.group * fmt.group


def kv_step(x: torch.Tensor, fmt: KVFormat, which: str) -> torch.Tensor:
    """The step (int kinds) or scale (FP8) of every element of keys or values x (B, H, T, D)
    (``which`` "k" or "v"), float64 of x's shape; 0 for tokens held in full precision. int8:
    max_d |x_t| / 127 per token; KIVI keys: max over the group's G tokens of |x[t, d]| / 7 per
    channel d, values max_d |x_t| / 7 per token; FP8: max_d |x_t| / F per token."""
    if which not in ("k", "v"):
        raise ValueError(f"which must be 'k' or 'v', got {which!r}")
    x64 = x.detach().to(torch.float64)
    B, H, T, D = x64.shape
    Tq = kv_quantized_tokens(T, fmt)
    s = torch.zeros_like(x64)
    if Tq == 0:
        return s
    xq = x64[:, :, :Tq]
    if fmt.kind == "int4_kivi" and which == "k":
        g = xq.reshape(B, H, Tq // fmt.group, fmt.group, D).abs().amax(dim=3, keepdim=True) / levels(4, True)
        s[:, :, :Tq] = g.expand(B, H, Tq // fmt.group, fmt.group, D).reshape(B, H, Tq, D)
        return s
    top = FP8_FORMATS[fmt.kind].max if fmt.kind in FP8_FORMATS else levels(fmt.code_bits, True)
    s[:, :, :Tq] = (xq.abs().amax(dim=-1, keepdim=True) / top).expand(B, H, Tq, D)
    return s


def kv_bound(x: torch.Tensor, fmt: KVFormat, which: str) -> torch.Tensor:
    """QT-12's per-element bound on the dequantized cache, float64 of x's shape: s/2 (int kinds)
    or :func:`fp8_value_bound` (FP8) with 2^-12 slack for the stored scale, 0 for tokens held in
    full precision, plus the output dtype's rounding (half an ulp at |x| + the bound)."""
    s = kv_step(x, fmt, which)
    if fmt.kind in FP8_FORMATS:
        b = torch.where(s > 0, fp8_value_bound(x, s, fmt.kind), torch.zeros_like(s))
    else:
        b = s / 2 * (1 + SCALE_SLACK)
    fin = torch.finfo(x.dtype)
    return b + fin.eps / 2 * (x.detach().abs().to(torch.float64) + b) * (s > 0)


def attention_bound(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
                    scale: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """QT-12's bound on attention over a perturbed cache, from the per-element bounds ``dk``,
    ``dv`` (B, Hkv, Tk, D) of the keys and values alone, float64 (B, Hq, Tq, D). A logit moves by
    at most e_j = scale sum_d |q_d| dk_jd; with e = max_j e_j over the keys a query sees, every
    softmax weight changes by a factor within [exp(-2e), exp(2e)], so |p_hat - p|_1 <=
    exp(2e) - 1 and, since the weights sum to 1 in both, the mix of exact values moves by at most
    (exp(2e) - 1) (max_j v_jd - min_j v_jd) / 2; the values' own error adds max_j dv_jd. GQA:
    query head h reads KV head h // (Hq / Hkv). ``mask`` bool (B or 1, 1, Tq, Tk), True = may
    attend (None: all)."""
    q64, v64 = q.detach().to(torch.float64), v.detach().to(torch.float64)
    group = q64.shape[1] // v64.shape[1]
    rep = (lambda t: t.repeat_interleave(group, dim=1))
    dk64, dv64, v64 = rep(dk.to(torch.float64)), rep(dv.to(torch.float64)), rep(v64)
    e = scale * (q64.abs() @ dk64.transpose(-1, -2))                         # (B, Hq, Tq, Tk)
    see = torch.ones_like(e, dtype=torch.bool) if mask is None else mask.expand_as(e)
    e_max = torch.where(see, e, 0.0).amax(dim=-1, keepdim=True)              # (B, Hq, Tq, 1)
    big, small = torch.finfo(torch.float64).max, -torch.finfo(torch.float64).max
    vmax = torch.where(see[..., None], v64[:, :, None], small).amax(dim=3)   # (B, Hq, Tq, D)
    vmin = torch.where(see[..., None], v64[:, :, None], big).amin(dim=3)
    dvmax = torch.where(see[..., None], dv64[:, :, None], 0.0).amax(dim=3)
    return torch.expm1(2 * e_max) * (vmax - vmin) / 2 + dvmax
