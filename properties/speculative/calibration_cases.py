"""The calibration of SD-1's statistical law (``properties/speculative/test_speculative.py``): the exact
round distribution of a correct or slightly biased verifier (:func:`verifier_outcomes`,
:data:`SUBTLE_BIASES`), and the whole law run on exact multinomial draws of it
(:func:`law_rejections`): its false-alarm rate on a correct verifier against the binomial limit
(:func:`sd1_law_false_alarms`, :func:`law_limit`) and its power against each subtle bias. The
law's inputs and checks are in ``properties/speculative/cases.py``.
"""
from __future__ import annotations

import numpy as np

from inference_conformance.conformance import results
from inference_conformance.conformance.stats import GTest, multinomial_counts, upper_bound
from inference_conformance.properties.speculative.cases import ALPHA, OUTCOMES, STAT_CONFIGS, STAT_SIZES
from inference_conformance.reference.speculative import outcome_probabilities


#: The biases of the zoo's verifiers that only the G-tests can see (same support as a correct
#: verifier, so no outcome is impossible): their :func:`verifier_outcomes` parameters.
SUBTLE_BIASES = {"acceptance_times_097": dict(accept_scale=0.97),
                 "residual_toward_q": dict(residual_mix=0.03),
                 "bonus_from_q": dict(bonus_mix=0.03)}


def _mix_on_support(w: np.ndarray, toward: np.ndarray, m: float) -> np.ndarray:
    """(1 − m)·norm(w) + m·norm(toward restricted to w's support); w itself when that is empty."""
    w = w / w.sum()
    t = toward * (w > 0)
    return w if m == 0 or t.sum() <= 0 else (1 - m) * w + m * t / t.sum()


def verifier_outcomes(q_rows, p_rows, *, accept_scale: float = 1.0, residual_mix: float = 0.0,
                      bonus_mix: float = 0.0) -> dict[tuple[int, ...], float]:
    """Exact distribution of one round's emitted tokens for a verifier that accepts x with
    probability ``accept_scale``·min(1, p(x)/q(x)), draws a correction from the residual
    norm(max(0, p − q)) (p where that is 0) mixed a fraction ``residual_mix`` toward q on the
    residual's support, and the bonus from p[γ] mixed a fraction ``bonus_mix`` toward q[γ−1] on
    p[γ]'s support. The defaults are the correct verifier (:func:`inference_conformance.reference.speculative.round_outcomes`
    computes the same by walking every path; this is the closed form for position-independent
    rows: Π_{i<k} q_i(x_i)·a_i(x_i) times the last token's probability)."""
    q = np.asarray(q_rows, dtype=np.float64)
    p = np.asarray(p_rows, dtype=np.float64)
    gamma, V = q.shape
    with np.errstate(divide="ignore", invalid="ignore"):
        accept = np.where(q > 0, q * accept_scale * np.minimum(1.0, p[:gamma] / q), 0.0)     # (γ, V)
    last = []
    for i in range(gamma):
        resid = np.maximum(p[i] - q[i], 0.0)
        resid = _mix_on_support(resid if resid.sum() > 0 else p[i], q[i], residual_mix)
        last.append((1.0 - accept[i].sum()) * resid)
    last.append(_mix_on_support(p[gamma], q[gamma - 1], bonus_mix))
    out: dict[tuple[int, ...], float] = {}
    prefix = np.ones(())
    for k in range(gamma + 1):
        full = np.multiply.outer(prefix, last[k])
        for idx in zip(*np.nonzero(full)):
            out[tuple(int(i) for i in idx)] = float(full[idx])
        if k < gamma:
            prefix = np.multiply.outer(prefix, accept[k])
    return out


def _category_maps(outcomes: dict, V: int, gamma: int) -> dict[str, np.ndarray]:
    """For each of :data:`OUTCOMES`, the category (as :func:`outcome_counts` counts it) of each
    emitted sequence of ``outcomes`` (in its iteration order)."""
    seqs = list(outcomes)
    return {"first": np.array([s[0] for s in seqs]),
            "first_two": np.array([s[0] if len(s) == 1 else V + s[0] * V + s[1] for s in seqs]),
            "num_accepted": np.array([len(s) - 1 for s in seqs]),
            "accepted_last": np.array([(len(s) - 1) * V + s[-1] for s in seqs])}


def marginals(outcomes: dict, V: int, gamma: int) -> dict[str, np.ndarray]:
    """The four outcome distributions of :func:`inference_conformance.reference.speculative.outcome_probabilities`
    from a distribution of emitted sequences."""
    sizes = {"first": V, "first_two": V + V * V, "num_accepted": gamma + 1, "accepted_last": (gamma + 1) * V}
    w = np.array(list(outcomes.values()))
    return {k: np.bincount(c, weights=w, minlength=sizes[k]) for k, c in _category_maps(outcomes, V, gamma).items()}


def law_rejections(draws: int, seed: int, alpha: float = ALPHA, sizes: dict | None = None,
                   **bias) -> tuple[int, dict[str, int]]:
    """The statistical SD-1 law (:func:`sd1_law_verdicts`: every pair of :data:`STAT_CONFIGS` at
    its rounds, or the pairs and rounds of ``sizes``, four G-tests each at α / (4 × pairs)) run
    ``draws`` times on exact multinomial
    draws of the rounds of a verifier with ``bias`` (:func:`verifier_outcomes`; none: a correct
    one). A correct verifier's counts are exactly such draws, so this is the law's false-alarm
    rate (no bias) or its power (a bias), not an estimate from one implementation. Returns
    (draws on which the law rejected, {"pair: outcome": draws that test rejected})."""
    rng = np.random.default_rng(seed)
    any_reject = np.zeros(draws, dtype=bool)
    per_check: dict[str, int] = {}
    sizes = STAT_SIZES if sizes is None else sizes
    for name, pq in STAT_CONFIGS.items():
        if name not in sizes:
            continue
        exact = outcome_probabilities(pq.q, pq.p)
        dist = verifier_outcomes(pq.q, pq.p, **bias)
        maps = _category_maps(dist, pq.V, pq.gamma)
        seq_counts = multinomial_counts(np.array(list(dist.values())), sizes[name], draws, rng)
        for k in OUTCOMES:
            counts = np.zeros((draws, exact[k].size))
            np.add.at(counts.T, maps[k], seq_counts.T)
            test = GTest(exact[k], sizes[name], alpha / len(OUTCOMES) / len(sizes))
            rejected = test.rejects(counts)
            per_check[f"{name}: {k}"] = int(rejected.sum())
            any_reject |= rejected
    return int(any_reject.sum()), per_check


def law_limit(draws: int) -> int:
    """The most false alarms of the law in ``draws`` runs at rate ALPHA (binomial tail 1e-3)."""
    from scipy import stats as sps

    return int(sps.binom.ppf(1 - 1e-3, draws, ALPHA))


def sd1_law_false_alarms(draws: int, seed: int = 0):
    """The statistical SD-1 law's false alarms on ``draws`` exact multinomial draws of a correct
    verifier's rounds, recorded with the limit and the calibration's power against a law whose
    real rate is 1e-2; returns (false alarms, limit)."""
    from scipy import stats as sps

    k, _ = law_rejections(draws, seed)
    limit = law_limit(draws)
    power = float(sps.binom.sf(limit, draws, 1e-2))
    results.record("SD-1", measured=k / draws, bound=ALPHA,
                   unit="false-alarm rate of the statistical law (exact multinomial draws of a correct verifier)",
                   rule=f"{draws} draws of every pair's rounds {STAT_SIZES}; false alarms <= {limit} "
                        f"(binomial tail 1e-3 at rate {ALPHA:g}); power against a rate of 1e-2: {power:.3f}",
                   what=f"99.9% upper bound of the rate {upper_bound(k, draws):.2g}",
                   false_alarms=k, runs=draws, power=power)
    return k, limit
