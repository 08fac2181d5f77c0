"""Laws of the KV-cache formats (claim QT-12; lecture 001 §5.4, KIVI), over every registered
implementation of the ``kv_format`` contract (``conformance/contracts/kv_format.py``):

- every value of dequantize_kv(quantize_kv(k, v)) within its step (the contract's kv_bound: per
  token and head, per channel over a group for KIVI keys, half an ulp for FP8), on contents that
  break a wrong granularity (a loud head, channel or token, FP8 magnitudes past 448 and below its
  normals), in float64 and float32;
- attention over the cache, each query seeing it as decode holds it, within attention_bound;
- the bytes held, measured from the stored tensors, within the format's size (float32, bfloat16).

The zoo tests are in ``test_kv_format_rejections.py``.
"""
from __future__ import annotations

import pytest

from inference_conformance.properties.kv_format.cases import QT12_ATTENTION, QT12_BYTES, QT12_VALUES

pytestmark = pytest.mark.usefixtures("one_torch_thread")

test_qt12_every_value_within_its_step = QT12_VALUES.conformance_test("test_qt12_every_value_within_its_step")
test_qt12_attention_within_its_bound = QT12_ATTENTION.conformance_test("test_qt12_attention_within_its_bound")
test_qt12_bytes_held_within_the_format = QT12_BYTES.conformance_test("test_qt12_bytes_held_within_the_format")


@pytest.mark.claim("QT-12")
@pytest.mark.suite_own("the suite's pinned examples reach every boundary class")
def test_qt12_kv_format_coverage_table():
    """The boundary classes the pinned examples reach (every profile runs them)."""
    for law in (QT12_VALUES, QT12_ATTENTION, QT12_BYTES):
        law.record_pinned_coverage("every class of the kv_format contract is reached in every Hypothesis profile")
