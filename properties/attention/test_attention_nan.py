"""The NaN rule's own oracle (the law is in ``laws.py``, its cases in ``nan_cases.py``)."""
from __future__ import annotations

from inference_conformance.properties.attention.nan_cases import CASES, expected_nan


def test_the_expected_nan_elements_follow_the_mask():
    """The rule's own oracle on two cases worked by hand."""
    last_key = expected_nan(CASES[0])
    assert last_key[1, :2, 4].all() and not last_key[1, :2, :4].any() and not last_key[0].any()
    assert not last_key[1, 2:].any()                  # KV head 0 feeds query heads 0 and 1 only
    value = expected_nan(CASES[2])
    assert value[1, 2:, 4:, 5].all() and value.sum() == 2 * 2
