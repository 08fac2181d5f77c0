"""Known-bad quantization implementations (the bug zoo): each is a classic weight-quantization bug,
and a law of ``properties/test_quantization.py`` must reject every one (QT-1 for the
quantize/dequantize bugs, QT-9 for the one that only the fused product gets wrong; the act-order
law for the one that ignores ``g_idx``).

All follow the ``quantization`` contract and store float64 scales, so that only the bug (not
rounding) makes them wrong. The packed layout is the one of ``optimized/quant_torch.py``.
"""
from __future__ import annotations

import dataclasses

import torch

from conformance.contracts.quantization import levels, validate_matmul, validate_quantize
from optimized import quant_torch


def _swap_order(u: torch.Tensor, bits: int, L: int) -> torch.Tensor:
    """Reverse the codes within each byte's run (high bits read first), (R, L) -> (R, L)."""
    per = quant_torch.codes_per_byte(bits)
    R = u.shape[0]
    full = torch.nn.functional.pad(u, (0, (-L) % per)).reshape(R, -1, per).flip(-1).reshape(R, -1)
    return full[:, :L]


# ------------------------------------------------------------------ act-order (g_idx) entries
class _IgnoresGIdx:
    """Quantizes by the act-order groups of ``g_idx`` (as a GPTQ checkpoint stores them), but
    dequantize and matmul read column k's scale and zero point from group k // group_size, as
    a kernel written for plain groups does."""

    name = "g_idx_ignored"
    symmetric = True

    def quantize(self, w, *, bits, granularity, g_idx=None):
        return quant_torch.quantize(w, bits=bits, granularity=granularity, g_idx=g_idx)

    def dequantize(self, qw):
        qw = quant_torch.check_packed(qw)
        return quant_torch.dequantize(dataclasses.replace(qw, g_idx=None))

    def matmul(self, x, qw):
        return quant_torch.matmul(x, dataclasses.replace(quant_torch.check_packed(qw), g_idx=None))


g_idx_ignored = _IgnoresGIdx()


# -------------------------------------------------------------------------- scheme entries
class _Bad:
    """A quantizer with one bug switched on (see each instance's docstring below)."""

    def __init__(self, name: str, doc: str, *, symmetric: bool = True, floor: bool = False,
                 pow2_scale: bool = False, wrong_groups: bool = False, swap_in_matmul: bool = False,
                 zero_minus_one: bool = False, zeros_interleave: bool = False):
        self.name, self.__doc__ = name, doc
        self.symmetric = symmetric
        self.floor, self.pow2_scale, self.wrong_groups = floor, pow2_scale, wrong_groups
        self.swap_in_matmul, self.zero_minus_one, self.zeros_interleave = swap_in_matmul, zero_minus_one, zeros_interleave

    def quantize(self, w, *, bits, granularity):
        shape = validate_quantize(w, bits, granularity)
        N, K, b, g = shape.N, shape.K, shape.bits, shape.group_size
        grp = w.double().reshape(1, 1, N * K) if granularity == "tensor" else w.double().reshape(N, K // g, g)
        if self.symmetric:
            s = grp.abs().amax(dim=-1) / (2 ** (b - 1) if self.pow2_scale else levels(b, True))
            z = torch.full_like(s, 2 ** (b - 1))
            lo, hi = 1, 2 ** b - 1
        else:
            lo_w, hi_w = grp.amin(dim=-1).clamp(max=0), grp.amax(dim=-1).clamp(min=0)
            s = (hi_w - lo_w) / levels(b, False)
            z = torch.where(s > 0, torch.round(-lo_w / torch.where(s > 0, s, 1.0)), 0.0).clamp(0, 2 ** b - 1)
            lo, hi = 0, 2 ** b - 1
        rnd = torch.floor if self.floor else torch.round
        safe = torch.where(s > 0, s, 1.0)[..., None]
        u = torch.where(s[..., None] > 0, (rnd(grp / safe) + z[..., None]).clamp(lo, hi), z[..., None])
        stored = (z - 1) % 256 if self.zero_minus_one else z          # a checkpoint's z - 1, read as z
        stored = stored.to(torch.int32)
        if self.zeros_interleave:          # packed low-first, repacked for the kernel high-first
            stored = _swap_order(stored, b, stored.shape[1])
        return quant_torch.PackedWeight(quant_torch.pack(u.reshape(N, K).to(torch.int32), b), s,
                                        stored.to(torch.uint8), b, g, granularity, N, K, w.dtype, self.symmetric)

    def _dequantize64(self, qw, swap: bool = False) -> torch.Tensor:
        u = quant_torch.unpack(qw.codes, qw.bits, qw.K)
        if swap:
            u = _swap_order(u, qw.bits, qw.K)
        s, z = qw.scales, qw.zeros.to(torch.int32)
        if self.wrong_groups:              # (N, groups) read as if stored (groups, N)
            s = s.t().contiguous().reshape(s.shape)
        if qw.granularity == "tensor":
            s, z = s.expand(qw.N, qw.K), z.expand(qw.N, qw.K)
        else:
            s, z = s.repeat_interleave(qw.group_size, dim=1), z.repeat_interleave(qw.group_size, dim=1)
        return (u - z).double() * s

    def dequantize(self, qw):
        return self._dequantize64(quant_torch.check_packed(qw)).to(qw.dtype)

    def matmul(self, x, qw):
        qw = quant_torch.check_packed(qw)
        validate_matmul(x, K=qw.K, dtype=qw.dtype, device=qw.codes.device)
        return (x.double() @ self._dequantize64(qw, swap=self.swap_in_matmul).T).to(x.dtype)


floor_not_round = _Bad("floor_not_round", "q = floor(w / s) instead of round: errors up to a whole step.",
                       floor=True)
scale_pow2_clamped = _Bad("scale_pow2_clamped", "s = max|w| / 2^(b-1) with q clamped to ±(2^(b-1) - 1): "
                          "the largest weight is clipped by a whole step s.", pow2_scale=True)
scales_wrong_groups = _Bad("scales_wrong_groups", "the (N, groups) scales read as if stored (groups, N): "
                           "each group gets another group's scale.", wrong_groups=True)
nibbles_swapped_in_matmul = _Bad("nibbles_swapped_in_matmul", "quantize packs the first code in the low bits, "
                                 "the fused matmul reads it from the high bits (dequantize is right).",
                                 swap_in_matmul=True)
zero_point_off_by_one = _Bad("zero_point_off_by_one", "zero points stored as z - 1 (a checkpoint format's "
                             "convention) and read as z: every value shifts by one step.",
                             symmetric=False, zero_minus_one=True)
zero_points_wrong_interleave = _Bad("zero_points_wrong_interleave", "zero points packed two per byte low "
                                    "first and unpacked high first: neighbouring groups swap zero points.",
                                    symmetric=False, zeros_interleave=True)
