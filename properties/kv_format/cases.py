"""KV caches for the laws of QT-12 (``laws.py``): the
cases (sizes, a format, the kind of contents), the keys and values of a case, the calls (a refusal
becomes "unsupported", never a pass) and the bytes a format holds; the three laws are in
``laws.py``.

The contents are drawn to break a format's granularity: one KV head 100 times the others (a
scale shared by a token's heads gives the small heads a step 100 times too coarse), one key
channel 30 times the others (KIVI's per-channel key scales exist for it), one token 30 times the
others, all values ~1e3 (past E4M3's 448: an FP8 cast with no scale saturates) or ~1e-4 (E4M3's
subnormals: with no scale they flush), the first token of the first sequence all zero.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from inference_conformance.conformance.contracts.quantization.kv import (
    KV_FORMATS,
    KVFormat,
    kv_format,
)
from inference_conformance.conformance.laws import refusal

KINDS = ("normal", "outlier_head", "outlier_channel", "outlier_token", "huge", "tiny")


@dataclass(frozen=True)
class KVFCase:
    """One cache: k, v (B, H, T, D); ``fmt`` a KV_FORMATS name or "kivi:R:G" (int4 KIVI with
    residual R and groups of G); ``kind`` one of :data:`KINDS`; ``group`` the GQA group of the
    attention law's queries (B, H · group, T, D)."""

    B: int
    H: int
    T: int
    D: int
    fmt: str
    kind: str = "normal"
    group: int = 1

    def format(self) -> KVFormat:
        if self.fmt in KV_FORMATS:
            return KV_FORMATS[self.fmt]
        _, r, g = self.fmt.split(":")
        return kv_format("int4_kivi", int(r), int(g))

    @property
    def residual(self) -> int:
        return self.format().residual

    @property
    def group_size(self) -> int:
        return self.format().group


def make_kv(case: KVFCase, seed: int, dtype, device):
    """(q, k, v) of the case in ``dtype`` on ``device``: N(0, 1), then the case's kind applied
    (head seed % H, channel seed % D, token seed % T), the first token of row 0 zero."""
    g = torch.Generator().manual_seed(seed)
    B, H, T, D = case.B, case.H, case.T, case.D
    q = torch.randn(B, H * case.group, T, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, H, T, D, generator=g, dtype=torch.float64) for _ in "kv")
    for x in (k, v):
        if case.kind == "outlier_head":
            x[:, seed % H] *= 100.0
        elif case.kind == "outlier_channel":
            x[..., seed % D] *= 30.0
        elif case.kind == "outlier_token":
            x[:, :, seed % T] *= 30.0
        elif case.kind in ("huge", "tiny"):
            x *= 1e3 if case.kind == "huge" else 1e-4
        x[0, :, 0] = 0.0
    return tuple(t.to(dtype).to(device) for t in (q, k, v))


class ContractOps:
    """An implementation of the contract as the model's quantized cache
    (``optimized.quantization.kv.QuantizedKVCache``) calls it: ``quantize_kv(k, v, fmt)``,
    ``dequantize_kv``, ``kv_nbytes`` (measured from the stored tensors)."""

    def __init__(self, impl, run=None):
        self.impl, self.run, self.name = impl, run, getattr(impl, "name", str(impl))

    def quantize_kv(self, k, v, fmt):
        with refusal(self.run, f"{self.name} refuses {k.dtype} {fmt.name}"):
            return self.impl.quantize_kv(k, v, format=fmt)

    def dequantize_kv(self, stored):
        return self.impl.dequantize_kv(stored)

    def kv_nbytes(self, stored):
        return held_bytes(stored)


def held_bytes(stored) -> int:
    """Bytes of every tensor reachable in ``stored`` (numel x element size; a tensor seen twice
    counted once)."""
    from inference_conformance.properties.generic_cases import _tensors

    seen, total = set(), 0
    for _, t in _tensors(stored):
        key = (t.data_ptr(), t.numel(), t.dtype)
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


FORMAT_NAMES = tuple(KV_FORMATS) + ("kivi:0:4", "kivi:3:5")


@st.composite
def kv_cases(draw) -> KVFCase:
    return KVFCase(draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 40)),
                   draw(st.sampled_from([1, 2, 3, 8, 16, 17])), draw(st.sampled_from(FORMAT_NAMES)),
                   draw(st.sampled_from(KINDS)), draw(st.sampled_from([1, 2])))


#: Pinned: every format; an outlier head in int8 and FP8 (E4M3 and E5M2), an outlier channel over
#: several KIVI groups, huge and tiny FP8 values, odd D, GQA, a KIVI cache shorter than its
#: residual and one with an incomplete group.
EXAMPLES = tuple(dict(case=c, seed=s) for c, s in (
    (KVFCase(2, 2, 37, 16, "int4_kivi_r8_g8", "outlier_channel", 2), 3),
    (KVFCase(1, 3, 24, 17, "kivi:0:4", "outlier_channel"), 5),
    (KVFCase(2, 3, 33, 16, "int8", "outlier_head", 2), 1),
    (KVFCase(1, 2, 19, 8, "fp8_e4m3fn", "outlier_head"), 2),
    (KVFCase(1, 2, 7, 8, "fp8_e4m3fn", "huge"), 4),
    (KVFCase(1, 2, 6, 8, "fp8_e4m3fn", "tiny"), 8),
    (KVFCase(1, 2, 9, 3, "fp8_e5m2", "outlier_head"), 4),
    (KVFCase(2, 1, 29, 8, "kivi:3:5", "outlier_token", 2), 6),
    (KVFCase(1, 2, 5, 8, "int4_kivi_r8_g8", "outlier_channel"), 7)))
