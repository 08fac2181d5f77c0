"""Known-bad FP8 casts and schemes (QT-11; the schemes registered by ``properties/quantization/zoo.py``),
each rejected by a law of ``properties/quantization/test_quantization_fp8.py``:

- :data:`FP8_CAST_ZOO`, casts ``cast(x, fmt)`` (outside the contract), rejected by the cast law's
  exact comparison with the float64 round-to-nearest-even grid: no saturation (NaN / inf past F),
  E5M2's grid for E4M3, and a cast through float16 (double rounding: wrong only within half a
  float16 step of a midpoint, pinned just above powers of two and at the ties);
- ``fp8_e5m2_grid_as_e4m3_scheme`` (E5M2's grid while naming E4M3) and
  ``fp8_double_rounding_scheme`` (w / s rounded to float16 before the cast), rejected by the
  schemes' law: every element within half the grid spacing at w / s (``fp8_value_bound``).
"""
from __future__ import annotations

import dataclasses
import math

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
    cast: the double rounding of :func:`_cast_via_float16` on every element, within 2^-4 |w|
    (0.98 of that bound at worst on 65,536 weights) but not within half the grid spacing."""

    def quantize(self, w, *, bits, granularity):
        qw = quant_fp8.quantize_fp8(w, bits=bits, granularity=granularity, fmt="fp8_e4m3fn")
        s = qw.scales.double()
        s = s.expand(qw.N, qw.K) if granularity == "tensor" else s.repeat_interleave(qw.group_size, dim=1)
        y = torch.where(s > 0, w.detach().double() / torch.where(s > 0, s, 1.0), 0.0)
        return dataclasses.replace(qw, codes=quant_fp8.to_fp8(y.to(torch.float16), "fp8_e4m3fn").view(torch.uint8))


fp8_double_rounding_scheme = _DoubleRoundingViaFloat16()


def _cast_unsaturated(x, fmt):
    """FP8 rounding without saturation: a value that rounds past F becomes NaN (E4M3fn has no
    inf: its top code is NaN) or inf (E5M2), as a cast with no clamp does on hardware."""
    from inference_conformance.conformance.contracts.quantization_fp8 import fp8_format
    from inference_conformance.reference.quantization.fp8 import fp8_cast

    f = fp8_format(fmt)
    top_half_step = 2.0 ** (math.floor(math.log2(f.max)) - f.m - 1)     # half the spacing at F
    out = fp8_cast(x, fmt)
    over = x.double().abs() >= f.max + top_half_step
    bad = float("nan") if fmt == "fp8_e4m3fn" else float("inf")
    return torch.where(over, torch.copysign(torch.full_like(out, bad), x.double()), out).to(x.dtype)


def _cast_e5m2_grid(x, fmt):
    """Rounds to E5M2's grid whatever the format asked (saturating at the asked format's F): an
    E4M3 cast that keeps only 2 mantissa bits, errors up to 2^-3 relative."""
    from inference_conformance.conformance.contracts.quantization_fp8 import fp8_format
    from inference_conformance.reference.quantization.fp8 import fp8_cast

    top = fp8_format(fmt).max
    return fp8_cast(x, "fp8_e5m2").clamp(-top, top).to(x.dtype)


def _cast_via_float16(x, fmt):
    """Rounds x to float16 first, then to the FP8 grid (each round to nearest even, saturating at
    ±F), as a kernel that stages its input in half precision does: a value within half a float16
    step of the midpoint between two FP8 values lands on that midpoint, whose tie then goes to the
    even neighbour, the farther one (off by up to half an FP8 step plus half a float16 step;
    within 2^-(m+1) |x|, never within half the spacing at x)."""
    from inference_conformance.conformance.contracts.quantization_fp8 import fp8_format
    from inference_conformance.reference.quantization.fp8 import fp8_cast

    top = fp8_format(fmt).max
    return fp8_cast(x.double().clamp(-top, top).to(torch.float16), fmt).to(x.dtype)


#: Known-bad FP8 casts ``cast(x, fmt) -> values in x's dtype`` (outside the contract), each
#: rejected by QT-11's cast law (properties/quantization/test_quantization_fp8.py).
FP8_CAST_ZOO = {"fp8_cast_unsaturated": _cast_unsaturated, "fp8_e5m2_grid_as_e4m3": _cast_e5m2_grid,
                "fp8_double_rounding_via_float16": _cast_via_float16}
