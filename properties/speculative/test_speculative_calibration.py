"""The calibration of SD-1's statistical law (``properties/speculative/test_speculative.py``; lecture 002 §2):
the closed form of a round's distribution equals the reference's enumeration, the whole law's
family-wise false-alarm rate on exact multinomial draws is within ALPHA (and a law without
Bonferroni fails that check), its power against each subtle bias of the zoo is at least 0.9, and
each of those zoo verifiers emits the distribution its bias gives
(``properties/speculative/calibration_cases.py``).
"""
from __future__ import annotations

import pytest

from inference_conformance.conformance import results
from inference_conformance.conformance.stats import check_counts, upper_bound
from inference_conformance.properties.speculative.calibration_cases import (
    SUBTLE_BIASES,
    law_limit,
    law_rejections,
    marginals,
    sd1_law_false_alarms,
    verifier_outcomes,
)
from inference_conformance.properties.speculative.cases import (
    ALPHA,
    EXACT_BOUND,
    OUTCOMES,
    PINNED,
    STAT_CONFIGS,
    STAT_SIZES,
    outcome_counts,
    run_trials,
)
from inference_conformance.reference import speculative as ref

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.suite_own("the statistical law's own false-alarm rate and power (a calibration of the test, not of an "
                                    "implementation)")]


#: Exact multinomial draws of the whole law under ``ci`` (``benchmarks/speculative/bench_speculative.py``
#: makes 20,000): the false-alarm count is judged against binom.ppf(1 − 1e-3, draws, ALPHA).
LAW_DRAWS, POWER_DRAWS = 2000, 1000


@pytest.mark.claim("SD-1")
def test_verifier_outcomes_equal_the_enumeration():
    """The closed form of a round's distribution (speculative_cases.verifier_outcomes, unbiased)
    equals the reference's walk over every path, on the law's pairs and the pinned classes."""
    for pq in (*STAT_CONFIGS.values(), *PINNED):
        a, b = verifier_outcomes(pq.q, pq.p), ref.round_outcomes(pq.q, pq.p)
        err = max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))
        assert err <= EXACT_BOUND, f"{pq!r}: closed form vs enumeration differ by {err:.3g}"


@pytest.mark.claim("SD-1")
def test_sd1_law_false_alarm_rate_exact_draws():
    """The law's family-wise false-alarm rate is at most ALPHA = 1e-3: on 2000 exact draws
    (ci; 20,000 in the report) its false alarms do not exceed binom.ppf(0.999, 2000, 1e-3) = 8.
    That check rejects a law whose real rate is 1e-2 with probability 0.998."""
    k, limit = sd1_law_false_alarms(LAW_DRAWS)
    assert k <= limit, f"{k} false alarms in {LAW_DRAWS} exact draws (limit {limit})"


def test_sd1_law_calibration_rejects_a_law_without_bonferroni():
    """The calibration can fail: the same law with every G-test at ALPHA (no division over the
    24 tests, a family-wise rate near 1e-2) exceeds the limit on the same draws."""
    k, _ = law_rejections(LAW_DRAWS, 0, alpha=ALPHA * len(OUTCOMES) * len(STAT_CONFIGS))
    assert k > law_limit(LAW_DRAWS), f"a law without Bonferroni passed the calibration ({k} false alarms)"


@pytest.mark.claim("SD-1")
@pytest.mark.parametrize("bias", sorted(SUBTLE_BIASES))
def test_sd1_law_power_against_subtle_biases(bias):
    """The law's power against each known-bad verifier of a few percent bias (the zoo's
    acceptance x 0.97, residual mixed 3% toward q, bonus from q 3%), on 1000 exact draws of its
    rounds: at least 0.9 with 99.9% confidence (Clopper-Pearson lower bound), each check's
    rejection rate recorded."""
    k, per_check = law_rejections(POWER_DRAWS, 1, **SUBTLE_BIASES[bias])
    lower = 1 - upper_bound(POWER_DRAWS - k, POWER_DRAWS)
    strong = {c: round(n / POWER_DRAWS, 3) for c, n in sorted(per_check.items(), key=lambda x: -x[1])[:4] if n}
    results.record("SD-1", measured=k / POWER_DRAWS, bound=0.9, unit=f"power of the statistical law against {bias}",
                   rule=f"{POWER_DRAWS} exact draws of the biased rounds, rounds per pair {STAT_SIZES}; "
                        f"99.9% lower bound {lower:.3f} >= 0.9", what=f"strongest checks {strong}",
                   power=k / POWER_DRAWS, power_runs=POWER_DRAWS, draft=bias)
    assert lower >= 0.9, f"power against {bias}: {k}/{POWER_DRAWS} (lower bound {lower:.3f})"


@pytest.mark.parametrize("bias", sorted(SUBTLE_BIASES))
def test_subtle_zoo_entries_follow_their_enumeration(bias):
    """Each of those zoo verifiers emits the distribution verifier_outcomes gives for its bias
    (G-tests at 1e-3 on every pair), so the power stated above is that entry's power."""
    from inference_conformance.conformance import registry

    impl = {i.name: i for i in registry.zoo("speculative")}[bias]
    for name, pq in STAT_CONFIGS.items():
        tokens, n = run_trials(impl, pq, STAT_SIZES[name], seed=5, device="cpu")
        counts = outcome_counts(tokens, n, pq.V, pq.gamma)
        exact = marginals(verifier_outcomes(pq.q, pq.p, **SUBTLE_BIASES[bias]), pq.V, pq.gamma)
        for k in OUTCOMES:
            check_counts(counts[k], exact[k], alpha=ALPHA / len(OUTCOMES) / len(STAT_CONFIGS),
                         what=f"{bias} on {name}: {k} vs its own enumerated distribution").check()
