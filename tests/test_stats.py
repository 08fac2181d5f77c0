"""The statistical rule: calibrated false-alarm rate and power against a known-bad sampler."""
import numpy as np
import pytest
from scipy import stats as sps

from inference_conformance.conformance import stats

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


# ------------------------------------------ the G-test's false-alarm rate, on exact draws
#: Draws per calibration, and the level the measured count is judged at: a count of false
#: alarms above binom.ppf(1 - CAL_LEVEL, CAL_DRAWS, alpha) refutes "the rate is at most alpha".
#: Power of that check against a rate of 2 alpha at alpha = 0.01: binom.sf(limit, 5000, 0.02),
#: about 0.99 (computed in test_g_test_calibration_can_fail).
CAL_DRAWS, CAL_LEVEL, CAL_ALPHA = 5000, 1e-3, 0.01


def _sd1_count_tests():
    """(label, probs, n) of every G-test the statistical SD-1 law makes (its pairs' four outcome
    distributions at their rounds) and of the extreme-ratio law's corrections (4000 rounds)."""
    from inference_conformance.properties.speculative.cases import OUTCOMES, STAT_CONFIGS, STAT_SIZES
    from inference_conformance.reference.speculative import outcome_probabilities

    out = []
    for name, pq in STAT_CONFIGS.items():
        exact = outcome_probabilities(pq.q, pq.p)
        out += [(f"{name}: {k}", exact[k], STAT_SIZES[name]) for k in OUTCOMES]
    return out + [("extreme ratios: corrections", np.array([0.0, 0.0, 0.5, 0.5]), 4000)]


def _false_alarms(probs, n, alpha, seed, critical_alpha=None):
    test = stats.GTest(probs, n, alpha if critical_alpha is None else critical_alpha)
    counts = stats.multinomial_counts(probs, n, CAL_DRAWS, np.random.default_rng(seed))
    return int(test.rejects(counts).sum()), test


@pytest.mark.parametrize("case", range(len(_sd1_count_tests())), ids=[c[0] for c in _sd1_count_tests()])
def test_g_test_false_alarm_rate_is_calibrated(case):
    """check_counts's G-test (pooled small bins) at every size SD-1 uses: on 5000 exact
    multinomial draws its false alarms at alpha = 0.01 do not exceed the binomial(5000, 0.01)
    upper tail at 1e-3, i.e. the rate is at most alpha within sampling error."""
    label, probs, n = _sd1_count_tests()[case]
    k, test = _false_alarms(probs, n, CAL_ALPHA, seed=case)
    limit = sps.binom.ppf(1 - CAL_LEVEL, CAL_DRAWS, CAL_ALPHA)
    assert k <= limit, (f"{label}: {k}/{CAL_DRAWS} false alarms at alpha {CAL_ALPHA} (limit {limit:g}; "
                        f"{test.bins} bins, 99.9% upper bound of the rate {stats.upper_bound(k, CAL_DRAWS):.4f})")


def test_g_test_calibration_can_fail():
    """The calibration rejects a G-test whose stated alpha is half its real one (the critical
    value of 2 alpha), on the largest table SD-1 uses; its power there, binom.sf(limit, 5000,
    2 alpha), is at least 0.99."""
    label, probs, n = max(_sd1_count_tests(), key=lambda c: c[1].size)
    limit = sps.binom.ppf(1 - CAL_LEVEL, CAL_DRAWS, CAL_ALPHA)
    assert sps.binom.sf(limit, CAL_DRAWS, 2 * CAL_ALPHA) >= 0.99
    k, _ = _false_alarms(probs, n, CAL_ALPHA, seed=99, critical_alpha=2 * CAL_ALPHA)
    assert k > limit, f"{label}: a G-test at 2 alpha passed the calibration ({k} <= {limit:g})"


def test_g_test_agrees_with_scipy():
    """GTest's statistic equals scipy's power_divergence (log-likelihood) on the pooled bins."""
    p = np.array([0.5, 0.3, 0.1, 1e-4, 2e-4, 0.0997, 0.0])
    counts = stats.multinomial_counts(p, 300, 5, np.random.default_rng(1))
    test = stats.GTest(p, 300)
    for c, g in zip(counts, test.statistics(counts)):
        b = test.binned(c[None])[0]
        assert g == pytest.approx(sps.power_divergence(b, test.expected, lambda_="log-likelihood").statistic, rel=1e-12)
    assert test.bins == 5 and test.dof == 4        # the two bins below 5 expected pooled


def test_g_test_monte_carlo_critical_value_on_the_end_to_end_table():
    """The SD-1 end-to-end test's table (the target's first two tokens after <bos>, 3000
    generations: 119 bins, many of expected 5-20, where the chi-square approximation of G is
    anti-conservative): on 60,000 exact multinomial draws (another seed than the critical
    value's own) the G-test's false alarms at alpha = 1e-3 stay within the binomial(60000, 1e-3)
    upper tail at 1e-3, and the asymptotic critical value fails that same check (2e-3 measured
    on 200,000 draws), so the check can fail."""
    import torch

    from inference_conformance.properties.speculative.cases import first_two_token_distribution
    from inference_conformance.smallworld.checkpoints import load_model
    from inference_conformance.smallworld.tokenizer import tokenizer

    exact = first_two_token_distribution(load_model("target", torch.float64), tokenizer().bos_id)
    test = stats.GTest(exact / exact.sum(), 3000, 1e-3)
    assert test.calibration.startswith("Monte Carlo"), test.calibration
    draws = 60_000
    binned = np.random.default_rng(2024).multinomial(3000, test.expected / test.expected.sum(), size=draws)
    g = test._g(binned.astype(np.float64))
    limit = sps.binom.ppf(1 - CAL_LEVEL, draws, 1e-3)
    asymptotic = float(sps.chi2.ppf(1 - 1e-3, test.dof))
    k, k_asym = int((g > test.critical).sum()), int((g > asymptotic).sum())
    assert k <= limit, f"{k}/{draws} false alarms at alpha 1e-3 (limit {limit:g}, critical {test.critical:.4g})"
    assert k_asym > limit, f"the asymptotic critical value {asymptotic:.4g} passed: {k_asym} <= {limit:g}"
