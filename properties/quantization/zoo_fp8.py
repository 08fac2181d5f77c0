"""Known-bad FP8 schemes (QT-11; registered by ``properties/quantization/zoo.py``), each rejected
by a law of ``properties/quantization/test_quantization_fp8.py`` (the known-bad casts themselves
are the ``fp8_cast`` contract's zoo, ``properties/fp8_cast/zoo.py``):

- ``fp8_e5m2_grid_as_e4m3_scheme`` (E5M2's grid while naming E4M3) and
  ``fp8_double_rounding_scheme`` (w / s rounded to float16 before the cast), rejected by the
  schemes' law: every element within half the grid spacing at w / s (``fp8_value_bound``).
"""
from __future__ import annotations

import dataclasses

import torch

from inference_conformance.optimized.quantization import fp8 as quant_fp8


class _E5M2GridAsE4M3:
    """An FP8 scheme that names E4M3fn (scale max|w| / 448) but rounds w / s to E5M2's grid, as a
    kernel that picked the wrong float8 dtype does: within E5M2's half ulp (2^-3), not E4M3's."""

    symmetric = True
    number_format = "fp8_e4m3fn"

    def quantize(self, w, *, bits, granularity):
        qw = quant_fp8.quantize_fp8(w, bits=bits, granularity=granularity, fmt="fp8_e4m3fn")
        y = qw.values().to(torch.float32)                             # on E4M3's grid; |y| <= 448
        e5m2 = quant_fp8.to_fp8(y, "fp8_e5m2").to(torch.float32)      # rounded again, to E5M2's grid
        return dataclasses.replace(qw, codes=quant_fp8.to_fp8(e5m2, "fp8_e4m3fn").view(torch.uint8))

    def dequantize(self, qw):
        return quant_fp8.dequantize_fp8(qw)

    def matmul(self, x, qw):
        return quant_fp8.matmul_fp8(x, qw)


fp8_e5m2_grid_as_e4m3_scheme = _E5M2GridAsE4M3()


class _DoubleRoundingViaFloat16(_E5M2GridAsE4M3):
    """An FP8 scheme (E4M3fn, scale max|w| / 448) that rounds w / s to float16 before the FP8
    cast: the double rounding of the ``fp8_cast`` zoo's ``double_rounding_via_float16`` on every element, within 2^-4 |w|
    (0.98 of that bound at worst on 65,536 weights) but not within half the grid spacing."""

    def quantize(self, w, *, bits, granularity):
        qw = quant_fp8.quantize_fp8(w, bits=bits, granularity=granularity, fmt="fp8_e4m3fn")
        s = qw.scales.double()
        s = s.expand(qw.N, qw.K) if granularity == "tensor" else s.repeat_interleave(qw.group_size, dim=1)
        y = torch.where(s > 0, w.detach().double() / torch.where(s > 0, s, 1.0), 0.0)
        return dataclasses.replace(qw, codes=quant_fp8.to_fp8(y.to(torch.float16), "fp8_e4m3fn").view(torch.uint8))


fp8_double_rounding_scheme = _DoubleRoundingViaFloat16()
