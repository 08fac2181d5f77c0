"""Laws of the FP8 cast (claim QT-11; lecture 001 §5.4, OCP OFP8 v1.0), over every registered
implementation of the ``fp8_cast`` contract (``conformance/contracts/fp8_cast.py``) in every input
dtype:

- the grid law: finite values in range become the float64 round-to-nearest-even grid value of
  x's exact value (ties, values around each power of two, within a float16 or float32 half step of
  a midpoint, subnormals and their ties, -0.0), within half an ulp;
- the range law: a value that rounds past F, and ±inf, become ±F with saturate=True, NaN (E4M3fn)
  or ±inf (E5M2) with saturate=False; NaN stays NaN.

Both compare every element exactly (rule exact, sign bits included); their zoo tests are in
``test_fp8_cast_rejections.py``.
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.conformance import results
from inference_conformance.properties.fp8_cast.cases import QT11_GRID, QT11_RANGE, CastCase, call, check_cast

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _record(run) -> None:
    results.record("QT-11", measured=0, bound=0, unit="cast elements off the float64 reference",
                   rule="exact (round to nearest even on the FP8 grid, saturation / overflow per OFP8)",
                   what=f"{run.implementation}: {run.ran} cases")


test_qt11_cast_rounds_to_nearest_even = QT11_GRID.conformance_test(
    "test_qt11_cast_rounds_to_nearest_even", after=_record)
test_qt11_cast_saturates_or_overflows = QT11_RANGE.conformance_test(
    "test_qt11_cast_saturates_or_overflows", after=_record)


@pytest.mark.claim("QT-11")
@pytest.mark.suite_own("the suite's pinned examples reach every boundary class")
def test_qt11_cast_coverage_table():
    """The boundary classes the pinned examples of both laws reach (every profile runs them)."""
    QT11_GRID.record_pinned_coverage("every grid class of the contract is reached in every Hypothesis profile")
    QT11_RANGE.record_pinned_coverage("every range class of the contract is reached in every Hypothesis profile")


@pytest.mark.technique("fp8_cast")
@pytest.mark.claim("QT-11")
@pytest.mark.parametrize("format", ["e4m3fn", "e5m2"])
def test_qt11_cast_of_every_code(impl, device, format):
    """Every finite value of the format, cast from float32, comes back as itself (both signs,
    -0.0 and every subnormal included): 2 x 126 (E4M3fn) / 2 x 123 (E5M2) values."""
    from inference_conformance.conformance.contracts.fp8_cast import fp8_dtype

    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fp8_dtype(format)).float()
    x = codes[torch.isfinite(codes)].to(device)
    case = CastCase(format, True, ())
    check_cast(call(impl, x, case), x, case, what="every finite FP8 value cast to itself")


@pytest.mark.technique("fp8_cast")
@pytest.mark.claim("QT-11")
def test_qt11_cast_empty_and_zero_dim(impl, device):
    """An empty x and a 0-d x keep their shapes."""
    for x in (torch.zeros(0, 3, device=device), torch.tensor(-2.0 ** -20, device=device)):
        case = CastCase("e4m3fn", False, ())
        check_cast(call(impl, x, case), x, case, what=f"the cast of a {tuple(x.shape)} x")
