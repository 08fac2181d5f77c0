"""The ``fp8_cast`` contract: a tensor cast to an 8-bit floating-point format (claim QT-11; lecture
001 §5.4; Micikevicius et al. 2022, "FP8 Formats for Deep Learning"; the OCP 8-bit Floating
Point Specification (OFP8) v1.0).

    fp8_cast(x, *, format: str, saturate: bool) -> Tensor

- ``x``: a tensor of any shape (0-d, empty and non-contiguous included), dtype float64,
  float32, float16 or bfloat16, on the cpu or a cuda device.
- ``format``: ``"e4m3fn"`` (4 exponent bits, 3 mantissa bits, bias 7, no infinity: S.1111.111 is
  NaN; largest finite F = 448, smallest normal 2^-6, subnormal step 2^-9) or ``"e5m2"`` (IEEE-like:
  5 exponent bits, 2 mantissa bits, bias 15, ±inf; F = 57344, smallest normal 2^-14, subnormal
  step 2^-16).
- ``saturate``: what a value beyond the format's range becomes (below).

Returns a tensor of x's shape on x's device in torch's 8-bit dtype of the format
(``torch.float8_e4m3fn`` / ``torch.float8_e5m2``; the value, not a scaled code: there is no
scale). Each element y of the result is, for the element x:

- finite x: the grid value nearest to x's exact value, ties to the even mantissa, on the format's
  grid with its exponent range unbounded above (the spacing at |x| is 2^(max(e, emin) - m) for
  2^e <= |x| < 2^(e+1)); computed from x itself, never through an intermediate type (rounding x to
  float16, bfloat16 or float32 first and then to FP8 rounds twice and is wrong near midpoints:
  such a cast does not conform, float64 inputs included). Subnormals are kept, never flushed to
  zero; the sign is kept (-0.0 stays -0.0; a negative x that rounds to zero gives -0.0).
- a rounded value beyond F (|x| above F by half the top spacing or more, the tie going to the
  even neighbour: 464 rounds to 448 in E4M3fn, 61440 to 65536 in E5M2), and ±inf:
  with ``saturate=True`` ±F (the sign of x); with ``saturate=False`` what OFP8 says for the
  format: NaN for E4M3fn (it has no infinity), ±inf for E5M2.
- NaN: NaN (any NaN code).

An implementation may raise ``NotImplementedError`` for an input it does not support (a dtype, a
device, a format or a mode): the suite reports "unsupported", never a pass. Invalid arguments
raise, before anything is computed (:func:`validate`), ``TypeError`` (x not a tensor or of
another dtype, format not a string, saturate not a bool) or ``ValueError`` (an unknown format, x
on a device that is neither cpu nor cuda), naming the argument.

Tolerance: none: every element must equal the reference's (rule ``exact``, NaN where it has NaN
and the same sign bit at zero); a finite element in range is first held to QT-11's half ulp (half
the grid spacing at x, rule "QT-11 half ulp"), so that a failure also says by how much it is off.

Oracle: the float64 reference (``inference_conformance.reference.fp8_cast``): the grid of
:func:`inference_conformance.conformance.contracts.quantization.fp8.fp8_round` (every input dtype
is exact in float64), then the saturation or overflow above.

Claims checked against this contract: QT-11 (the cast rounds to nearest even on the FP8 grid,
saturates at ±F, and keeps every value within half an ulp). Sources: Micikevicius et al. 2022;
OCP OFP8 v1.0 (2023) §5 (conversions, saturation); lecture 001 §5.4.
"""
from __future__ import annotations

import torch

from inference_conformance.conformance.contracts.quantization.fp8 import FP8_FORMATS, FP8Format
from inference_conformance.conformance.coverage import CoverageClass
from inference_conformance.conformance.registry import Contract, InvalidCall

#: Input dtypes of the contract (an implementation may still refuse one with NotImplementedError).
DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
#: The contract's formats by name (one definition of each: ``quantization.fp8.FP8_FORMATS``).
FORMATS = {"e4m3fn": FP8_FORMATS["fp8_e4m3fn"], "e5m2": FP8_FORMATS["fp8_e5m2"]}


def fp8_dtype(format: str) -> torch.dtype:
    """torch's 8-bit dtype of a format name of :data:`FORMATS`."""
    return getattr(torch, FORMATS[format].torch_dtype)


def validate(x, format, saturate) -> FP8Format:
    """Check one call; return the format. Raises TypeError (x not a tensor or not one of
    :data:`DTYPES`, format not a str, saturate not a bool) or ValueError (format not "e4m3fn" or
    "e5m2", x on a device other than cpu or cuda), each naming the argument."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in DTYPES:
        raise TypeError(f"x must be float64, float32, float16 or bfloat16 for fp8_cast, got {x.dtype}")
    if x.device.type not in ("cpu", "cuda"):
        raise ValueError(f"x must be on a cpu or cuda device, got {x.device}")
    if not isinstance(format, str):
        raise TypeError(f"format must be a str ('e4m3fn' or 'e5m2'), got {type(format).__name__}")
    if format not in FORMATS:
        raise ValueError(f"format must be one of {list(FORMATS)}, got {format!r}")
    if not isinstance(saturate, bool):
        raise TypeError(f"saturate must be a bool, got {type(saturate).__name__}")
    return FORMATS[format]


def cases(seed: int, device: str) -> list[tuple[tuple, dict]]:
    """Small valid calls for the generic checks: each format and mode on finite values in range
    (float32 (3, 5), a transposed float64 (4, 6), bfloat16 1-D, a 0-d float16)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, (shape, dt, fmt, sat) in enumerate([((3, 5), torch.float32, "e4m3fn", True),
                                               ((6, 4), torch.float64, "e5m2", False),
                                               ((17,), torch.bfloat16, "e5m2", True),
                                               ((), torch.float16, "e4m3fn", False)]):
        x = (torch.randn(shape, generator=g, dtype=torch.float64) * 10).to(device=device, dtype=dt)
        out.append(((x.T if i == 1 else x,), {"format": fmt, "saturate": sat}))
    return out


def invalid(device: str) -> list[InvalidCall]:
    """The calls this contract documents as invalid (a float32 (4,) x, "e4m3fn", saturate True
    unless the call is about them), with the argument each message must name."""
    x = torch.tensor([0.5, -3.0, 100.0, 1e-3], device=device)
    ok = {"format": "e4m3fn", "saturate": True}
    calls = [  # (what, args, kwargs, raises, argument)
        ("x-a-list", (x.tolist(),), {}, TypeError, "x"),
        ("x-int32", (x.int(),), {}, TypeError, "x"),
        ("x-already-fp8", (x.to(torch.float8_e4m3fn),), {}, TypeError, "x"),
        ("x-on-meta", (x.to("meta"),), {}, ValueError, "x"),
        ("format-unknown", (x,), {"format": "e4m3"}, ValueError, "format"),
        ("format-a-dtype", (x,), {"format": torch.float8_e5m2}, TypeError, "format"),
        ("saturate-an-int", (x,), {"saturate": 1}, TypeError, "saturate"),
        ("saturate-a-string", (x,), {"saturate": "True"}, TypeError, "saturate"),
    ]
    return [InvalidCall(what, args, {**ok, **kw}, (exc,), argument) for what, args, kw, exc, argument in calls]


CONTRACT = Contract(
    technique="fp8_cast",
    functions=("fp8_cast",),
    doc=__doc__,
    cases=cases,
    returns={"fp8_cast": torch.Tensor},
    invalid=invalid,
)


# ----------------------------------------------------------------------------------------------
# coverage table: observations are the laws' cases (properties/fp8_cast/cases.py CastCase:
# format, saturate, kinds (the kinds of values the case holds), layout)
# ----------------------------------------------------------------------------------------------

#: The law of finite values in range and the law of values beyond the range.
GRID_LAW = ("law_rounds_to_nearest_even",)
RANGE_LAW = ("law_saturates_or_overflows",)

#: Kind of value -> what it is (the cases' ``kinds``; :func:`properties.fp8_cast.cases.values`).
GRID_KINDS = {
    "random": "log-uniform magnitudes over the whole range, both signs",
    "above_power_of_two": "within one grid step above a power of two (2^e < |x| < 2^e + step)",
    "below_power_of_two": "within one grid step below a power of two (the binade's top spacing)",
    "ties": "exact ties between two neighbouring grid values",
    "double_rounding": "within a float16 half step of a midpoint (a cast through float16 rounds the wrong way)",
    "subnormal": "the subnormal range, its ties and values below half the smallest subnormal",
    "signed_zero": "-0.0, +0.0 and negative values that round to -0.0",
    "near_f": "F, values just below F and between F and F + half the top spacing (round to F)",
}
RANGE_KINDS = {
    "beyond_f": "F + half the top spacing (the tie) and beyond, up to 1e30",
    "inf": "+inf and -inf",
    "nan": "NaN",
}


def _coverage() -> tuple:
    out = []
    for fmt in FORMATS:
        for kind, what in GRID_KINDS.items():
            out.append(CoverageClass(f"{fmt}: {what}", GRID_LAW,
                                     lambda c, fmt=fmt, kind=kind: c.format == fmt and kind in c.kinds))
        for sat in (True, False):
            for kind, what in RANGE_KINDS.items():
                out.append(CoverageClass(f"{fmt}, saturate={sat}: {what}", RANGE_LAW,
                                         lambda c, fmt=fmt, kind=kind, sat=sat: c.format == fmt and c.saturate == sat
                                         and kind in c.kinds))
    out.append(CoverageClass("a non-contiguous x (a transposed view)", GRID_LAW + RANGE_LAW,
                             lambda c: c.layout == "transposed"))
    out.append(CoverageClass("a 3-D x", GRID_LAW + RANGE_LAW, lambda c: c.layout == "3d"))
    return tuple(out)


#: The fp8_cast contract's coverage table (see :class:`CoverageClass`).
COVERAGE = _coverage()
