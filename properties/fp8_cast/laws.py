"""Laws of the FP8 cast (claim QT-11; lecture 001 §5.4, OCP OFP8 v1.0), over every registered
implementation of the ``fp8_cast`` contract (``conformance/contracts/fp8_cast.py``) in every input
dtype (the cases, the call and the comparison are in ``cases.py``):

- the grid law: finite values in range become the float64 round-to-nearest-even grid value of
  x's exact value (ties, values around each power of two, within a float16 or float32 half step of
  a midpoint, subnormals and their ties, -0.0), within half an ulp;
- the range law: a value that rounds past F, and ±inf, become ±F with saturate=True, NaN (E4M3fn)
  or ±inf (E5M2) with saturate=False; NaN stays NaN.

Both compare every element exactly (rule exact, sign bits included). Their zoo tests reject every
known-bad FP8 cast (``zoo.py``) by the same comparison: double rounding through float16 or
bfloat16, subnormals flushed to zero, truncation, ties away from zero and E5M2's grid for E4M3fn by
the grid law in float32; double rounding through float32 by the grid law in float64; a cast that
never saturates or always saturates by the range law.
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.conformance import results
from inference_conformance.conformance.contracts.fp8_cast import COVERAGE, GRID_KINDS, RANGE_KINDS
from inference_conformance.conformance.laws import Kills, Law
from inference_conformance.properties import strategies
from inference_conformance.properties.fp8_cast.cases import (
    GRID_EXAMPLES,
    RANGE_EXAMPLES,
    call,
    cast_cases,
    check_cast,
    make_x,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _law(run, device, dtype, case, seed):
    x = make_x(case, seed, dtype, device)
    check_cast(call(run.impl, x, case, run=run), x, case)


def law_rounds_to_nearest_even(run, device, dtype, case, seed):
    """QT-11's cast of finite values in range: every element the float64 round-to-nearest-even
    grid value of x's exact value (ties to even, subnormals kept, -0.0 kept), within half an ulp,
    in torch's 8-bit dtype of the format."""
    _law(run, device, dtype, case, seed)


def law_saturates_or_overflows(run, device, dtype, case, seed):
    """QT-11's cast beyond the range: a value that rounds past F, and ±inf, become ±F with
    saturate=True, NaN (E4M3fn) or ±inf (E5M2) with saturate=False; NaN stays NaN; the values in
    range beside them as the grid law says."""
    _law(run, device, dtype, case, seed)


def _record(run) -> None:
    results.record("QT-11", measured=0, bound=0, unit="cast elements off the float64 reference",
                   rule="exact (round to nearest even on the FP8 grid, saturation / overflow per OFP8)",
                   what=f"{run.implementation}: {run.ran} cases")


#: Known-bad casts (properties/fp8_cast/zoo.py) each law rejects, by input dtype.
ZOO_GRID = ("double_rounding_via_float16", "double_rounding_via_bfloat16", "subnormals_flushed_to_zero",
            "truncation_toward_zero", "ties_away_from_zero", "e5m2_grid_for_e4m3fn")
ZOO_GRID_FLOAT64 = ("double_rounding_via_float32",)
ZOO_RANGE = ("never_saturates", "always_saturates")

QT11_GRID = Law(
    claim="QT-11", technique="fp8_cast", body=law_rounds_to_nearest_even,
    given={"case": cast_cases(GRID_KINDS), "seed": strategies.seeds},
    examples=tuple(dict(case=c, seed=i) for i, c in enumerate(GRID_EXAMPLES)),
    dtypes=strategies.FLOAT_DTYPES,
    kills=(Kills(ZOO_GRID, (torch.float32,)),
           Kills(ZOO_GRID_FLOAT64, (torch.float64,), doc="A float64 x rounded to float32 first is caught by "
                                                         "values within a float32 half step of a midpoint.")),
    coverage=COVERAGE, max_examples=lambda n: min(n, 50),
    test="test_qt11_cast_rounds_to_nearest_even", after=_record,
    zoo_tests=("test_qt11_cast_grid_zoo_rejected", "test_qt11_cast_grid_zoo_rejected_float64"))

QT11_RANGE = Law(
    claim="QT-11", technique="fp8_cast", body=law_saturates_or_overflows,
    given={"case": cast_cases({**RANGE_KINDS, "near_f": ""}), "seed": strategies.seeds},
    examples=tuple(dict(case=c, seed=i) for i, c in enumerate(RANGE_EXAMPLES)),
    dtypes=strategies.FLOAT_DTYPES,
    kills=(Kills(ZOO_RANGE, (torch.float32,)),),
    coverage=COVERAGE, max_examples=lambda n: min(n, 50),
    test="test_qt11_cast_saturates_or_overflows", after=_record,
    zoo_tests=("test_qt11_cast_range_zoo_rejected",))
