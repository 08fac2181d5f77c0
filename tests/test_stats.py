"""The statistical rule: calibrated false-alarm rate and power against a known-bad sampler."""
import numpy as np
import pytest
from scipy import stats as sps

from conformance import stats

P = np.array([0.5, 0.2, 0.15, 0.1, 0.04, 0.01, 0.0])


def test_false_alarm_rate_is_calibrated():
    alpha, runs = 0.05, 400
    rejections = sum(not stats.check_distribution(np.random.default_rng(s).choice(P.size, 2000, p=P), P,
                                                  alpha=alpha).ok for s in range(runs))
    # a binomial(400, 0.05) count exceeds 35 with probability < 1e-4
    assert rejections <= sps.binom.ppf(1 - 1e-4, runs, alpha), rejections


def test_power_against_a_biased_sampler():
    q = np.array([0.45, 0.25, 0.15, 0.1, 0.04, 0.01, 0.0])  # 5 points of mass moved
    rejections = sum(not stats.check_distribution(np.random.default_rng(s).choice(q.size, 5000, p=q), P).ok
                     for s in range(50))
    assert rejections >= 45, rejections


def test_zero_probability_outcome_fails_at_once():
    samples = np.random.default_rng(0).choice(P.size, 1000, p=P)
    samples[0] = 6
    v = stats.check_distribution(samples, P)
    assert not v.ok and "zero-probability" in v.detail


def test_bad_probabilities_raise():
    with pytest.raises(ValueError, match="distribution"):
        stats.check_distribution(np.zeros(100, int), [0.5, 0.6])
    with pytest.raises(ValueError, match="at least 20"):
        stats.check_distribution(np.zeros(5, int), [1.0])


def test_total_variation():
    assert stats.total_variation([1, 0], [0, 1]) == 1.0
    assert stats.total_variation(P, P) == 0.0
