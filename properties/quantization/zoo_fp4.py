"""Known-bad FP4 block schemes (QT-13; registered by ``properties/quantization/zoo.py``), each
rejected by QT-13's exact comparison (``properties/quantization/test_quantization_fp4.py``):

- ``mxfp4_scale_exponent_ceil``: MXFP4's shared exponent from ceil(log2 amax) - 2 instead of
  floor: the scale doubles wherever amax is not a power of two, every value is rounded on a grid
  twice as coarse, and nothing reaches 6 (the block's largest value lands in [2, 4]);
- ``mxfp4_nibbles_swapped``: the two codes of a byte packed the other way round (even k in the
  high nibble) while dequantize and the matmul read the contract's layout;
- ``nvfp4_ties_away_from_zero``: E2M1 rounding with ties away from zero instead of to the even
  code (0.25 -> 0.5, 1.25 -> 1.5, 2.5 -> 3, 5 -> 6 times the scale): every tie is off by half
  a step, which the half-step bound allows and only the exact value shows;
- ``nvfp4_bf16_weights_in_float32``: a correct NVFP4 quantizer whose product rounds each
  dequantized weight (E2M1 x E4M3 block scale x float32 tensor scale, up to 24 significant
  bits) to bfloat16 in a float32 call: one bfloat16 rounding per weight, which QT-9's product
  law rejects (the intermediate is narrower than the call's dtype);
- ``nvfp4_bf16_scales_in_float32``: the same with each weight's scale (E4M3 block scale x
  tensor scale) rounded to bfloat16 instead: on QT-9's cancelling one-sign row (one scale for
  the row) its error is a common factor of a small output, 0.99 of the rule's bound; every other
  pinned case rejects it (240 to 2,270 x).
"""
from __future__ import annotations

import dataclasses

import torch

from inference_conformance.optimized.quantization import fp4 as quant_fp4
from inference_conformance.optimized.quantization.packing import pack


def _codes_ties_away(q: torch.Tensor) -> torch.Tensor:
    """E2M1 codes of q rounding every tie away from zero."""
    a = q.abs()
    mag = sum((a >= m).to(torch.int32) for m, _ in quant_fp4.MIDPOINTS)
    return torch.where((q < 0) & (mag > 0), mag + 8, mag)


class _BadFP4:
    """An FP4 scheme of the torch implementation with one bug (the module docstring)."""

    symmetric = True

    def __init__(self, name: str, fmt: str, *, ceil_scale: bool = False, swap: bool = False, ties_away: bool = False):
        self.name, self.number_format = name, fmt
        self.ceil_scale, self.swap, self.ties_away = ceil_scale, swap, ties_away

    def quantize(self, w, *, bits, granularity):
        qw = quant_fp4.quantize_fp4(w, bits=bits, granularity=granularity, fmt=self.number_format)
        if self.ceil_scale or self.ties_away:
            sc = qw.scale_codes
            if self.ceil_scale:                      # ceil(log2 amax) = floor + 1 unless amax is a power of two
                grp = w.detach().double().reshape(sc.shape[0] * sc.shape[1], -1)
                m, _ = torch.frexp(grp.abs().amax(dim=-1))
                sc = torch.where((m > 0.5).reshape(sc.shape), (sc.int() + 1).clamp(max=254), sc.int()).to(torch.uint8)
            qw = dataclasses.replace(qw, scale_codes=sc, kernel_scales=None)
            s = quant_fp4.element_scales(qw)
            q = torch.where(s > 0, w.double() / torch.where(s > 0, s, 1.0), 0.0)
            codes = _codes_ties_away(q) if self.ties_away else quant_fp4.e2m1_codes(q)
            qw = dataclasses.replace(qw, codes=pack(codes, 4))
        if self.swap:
            c = qw.codes.to(torch.int32)
            qw = dataclasses.replace(qw, codes=(((c & 15) << 4) | (c >> 4)).to(torch.uint8))
        return qw

    def dequantize(self, qw):
        return quant_fp4.dequantize_fp4(qw)

    def matmul(self, x, qw):
        return quant_fp4.matmul_fp4(x, qw)

    def __repr__(self) -> str:
        return f"inference_conformance.properties.quantization.zoo_fp4.{self.name}"


class _BF16WeightsNVFP4(_BadFP4):
    """NVFP4 whose matmul rounds the dequantized weights to bfloat16 before a float32 product."""

    def matmul(self, x, qw):
        quant_fp4.check_fp4(qw)
        return x @ quant_fp4.dequantize_fp4(qw).to(torch.bfloat16).to(x.dtype).T


class _BF16ScalesNVFP4(_BadFP4):
    """NVFP4 whose matmul rounds each weight's scale to bfloat16 before a float32 product."""

    def matmul(self, x, qw):
        quant_fp4.check_fp4(qw)
        s = quant_fp4.element_scales(qw, torch.float32)
        values = quant_fp4.dequantize_fp4(qw).to(torch.float32) / torch.where(s > 0, s, torch.ones_like(s))
        return x @ (values * s.to(torch.bfloat16).to(torch.float32)).to(x.dtype).T


mxfp4_scale_exponent_ceil = _BadFP4("mxfp4_scale_exponent_ceil", "mxfp4", ceil_scale=True)
mxfp4_nibbles_swapped = _BadFP4("mxfp4_nibbles_swapped", "mxfp4", swap=True)
nvfp4_ties_away_from_zero = _BadFP4("nvfp4_ties_away_from_zero", "nvfp4", ties_away=True)
nvfp4_bf16_weights_in_float32 = _BF16WeightsNVFP4("nvfp4_bf16_weights_in_float32", "nvfp4")
nvfp4_bf16_scales_in_float32 = _BF16ScalesNVFP4("nvfp4_bf16_scales_in_float32", "nvfp4")
#: The FP4 zoo of QT-13's exact values, name -> scheme.
FP4_ZOO = {z.name: z for z in (mxfp4_scale_exponent_ceil, mxfp4_nibbles_swapped, nvfp4_ties_away_from_zero)}
