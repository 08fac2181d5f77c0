"""Known-bad KV-cache formats (the bug zoo of the ``kv_format`` contract): each one a bug of the
field's quantized caches, each rejected by a law of QT-12 (``properties/kv_format/cases.py``) by
its own comparison. Most compute the cache in float64 as the reference does with one thing
changed (:func:`_simulate`) and hold the reconstruction itself; the nibble and byte entries wrap
the reference's own storage.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from inference_conformance.conformance.contracts.kv_format import validate
from inference_conformance.conformance.contracts.quantization import levels
from inference_conformance.conformance.contracts.quantization.fp8 import FP8_FORMATS
from inference_conformance.conformance.contracts.quantization.kv import kv_quantized_tokens
from inference_conformance.reference import kv_format as ref
from inference_conformance.reference.quantization import kv as ref_kv
from inference_conformance.reference.quantization.fp8 import fp8_cast


@dataclass(frozen=True)
class _Held:
    """A zoo entry's cache: the float64 reconstructions and the cache's dtype."""

    k_hat: torch.Tensor
    v_hat: torch.Tensor
    dtype: torch.dtype


def _round(x, s, fmt):
    safe = torch.where(s > 0, s, 1.0)
    if fmt.kind in FP8_FORMATS:
        return torch.where(s > 0, fp8_cast(x / safe, fmt.kind) * s, 0.0)
    qmax = levels(fmt.code_bits, True)
    return torch.round(x / safe).clamp(-qmax, qmax) * s


def _simulate(k, v, fmt, *, shared_heads=False, keys_per_token=False, residual_dropped=False,
              no_fp8_scale=False, group_scale_per_token=False) -> _Held:
    """The format in float64 (steps as ``quantization.kv.kv_step``) with one bug switched on."""
    validate(k, v, fmt)
    T = k.shape[2]
    Tq = T // fmt.group * fmt.group if residual_dropped else kv_quantized_tokens(T, fmt)
    top = FP8_FORMATS[fmt.kind].max if fmt.kind in FP8_FORMATS else levels(fmt.code_bits, True)
    hats = []
    for which, x in (("k", k), ("v", v)):
        x64 = x.detach().to(torch.float64)
        xq = x64[:, :, :Tq]
        if fmt.kind == "int4_kivi" and which == "k" and not keys_per_token:
            B, H, _, D = xq.shape
            amax = xq.reshape(B, H, Tq // fmt.group, fmt.group, D).abs().amax(dim=3)            # (B, H, groups, D)
            idx = torch.arange(Tq) if group_scale_per_token else torch.arange(Tq) // fmt.group
            amax = amax[:, :, idx.clamp(max=max(amax.shape[2] - 1, 0))] if Tq else xq
        else:
            amax = xq.abs().amax(dim=-1, keepdim=True)
            if shared_heads:
                amax = amax.amax(dim=1, keepdim=True)
        s = torch.ones_like(amax) if no_fp8_scale and fmt.kind in FP8_FORMATS else amax / top
        hats.append(torch.cat([_round(xq, s, fmt), x64[:, :, Tq:]], dim=2))
    return _Held(hats[0], hats[1], k.dtype)


class _Simulated:
    def __init__(self, **bug):
        self.bug = bug

    def quantize_kv(self, k, v, *, format):
        return _simulate(k, v, format, **self.bug)

    @staticmethod
    def dequantize_kv(stored):
        return stored.k_hat.to(stored.dtype), stored.v_hat.to(stored.dtype)


#: A scale per token shared by its heads (amax over H and D), where the format has one per token
#: and head ("per-head scales applied per token"): a loud head sets every head's step.
scale_shared_across_heads = _Simulated(shared_heads=True)
#: int4 KIVI with the keys quantized per token (over D) instead of per channel.
kivi_keys_per_token = _Simulated(keys_per_token=True)
#: int4 KIVI quantizing the most recent tokens too: the full-precision residual window dropped.
kivi_residual_dropped = _Simulated(residual_dropped=True)
#: FP8 codes cast with no scale (x itself): saturates past F, flushes below the subnormals.
fp8_without_scale = _Simulated(no_fp8_scale=True)
#: KIVI's key scales, one per group of G tokens, read at the token's index (scale[t], not scale[t // G]).
kivi_group_scale_read_per_token = _Simulated(group_scale_per_token=True)


class _NibblesSwappedOnRead:
    """int4 codes packed low nibble first (the reference's storage) but read high nibble first,
    as a kernel written for the other layout does: channels 2i and 2i + 1 trade codes."""

    quantize_kv = staticmethod(ref.quantize_kv)

    @staticmethod
    def dequantize_kv(stored):
        if stored.fmt.kind != "int4_kivi":
            return ref.dequantize_kv(stored)
        swap = (lambda c: ((c & 15) << 4 | (c >> 4)).to(torch.uint8))
        return ref.dequantize_kv(replace(stored, k_codes=swap(stored.k_codes), v_codes=swap(stored.v_codes)))


int4_nibbles_swapped_on_read = _NibblesSwappedOnRead()


class _CodesInFloat32:
    """The right values, but every code held as a float32 (4 bytes where the format has 1 or
    half), as a cache that quantizes only to dequantize at once does."""

    @staticmethod
    def quantize_kv(k, v, *, format):
        validate(k, v, format)
        return ref_kv.quantize_kv(k, v, format)

    @staticmethod
    def dequantize_kv(stored):
        return ref_kv.dequantize_kv(stored)


class _Float32Codes(_CodesInFloat32):
    @staticmethod
    def quantize_kv(k, v, *, format):
        q = _CodesInFloat32.quantize_kv(k, v, format=format)
        return replace(q, k_codes=q.k_codes.to(torch.float32), v_codes=q.v_codes.to(torch.float32))


codes_held_in_float32 = _Float32Codes()


def implementations():
    """The known-bad KV-cache formats: QT-12's laws name each in their ``kills``."""
    from inference_conformance.conformance.registry import known_bad

    return (
        known_bad("kv_format", "scale_shared_across_heads", scale_shared_across_heads,
                  bug="a scale per token shared by its heads where the format has one per token and head (per-head scales applied per "
                      "token)"),
        known_bad("kv_format", "kivi_keys_per_token", kivi_keys_per_token,
                  bug="int4 KIVI with the keys quantized per token (over D) instead of per channel"),
        known_bad("kv_format", "kivi_residual_dropped", kivi_residual_dropped,
                  bug="int4 KIVI quantizing the most recent tokens too: the full-precision residual window dropped"),
        known_bad("kv_format", "int4_nibbles_swapped_on_read", int4_nibbles_swapped_on_read,
                  bug="int4 codes packed low nibble first but read high nibble first: channels 2i and 2i + 1 trade codes"),
        known_bad("kv_format", "fp8_without_scale", fp8_without_scale,
                  bug="FP8 codes cast with no scale: saturates past F, flushes below the subnormals"),
        known_bad("kv_format", "kivi_group_scale_read_per_token", kivi_group_scale_read_per_token,
                  bug="KIVI's key scales, one per group of tokens, read at the token's index (scale[t], not scale[t // group])"),
        known_bad("kv_format", "codes_held_in_float32", codes_held_in_float32,
                  bug="the right values, every code held as a float32 (4 bytes where the format has 1 or half)"),
    )
