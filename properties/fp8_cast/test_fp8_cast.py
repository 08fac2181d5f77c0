"""Tests of the FP8 cast beside its laws (``laws.py``): the coverage table of the laws' pinned
examples, every code of each format cast to itself, and empty and 0-d inputs.
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.properties.fp8_cast.cases import CastCase, call, check_cast
from inference_conformance.properties.fp8_cast.laws import QT11_GRID, QT11_RANGE

pytestmark = pytest.mark.usefixtures("one_torch_thread")


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
