"""Trend verdicts from repeated paired ratios (benchmarks/timing.py): the geometric mean with a
t interval on the logs, and holds / fails / inconclusive against the claim's mark."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from inference_conformance.benchmarks.timing import RatioEstimate, paired_ratios, ratio_estimate, trend_fields
from inference_conformance.conformance import fields

SEEDS = 400


def _ratios(true_ratio, spread, n, seed, heavy=False):
    """``n`` synthetic paired ratios: the true ratio times multiplicative noise (log-normal, or
    Student-t with 5 degrees of freedom on the logs: a loaded machine's heavier tails)."""
    rng = np.random.default_rng(seed)
    noise = rng.standard_t(5, n) * spread / math.sqrt(5 / 3) if heavy else rng.normal(0.0, spread, n)
    return true_ratio * np.exp(noise)


@pytest.mark.parametrize("n,heavy", [(5, False), (12, False), (12, True)])
@pytest.mark.parametrize("level", [0.9, 0.95])
def test_the_interval_covers_the_true_ratio_at_its_level(n, heavy, level):
    """Over many seeds the interval misses the true ratio about (1 - level) of the time: no more
    often than a binomial bound at one in a thousand allows (nor implausibly seldom)."""
    true = 4.46
    misses = 0
    for seed in range(SEEDS):
        est = ratio_estimate(_ratios(true, 0.2, n, seed, heavy), level=level)
        misses += not (est.low <= true <= est.high)
    assert misses <= stats.binom.ppf(0.999, SEEDS, 1 - level), misses
    assert misses >= stats.binom.ppf(0.001, SEEDS, 1 - level) * (0.5 if heavy else 1), misses


def test_the_estimate_is_the_geometric_mean():
    est = ratio_estimate([2.0, 8.0])
    assert est.estimate == pytest.approx(4.0) and est.pairs == 2 and est.low < 4.0 < est.high


def test_clearly_above_holds_clearly_below_fails_straddling_is_inconclusive():
    above = ratio_estimate(_ratios(8.0, 0.1, 10, 0))
    below = ratio_estimate(_ratios(2.0, 0.1, 10, 0))
    straddling = ratio_estimate(_ratios(4.0, 0.3, 10, 0))
    assert straddling.low < 4.0 < straddling.high
    assert above.verdict(">", 4.0) == "holds" and above.verdict("<", 4.0) == "fails"
    assert below.verdict(">", 4.0) == "fails" and below.verdict("<", 4.0) == "holds"
    assert straddling.verdict(">", 4.0) == straddling.verdict("<", 4.0) == "inconclusive"


def test_a_noisy_machine_gives_inconclusive_not_a_flipped_verdict():
    """The same true ratio (just above the mark) measured on a quiet and a loaded machine: the
    verdict may move from holds to inconclusive, never to fails (at most the interval's error
    rate over seeds)."""
    fails = sum(ratio_estimate(_ratios(5.0, 0.6, 8, seed)).verdict(">", 4.0) == "fails" for seed in range(SEEDS))
    assert fails <= stats.binom.ppf(0.999, SEEDS, 0.025)
    quiet = [ratio_estimate(_ratios(5.0, 0.02, 8, seed)).verdict(">", 4.0) for seed in range(20)]
    assert set(quiet) == {"holds"}


def test_without_two_pairs_there_is_no_interval_and_no_verdict():
    one = ratio_estimate([9.0])
    assert (one.low, one.high, one.pairs) == (None, None, 1) and one.verdict(">", 4.0) == "inconclusive"
    same = ratio_estimate([3.0, 3.0, 3.0])
    assert same.low == same.high == pytest.approx(3.0) and same.verdict("<", 4.0) == "holds"


@pytest.mark.parametrize("bad", [[], [1.0, 0.0], [1.0, -2.0], [1.0, math.inf], [math.nan, 1.0]])
def test_ratios_must_be_positive_and_finite(bad):
    with pytest.raises(ValueError, match="positive and finite"):
        ratio_estimate(bad)


def test_a_side_must_be_stated():
    with pytest.raises(ValueError, match="side"):
        RatioEstimate(2.0, 1.0, 3.0, 5).verdict(">=", 1.0)


def test_trend_fields_are_declared_and_carry_the_interval():
    est = ratio_estimate(_ratios(2.0, 0.1, 10, 1))
    row = trend_fields(est, "<", 3, "about 2x")
    fields.check(row, where="test")
    assert row["trend"] == "holds" and row["holds"] is True and row["mark"] == 3 and row["pairs"] == 10
    assert row["ci_low"] < est.estimate < row["ci_high"] and "about 2x" in row["trend_rule"]
    wide = trend_fields(ratio_estimate(_ratios(3.0, 0.5, 4, 1)), "<", 3, "about 2x")
    assert wide["trend"] == "inconclusive" and wide["holds"] is None


def test_paired_ratios_alternate_the_order_and_return_one_ratio_per_pair():
    order = []
    ratios = paired_ratios(lambda: order.append("a"), lambda: order.append("b"), "cpu", 4)
    assert len(ratios) == 4 and all(r > 0 for r in ratios)
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b", "b", "a"]
