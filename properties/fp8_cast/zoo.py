"""Known-bad FP8 casts (the bug zoo of the ``fp8_cast`` contract): each one a bug of the field's
casts, each rejected by a law of QT-11 (``properties/fp8_cast/cases.py``: the grid law or the
range law, by its own exact comparison with the float64 reference). All follow the contract's
signature and compute on x's float64 value except where the bug says otherwise, then store the
result as the reference does (:func:`inference_conformance.reference.fp8_cast.encode`: saturation
or overflow past F, torch's 8-bit dtype), so that only the bug makes them wrong.
"""
from __future__ import annotations

import torch

from inference_conformance.conformance.contracts.fp8_cast import FORMATS, validate
from inference_conformance.conformance.contracts.quantization.fp8 import fp8_half_spacing, fp8_round
from inference_conformance.reference.fp8_cast import encode


def _spacing(x64: torch.Tensor, fmt: str) -> torch.Tensor:
    return 2 * fp8_half_spacing(torch.nan_to_num(x64, nan=0.0, posinf=0.0, neginf=0.0), FORMATS[fmt].name)


def _cast_via(x, format, saturate, dtype):
    validate(x, format, saturate)
    return encode(fp8_round(x.to(dtype), FORMATS[format].name), format, saturate)


def double_rounding_via_float16(x, *, format, saturate):
    """x rounded to float16 first, then to the FP8 grid (a kernel staging its input in half
    precision): a value within half a float16 step of a midpoint lands on it and its tie goes to
    the even neighbour, the farther one."""
    return _cast_via(x, format, saturate, torch.float16)


def double_rounding_via_bfloat16(x, *, format, saturate):
    """x rounded to bfloat16 first, then to the FP8 grid: wrong within half a bfloat16 step of a
    midpoint."""
    return _cast_via(x, format, saturate, torch.bfloat16)


def double_rounding_via_float32(x, *, format, saturate):
    """x rounded to float32 first, then to the FP8 grid (a conversion defined on float only):
    right for every input but float64, wrong within half a float32 step of a midpoint there."""
    return _cast_via(x, format, saturate, torch.float32)


def subnormals_flushed_to_zero(x, *, format, saturate):
    """Values that round below the smallest normal 2^emin flushed to zero (with their sign), as a
    cast with flush-to-zero on does."""
    f = validate(x, format, saturate)
    y = fp8_round(x, f.name)
    return encode(torch.where(y.abs() < f.min_normal, torch.copysign(torch.zeros_like(y), y), y), format, saturate)


def truncation_toward_zero(x, *, format, saturate):
    """The mantissa's extra bits dropped (round toward zero) instead of round to nearest even:
    off by up to a whole grid step."""
    validate(x, format, saturate)
    x64 = x.detach().to(torch.float64)
    s = _spacing(x64, format)
    return encode(torch.where(torch.isfinite(x64), torch.trunc(x64 / s) * s, x64), format, saturate)


def ties_away_from_zero(x, *, format, saturate):
    """Round to nearest with ties away from zero (C's round(), the usual hand-written
    floor(|x| / step + 0.5)) instead of ties to even: within half an ulp, wrong at every tie whose
    lower neighbour is the even one."""
    validate(x, format, saturate)
    x64 = x.detach().to(torch.float64)
    s = _spacing(x64, format)
    y = torch.sign(x64) * torch.floor(x64.abs() / s + 0.5) * s
    return encode(torch.where(torch.isfinite(x64), torch.copysign(y, x64), x64), format, saturate)


def e5m2_grid_for_e4m3fn(x, *, format, saturate):
    """Rounds to E5M2's grid whichever format was asked (a kernel that picked the wrong float8
    dtype), stored as the asked format: errors up to 2^-3 relative for E4M3fn."""
    validate(x, format, saturate)
    return encode(fp8_round(x, "fp8_e5m2"), format, saturate)


def never_saturates(x, *, format, saturate):
    """``saturate`` ignored, always off: a value past F becomes NaN (E4M3fn) or inf (E5M2), as a
    cast with no clamp does."""
    f = validate(x, format, saturate)
    return encode(fp8_round(x, f.name), format, False)


def always_saturates(x, *, format, saturate):
    """``saturate`` ignored, always on: a value past F (and inf) becomes ±F where the format's
    non-saturating cast gives NaN (E4M3fn) or ±inf (E5M2)."""
    f = validate(x, format, saturate)
    return encode(fp8_round(x, f.name), format, True)


def implementations():
    """The known-bad FP8 casts: QT-11's laws name each in their ``kills``."""
    from inference_conformance.conformance.registry import known_bad

    return (
        known_bad("fp8_cast", "double_rounding_via_float16", double_rounding_via_float16),
        known_bad("fp8_cast", "double_rounding_via_bfloat16", double_rounding_via_bfloat16),
        known_bad("fp8_cast", "double_rounding_via_float32", double_rounding_via_float32),
        known_bad("fp8_cast", "subnormals_flushed_to_zero", subnormals_flushed_to_zero),
        known_bad("fp8_cast", "truncation_toward_zero", truncation_toward_zero),
        known_bad("fp8_cast", "ties_away_from_zero", ties_away_from_zero),
        known_bad("fp8_cast", "e5m2_grid_for_e4m3fn", e5m2_grid_for_e4m3fn),
        known_bad("fp8_cast", "never_saturates", never_saturates),
        known_bad("fp8_cast", "always_saturates", always_saturates),
    )
