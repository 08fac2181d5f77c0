"""The coverage table of QT-12's pinned examples (the laws are in ``laws.py``)."""
from __future__ import annotations

import pytest

from inference_conformance.properties.kv_format.laws import QT12_ATTENTION, QT12_BYTES, QT12_VALUES

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.claim("QT-12")
@pytest.mark.suite_own("the suite's pinned examples reach every boundary class")
def test_qt12_kv_format_coverage_table():
    """The boundary classes the pinned examples reach (every profile runs them)."""
    for law in (QT12_VALUES, QT12_ATTENTION, QT12_BYTES):
        law.record_pinned_coverage("every class of the kv_format contract is reached in every Hypothesis profile")
