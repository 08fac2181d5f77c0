"""A worked outside implementation of the ``fp8_cast`` contract, written from its docs page
(docs/fp8_cast.md) without the suite's code except its argument checks: the exact value of x in
float64, its binade by frexp, round half to even on that binade's step, then saturation or
OFP8's overflow. ``fp8_cast`` conforms; ``wrong_fp8_cast`` rounds ties away from zero (the usual
hand-written floor(|x| / step + 0.5)), a bug QT-11's grid law rejects at the first tie whose
lower neighbour is the even one.

    PYTHONPATH=examples pytest properties/fp8_cast --impl fp8_cast=my_fp8_cast:fp8_cast
"""
from __future__ import annotations

import torch

from inference_conformance.conformance.contracts.fp8_cast import validate

#: format -> (mantissa bits, exponent of the smallest normal, largest finite value, torch dtype)
_FORMATS = {"e4m3fn": (3, -6, 448.0, torch.float8_e4m3fn), "e5m2": (2, -14, 57344.0, torch.float8_e5m2)}


def _cast(x, format, saturate, ties_to_even: bool):
    validate(x, format, saturate)
    m, emin, top, dtype = _FORMATS[format]
    v = x.detach().to(torch.float64)                        # exact for every input dtype
    finite = torch.isfinite(v)
    a = torch.where(finite, v.abs(), 0.0)
    _, e = torch.frexp(a)                                   # a = f * 2^e, f in [0.5, 1)
    step = torch.ldexp(torch.ones_like(a), (torch.clamp(e - 1, min=emin) - m).to(torch.int32))
    q = a / step                                            # exact: a power-of-two division
    n = torch.round(q) if ties_to_even else torch.floor(q + 0.5)
    y = torch.copysign(n * step, v)                         # the sign kept, -0.0 included
    y = torch.where(finite, y, v)                           # inf and NaN go on as they are
    past = y.abs() > top
    if saturate:
        y = torch.where(past, torch.copysign(torch.full_like(y, top), v), y)
    else:
        over = float("nan") if format == "e4m3fn" else float("inf")
        y = torch.where(past, torch.copysign(torch.full_like(y, over), v), y)
    return y.to(dtype)                                      # on the grid: stored exactly


def fp8_cast(x, *, format, saturate):
    """The contract's cast: round to nearest, ties to even."""
    return _cast(x, format, saturate, ties_to_even=True)


def wrong_fp8_cast(x, *, format, saturate):
    """Ties away from zero instead of to even."""
    return _cast(x, format, saturate, ties_to_even=False)
