"""The trend claims AI-8, AI-9 and KV-3 are judged by rules (conformance/trends.py) that the
KV-cache benchmarks (benchmarks/bench_kv_cache.py) apply to measured paired ratios. Each test
feeds the claim's own rule synthetic paired ratios: with the trend (holds), without it or
reversed (fails), and scattered evenly around the mark (inconclusive: the interval straddles it).

The synthetic ratios are a true ratio times fixed multiplicative noise exp(±0.1..0.3): their
geometric mean is the true ratio and the interval lies symmetrically around it, so each case's
verdict follows from where the true ratio lies, not from a random draw.
"""
from __future__ import annotations

import math

import pytest

from inference_conformance.conformance import trends
from inference_conformance.properties.falsify import judges

#: Multiplicative noise of 12 paired measurements, symmetric on the log scale.
NOISE = [math.exp(s * e) for e in (0.1, 0.2, 0.3, 0.15, 0.25, 0.05) for s in (1, -1)]


def paired(true_ratio: float) -> list[float]:
    """12 synthetic paired ratios around ``true_ratio`` (geometric mean exactly ``true_ratio``)."""
    return [true_ratio * n for n in NOISE]


@pytest.mark.claim("AI-8")
def test_ai8_rejects_prefill_no_faster_than_decode():
    """256 one-token steps / one prefill: the lecture's 27x holds; a prefill that loops over the
    tokens (1x) and one slower than decode (0.5x) fail; a ratio at the mark is inconclusive."""
    rule = trends.AI8_PREFILL_VS_DECODE
    judges("AI-8", rule.judge, {"holds": (paired(27.0),), "fails": (paired(1.0),), "inconclusive": (paired(rule.mark),)})
    assert rule.judge(paired(0.5)) == "fails"


@pytest.mark.claim("KV-3")
def test_kv3_rejects_uncached_generation_that_is_linear():
    """Time ratio without the cache when the length doubles: quadratic-plus (5x) holds; a
    generation that does not recompute the prefix (2x, as if cached) fails."""
    rule = trends.KV3_DOUBLING_WITHOUT_CACHE
    judges("KV-3", rule.judge, {"holds": (paired(5.0),), "fails": (paired(2.0),), "inconclusive": (paired(rule.mark),)})


@pytest.mark.claim("KV-3")
def test_kv3_rejects_cached_generation_that_is_quadratic():
    """Time ratio with the cache when the length doubles: 2x holds; a cache that recomputes the
    prefix every step (4x) fails."""
    rule = trends.KV3_DOUBLING_WITH_CACHE
    judges("KV-3", rule.judge, {"holds": (paired(2.0),), "fails": (paired(4.0),), "inconclusive": (paired(rule.mark),)})


@pytest.mark.claim("AI-9")
def test_ai9_rejects_step_time_linear_in_batch():
    """Decode step time B=64 / B=1: memory-bound (1.5x) holds; a step that runs the sequences
    one by one (64x) fails."""
    rule = trends.AI9_STEP_GROWTH
    judges("AI-9", rule.judge, {"holds": (paired(1.5),), "fails": (paired(64.0),), "inconclusive": (paired(rule.mark),)})


@pytest.mark.claim("AI-9")
def test_ai9_rejects_throughput_still_rising():
    """Throughput B=256 / B=64: saturated (1.05x) holds; throughput still growing with the batch
    (3.5x of the 4x) fails."""
    rule = trends.AI9_SATURATION
    judges("AI-9", rule.judge, {"holds": (paired(1.05),), "fails": (paired(3.5),), "inconclusive": (paired(rule.mark),)})


def test_trend_rule_bad_arguments_raise():
    with pytest.raises(ValueError, match="side"):
        trends.TrendRule("AI-8", ">=", 5, "x")
    with pytest.raises(ValueError, match="mark"):
        trends.TrendRule("AI-8", ">", 0, "x")
    with pytest.raises(ValueError, match="ratios"):
        trends.AI8_PREFILL_VS_DECODE.judge([1.0, -2.0])
