"""FP8 number formats of the ``quantization`` contract (QT-11; lecture 001 §5.4, Micikevicius et
al. 2022): :class:`FP8Format` (E4M3fn, E5M2), the per-group scale s = max|w_group| / F
(:func:`fp8_step`) and the half-ulp bounds of a reconstructed element (:func:`fp8_half_spacing`,
:func:`fp8_value_bound`, :func:`fp8_bound`). The scheme's call, shapes and errors are in ``conformance/contracts/quantization/contract.py``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from inference_conformance.conformance.contracts.quantization.contract import SCALE_SLACK, validate_quantize


@dataclass(frozen=True)
class FP8Format:
    """One FP8 format: ``name``, mantissa bits ``m``, the exponent of its smallest normal value
    ``emin`` (normal values are 2^e (1 + f / 2^m), e >= emin), its largest finite value ``max``
    (saturation) and the name of torch's dtype holding it."""

    name: str
    m: int
    emin: int
    max: float
    torch_dtype: str

    @property
    def min_normal(self) -> float:
        """2^emin."""
        return 2.0 ** self.emin

    @property
    def subnormal_step(self) -> float:
        """The spacing of the values below 2^emin: 2^(emin - m)."""
        return 2.0 ** (self.emin - self.m)

    @property
    def half_ulp_rel(self) -> float:
        """Half a unit in the last place relative to the value, in the normal range: 2^-(m+1)."""
        return 2.0 ** -(self.m + 1)


#: The FP8 formats of QT-11: E4M3 without inf ("fn": 448 is the largest, S.1111.111 is NaN)
#: and E5M2 (IEEE-like, inf beyond 57344; the cast saturates instead).
FP8_FORMATS = {"fp8_e4m3fn": FP8Format("fp8_e4m3fn", 3, -6, 448.0, "float8_e4m3fn"),
               "fp8_e5m2": FP8Format("fp8_e5m2", 2, -14, 57344.0, "float8_e5m2")}
#: The number formats a scheme may name (``number_format``).
NUMBER_FORMATS = ("int",) + tuple(FP8_FORMATS)


def fp8_format(name) -> FP8Format:
    """The :class:`FP8Format` of ``name``; ValueError naming ``number_format`` otherwise."""
    if name not in FP8_FORMATS:
        raise ValueError(f"number_format must be one of {list(FP8_FORMATS)}, got {name!r}")
    return FP8_FORMATS[name]


def fp8_round(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """The one definition of the FP8 grid: x rounded to nearest, ties to even, on the format's
    grid with its exponent range unbounded above, float64 of x's shape, computed from x's exact
    value (no intermediate type). The spacing at |x| is 2^(max(e, emin) - m) for
    2^e <= |x| < 2^(e+1): the normal binades, then the subnormal step 2^(emin - m) below 2^emin
    (subnormals kept, never flushed); a result past F is left there (saturation or overflow is
    the caller's); the sign of x is kept (a negative x that rounds to zero gives -0.0); ±inf and
    NaN are returned as they are. Raises ValueError for an unknown format (``number_format``)."""
    f = fp8_format(fmt)
    x64 = x.detach().to(torch.float64)
    finite = torch.isfinite(x64)
    xs = torch.where(finite, x64, 0.0)
    _, e = torch.frexp(xs)                                  # |x| = m 2^e, m in [0.5, 1): leading bit 2^(e-1)
    exp = torch.clamp(e.to(torch.int64) - 1, min=f.emin)
    spacing = torch.ldexp(torch.ones_like(xs), (exp - f.m).to(torch.int32))
    y = torch.round(xs / spacing) * spacing                 # torch.round: half to even; x / spacing is exact
    return torch.where(finite, y, x64)


def fp8_step(w: torch.Tensor, fmt: str, granularity) -> torch.Tensor:
    """The scale s of each element's group for an FP8 scheme, (N, K) float64: s = max|w_group| / F,
    F the format's largest value (the group's largest |w| lands on F). Raises as validate_quantize."""
    f = fp8_format(fmt)
    shape = validate_quantize(w, 8, granularity)
    w64 = w.detach().to(torch.float64)
    groups = w64.reshape(1, 1, -1) if granularity == "tensor" else w64.reshape(shape.N, shape.groups_per_row, shape.group_size)
    s = groups.abs().amax(dim=-1) / f.max
    if granularity == "tensor":
        return s.reshape(1, 1).expand(shape.N, shape.K)
    return s.repeat_interleave(shape.group_size, dim=-1)


def fp8_half_spacing(y: torch.Tensor, fmt: str) -> torch.Tensor:
    """Half the format's grid spacing at |y| (y in units of the scale), float64 of y's shape:
    2^(max(e, emin) - m - 1) for 2^e <= |y| < 2^(e+1), half the subnormal step 2^(emin - m - 1)
    below 2^emin and at 0. The largest error of round to nearest at y (ties included)."""
    f = fp8_format(fmt)
    _, e = torch.frexp(y.detach().to(torch.float64).abs())           # |y| = m 2^e, m in [0.5, 1)
    return torch.ldexp(torch.ones(y.shape, dtype=torch.float64, device=y.device),
                       (torch.clamp(e.to(torch.int64) - 1, min=f.emin) - f.m - 1).to(torch.int32))


def fp8_value_bound(x: torch.Tensor, s: torch.Tensor, fmt: str) -> torch.Tensor:
    """QT-11's bound on |x - fp8(x / s) s| for |x| <= F s, float64 of x's shape: half the grid
    spacing at x / s times s (:func:`fp8_half_spacing`: half an ulp, 2^(e - m - 1) s in the
    binade 2^e <= |x| / s < 2^(e+1), half the subnormal step times s below 2^emin), with 2^-12 of
    slack for a scale stored rounded (the binade read at |x| (1 + 2^-12) / s). Not the looser
    2^-(m+1) |x|, which is up to twice the half step at the top of a binade: a cast rounding
    twice (through float16, say) stays within that one."""
    x64 = x.detach().to(torch.float64).abs()
    s64 = s.to(torch.float64)
    y = torch.where(s64 > 0, x64 * (1 + SCALE_SLACK) / torch.where(s64 > 0, s64, 1.0), 0.0)
    return fp8_half_spacing(y, fmt) * s64 * (1 + SCALE_SLACK)


def fp8_bound(w: torch.Tensor, fmt: str, granularity) -> torch.Tensor:
    """QT-11's per-element bound for an FP8 scheme's dequantize(quantize(w)), (N, K) float64:
    :func:`fp8_value_bound` at the group's scale plus the output dtype's rounding (half an ulp
    at |w| + the bound, half its subnormal spacing)."""
    s = fp8_step(w, fmt, granularity)
    b = fp8_value_bound(w, s, fmt)
    fin = torch.finfo(w.dtype)
    return b + fin.eps / 2 * (w.detach().abs().to(torch.float64) + b) + fin.tiny * fin.eps / 2
