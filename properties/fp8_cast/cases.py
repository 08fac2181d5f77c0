"""FP8 casts for the laws of QT-11 (``laws.py``): the
cases (a format, a mode, the kinds of values they hold, a layout), the values of each kind, the
call (a refusal becomes "unsupported", never a pass) and the comparison with the float64
reference; the laws are in ``laws.py``.

The values are built in float64 where a cast goes wrong, then cast to the law's input dtype (the
reference reads the value the implementation was handed): ties between neighbouring grid values,
values within one grid step above and below each power of two, values within a float16 half step
(and within a float32 half step) of a midpoint, where a cast that rounds twice goes the wrong way,
the subnormal range and its ties, values below half the smallest subnormal (zero, with x's sign),
-0.0, F and what rounds to it, the tie at F + half the top spacing (E4M3fn: down to F; E5M2: up,
past F) and beyond, ±inf, NaN.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from inference_conformance.conformance.contracts.fp8_cast import (
    FORMATS,
    GRID_KINDS,
    fp8_dtype,
)
from inference_conformance.conformance.contracts.quantization.fp8 import fp8_half_spacing, fp8_round
from inference_conformance.conformance.laws import refusal
from inference_conformance.conformance.tolerance import assert_exact, check_within


@dataclass(frozen=True)
class CastCase:
    """One cast: ``format`` ("e4m3fn" / "e5m2"), ``saturate``, ``kinds`` (a tuple of keys of the
    contract's GRID_KINDS / RANGE_KINDS: the values the case holds), ``layout`` ("flat": 1-D,
    "3d": (2, 2, n / 4), "transposed": the transpose of a contiguous (4, n / 4))."""

    format: str
    saturate: bool
    kinds: tuple
    layout: str = "flat"


def _top(f) -> float:
    """The spacing of the grid at F (the top binade's)."""
    return 2.0 ** (math.floor(math.log2(f.max)) - f.m)


def _both(v) -> torch.Tensor:
    t = torch.as_tensor(v, dtype=torch.float64).flatten()
    return torch.cat([t, -t])


def kind_values(fmt: str, kind: str, g: torch.Generator) -> torch.Tensor:
    """The float64 values of one kind (see the contract's GRID_KINDS and RANGE_KINDS) for the
    format ``fmt``; ``g`` draws the random ones."""
    f = FORMATS[fmt]
    sub, top = f.subnormal_step, _top(f)
    e = torch.arange(f.emin, math.floor(math.log2(f.max)) + 1, dtype=torch.float64)
    base, step = torch.exp2(e), torch.exp2(e - f.m)
    if kind == "random":
        lo, hi = math.log2(sub) - 2, math.log2(f.max)
        mag = torch.exp2(torch.rand(64, generator=g, dtype=torch.float64) * (hi - lo) + lo)
        return mag * torch.where(torch.rand(64, generator=g) < 0.5, -1.0, 1.0).double()
    if kind == "above_power_of_two":
        return _both(torch.stack([base + step / 4, base + step / 2, base + 3 * step / 4, base + step]))
    if kind == "below_power_of_two":
        b, s = base[1:], step[:-1]                                       # 2^e and the binade below's step
        return _both(torch.stack([b - s / 4, b - s / 2, b - 3 * s / 4]))
    if kind == "ties":
        grid = fp8_round(kind_values(fmt, "random", g), f.name)
        mid = grid + torch.sign(grid) * fp8_half_spacing(grid, f.name)    # halfway to the next value away from 0
        return mid[(mid.abs() < f.max) & (grid != 0)]
    if kind == "double_rounding":
        # round to nearest: up (down); rounded first to float16 (float32), onto the midpoint, whose tie
        # goes down (up) to the even neighbour
        out = []
        for ulp in (torch.exp2(e - 12), torch.exp2(e - 30)):            # float16's / float32's half step is 2^(e-11) / 2^(e-24)
            out += [base * (1 + 2.0 ** -(f.m + 1)) + ulp, base * (1 + 3 * 2.0 ** -(f.m + 1)) - ulp]
        return _both(torch.stack(out))
    if kind == "subnormal":
        k = torch.arange(1, 2 ** (f.m + 1) + 1, dtype=torch.float64)    # every grid point and midpoint up to 2^emin
        return _both(torch.cat([k * sub / 2, torch.tensor([sub / 4, sub / 2 * (1 + 2.0 ** -10), 3 * sub / 4])]))
    if kind == "signed_zero":
        return torch.tensor([0.0, -0.0, -sub / 4, -sub / 2, -sub * 0.3], dtype=torch.float64)
    if kind == "near_f":
        return _both([f.max, f.max - top / 2, f.max - top / 4, f.max + top / 4, f.max + top / 2 - top / 64])
    if kind == "beyond_f":
        return _both([f.max + top / 2, f.max + top / 2 + top / 64, f.max + top, 2 * f.max, 1e6, 1e30])
    if kind == "inf":
        return torch.tensor([math.inf, -math.inf], dtype=torch.float64)
    if kind == "nan":
        return torch.tensor([math.nan], dtype=torch.float64)
    raise ValueError(f"unknown kind {kind!r}")


def make_x(case: CastCase, seed: int, dtype: torch.dtype, device) -> torch.Tensor:
    """The case's x: every kind's values (drawn ones from ``seed``), padded to a multiple of 4
    with 1.0, in ``dtype`` on ``device``, laid out as ``case.layout``."""
    g = torch.Generator().manual_seed(seed)
    v = torch.cat([kind_values(case.format, k, g) for k in case.kinds])
    v = torch.cat([v, torch.ones((-len(v)) % 4, dtype=torch.float64)]).to(dtype)
    if case.layout == "3d":
        return v.reshape(2, 2, -1).to(device)
    if case.layout == "transposed":
        return v.reshape(4, -1).to(device).T
    return v.to(device)


def call(impl, x: torch.Tensor, case: CastCase, run=None) -> torch.Tensor:
    """impl.fp8_cast(x, format=, saturate=); inside a law (``run`` given) the case is observed
    and a NotImplementedError discards the example; outside one it ends the test as
    "unsupported"."""
    if run is not None:
        run.observe(case)
    with refusal(run, f"{getattr(impl, 'name', impl)} refuses {x.dtype} {case.format} saturate={case.saturate}"):
        return impl.fp8_cast(x, format=case.format, saturate=case.saturate)


def check_cast(y, x: torch.Tensor, case: CastCase, what: str = "the FP8 cast") -> None:
    """``y`` against the float64 reference of the same x: the contract's dtype, shape and device;
    every finite element whose rounded value is within ±F within half the grid spacing at x
    (rule "QT-11 half ulp"); then every element equal (rule exact: NaN where the reference's is
    NaN), and the sign bits of the non-NaN elements equal (-0.0 is not +0.0)."""
    from inference_conformance.reference.fp8_cast import fp8_cast as ref

    want_dtype = fp8_dtype(case.format)
    assert isinstance(y, torch.Tensor), f"fp8_cast returned {type(y).__name__}, not a torch.Tensor"
    assert y.dtype == want_dtype, f"fp8_cast returned {y.dtype}, the contract returns {want_dtype} for {case.format!r}"
    assert tuple(y.shape) == tuple(x.shape), f"output shape {tuple(y.shape)} != x's {tuple(x.shape)}"
    assert y.device == x.device, f"output on {y.device}, x on {x.device}"
    got = y.detach().cpu().double()
    x64 = x.detach().cpu().double()
    want = ref(x.detach().cpu(), format=case.format, saturate=case.saturate).double()
    f = FORMATS[case.format]
    inside = torch.isfinite(x64) & (fp8_round(x64, f.name).abs() <= f.max)
    label = f"{what} ({case.format}, saturate={case.saturate}, {x.dtype})"
    check_within(got[inside], x64[inside], fp8_half_spacing(x64[inside], f.name),
                 what=f"{label}: |y - x| in range", rule="QT-11 half ulp").check()
    assert_exact(got, want, what=f"{label} vs the float64 round-to-nearest-even grid")
    keep = ~torch.isnan(want)
    assert_exact(torch.signbit(got[keep]), torch.signbit(want[keep]), what=f"{label}: sign bits (-0.0 kept)")


LAYOUTS = ("flat", "3d", "transposed")


def cast_cases(kinds: dict) -> st.SearchStrategy[CastCase]:
    names = sorted(kinds)
    return st.builds(CastCase, st.sampled_from(sorted(FORMATS)), st.booleans(),
                     st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True).map(tuple),
                     st.sampled_from(LAYOUTS))


GRID_ALL = tuple(GRID_KINDS)
#: Pinned: each format, every grid kind, both modes, each layout.
GRID_EXAMPLES = (CastCase("e4m3fn", True, GRID_ALL, "flat"), CastCase("e5m2", False, GRID_ALL, "transposed"),
                 CastCase("e4m3fn", False, GRID_ALL, "3d"), CastCase("e5m2", True, GRID_ALL, "flat"))
#: Pinned: each format in each mode, every kind beyond the range beside a few in it.
RANGE_EXAMPLES = tuple(CastCase(fmt, sat, ("beyond_f", "inf", "nan", "near_f"), layout)
                       for fmt, sat, layout in (("e4m3fn", True, "flat"), ("e4m3fn", False, "transposed"),
                                                ("e5m2", True, "3d"), ("e5m2", False, "flat")))
