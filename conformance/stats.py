"""Statistical rules for sampling claims (speculative decoding, sampling engines).

A sampling claim ("the emitted tokens follow p exactly") is checked two ways: exact
enumeration where the outcome space is small (compute the emitted distribution and compare with
:mod:`inference_conformance.conformance.tolerance`), and calibrated goodness-of-fit tests on samples otherwise. Each
test here has a fixed false-alarm rate ``alpha`` (the probability that a correct sampler is
rejected), stated in the verdict's rule; under the ``ci`` Hypothesis profile seeds are fixed,
so a run is reproducible. ``tests/test_stats.py`` measures the false-alarm rate over many seeds
and the power against a known-bad sampler (a negative control).
"""
from __future__ import annotations

import functools

import numpy as np

from inference_conformance.conformance.tolerance import Comparison, report_verdict

DEFAULT_ALPHA = 1e-3
MIN_EXPECTED = 5.0
#: bins of expected count below this make GTest take its critical value by Monte Carlo
CHI2_TRUSTED = 20.0
MC_EXCEEDANCES, MC_BUDGET = 50, 20_000_000


def _merge_small_bins(observed: np.ndarray, expected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pool the bins whose expected count is below MIN_EXPECTED into one (chi-square validity)."""
    small = expected < MIN_EXPECTED
    if small.sum() <= 1:
        return observed, expected
    obs = np.append(observed[~small], observed[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    return obs, exp


def check_distribution(samples, probs, *, alpha: float = DEFAULT_ALPHA, what: str = "samples") -> Comparison:
    """Chi-square goodness of fit of integer ``samples`` (n,) against ``probs`` (V,).

    Rejects with probability ``alpha`` when the sampler is correct. A sample outside the support
    of ``probs`` (probability 0) is an immediate failure. Raises ValueError for probabilities that
    are negative or do not sum to 1 (within 1e-6), or fewer than 20 samples.
    """
    samples = np.asarray(samples).reshape(-1).astype(np.int64)
    p = np.asarray(probs, dtype=np.float64).reshape(-1)
    if (p < 0).any() or abs(p.sum() - 1.0) > 1e-6:
        raise ValueError(f"probs must be a distribution (non-negative, sum 1), got sum {p.sum():.6g}")
    if samples.size < 20:
        raise ValueError(f"need at least 20 samples for a goodness-of-fit test, got {samples.size}")
    if samples.min() < 0 or samples.max() >= p.size:
        return report_verdict(Comparison(False, "statistical", float("inf"), 0.0, what,
                               f"sample outside [0, {p.size})"))
    observed = np.bincount(samples, minlength=p.size).astype(np.float64)
    impossible = observed[p == 0].sum()
    if impossible:
        return report_verdict(Comparison(False, "statistical: zero-probability outcomes never occur", float(impossible),
                               0.0, what, f"{int(impossible)} samples hit zero-probability outcomes"))
    support = p > 0
    obs, exp = _merge_small_bins(observed[support], p[support] * samples.size)
    if obs.size < 2:
        return report_verdict(Comparison(True, "statistical: single outcome", 0.0, 0.0, what))
    from scipy import stats as sps  # here, not at import: benchmark processes import this module

    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = obs.size - 1
    critical = float(sps.chi2.ppf(1 - alpha, dof))
    pvalue = float(sps.chi2.sf(stat, dof))
    rule = (f"statistical: chi-square({dof}) statistic <= {critical:.4g} (false-alarm rate alpha={alpha:g}, "
            f"n={samples.size}, p-value {pvalue:.3g})")
    return report_verdict(Comparison(stat <= critical, rule, stat, critical, what))


def assert_distribution(samples, probs, *, alpha: float = DEFAULT_ALPHA, what: str = "samples") -> Comparison:
    return check_distribution(samples, probs, alpha=alpha, what=what).check()


def total_variation(p, q) -> float:
    """Total-variation distance ½·Σ|p − q| between two distributions (for exact enumeration)."""
    return 0.5 * float(np.abs(np.asarray(p, np.float64) - np.asarray(q, np.float64)).sum())


def _g_statistic(obs: np.ndarray, expected: np.ndarray, n: float) -> np.ndarray:
    """G = 2 Σ O ln(O / E) per row of (m, bins) ``obs`` (E: ``expected`` scaled to each row's total)."""
    exp = expected * (obs.sum(1, keepdims=True) / n)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(obs > 0, obs * np.log(obs / exp), 0.0)
    return 2.0 * terms.sum(1)


@functools.lru_cache(maxsize=64)
def _mc_critical(expected: bytes, n: int, alpha: float, draws: int) -> float:
    """The (1 - alpha) quantile of G over ``draws`` exact multinomial(n, expected / n) draws,
    seeded by (n, bins, alpha) so that a run is reproducible (cached: a pure function)."""
    e = np.frombuffer(expected, dtype=np.float64)
    rng = np.random.default_rng([n, e.size, int(round(1 / alpha))])
    sim = rng.multinomial(n, e / e.sum(), size=draws).astype(np.float64)
    return float(np.quantile(_g_statistic(sim, e, n), 1 - alpha, method="higher"))


class GTest:
    """The G-test (log-likelihood ratio) of :func:`check_counts` at one (``probs``, ``n``,
    ``alpha``), vectorised over many count vectors: the same bins, statistic and critical value,
    so that its false-alarm rate and power can be measured on exact multinomial draws
    (:func:`multinomial_counts`).

    Categories of probability 0 are "impossible": any count there rejects. The others are binned:
    a category of expected count >= MIN_EXPECTED is its own bin; the rest share one pooled bin
    (chi-square validity), kept apart however small its expected count (an observation in a
    pooled bin of expected count 1e-8 is as good as impossible, and the bin only adds a degree of
    freedom: conservative).
    """

    def __init__(self, probs, n: int, alpha: float = DEFAULT_ALPHA):
        p = np.asarray(probs, dtype=np.float64).reshape(-1)
        if (p < 0).any() or abs(p.sum() - 1.0) > 1e-6:
            raise ValueError(f"probs must be a distribution (non-negative, sum 1), got sum {p.sum():.6g}")
        if n < 20:
            raise ValueError(f"need at least 20 observations for a goodness-of-fit test, got {n:g}")
        from scipy import stats as sps  # here, not at import: benchmark processes import this module

        self.n, self.alpha = n, alpha
        self.support = p > 0
        self.expected_all = np.where(self.support, p / p[self.support].sum() * n, 0.0)
        small = self.support & (self.expected_all < MIN_EXPECTED)
        own = self.support & ~small
        #: bin of each category (-1: impossible); the pooled small bin, if any, last
        self.bin = np.full(p.size, -1, dtype=np.int64)
        self.bin[own] = np.arange(int(own.sum()))
        if small.any():
            self.bin[small] = int(own.sum())
        self.bins = int(self.bin.max()) + 1
        self.expected = np.bincount(self.bin[self.support], weights=self.expected_all[self.support],
                                    minlength=self.bins)
        self.dof = self.bins - 1
        self.critical = float(sps.chi2.ppf(1 - alpha, self.dof)) if self.dof > 0 else float("inf")
        #: "chi-square" (the asymptotic critical value) or "Monte Carlo (D draws)"
        self.calibration = "chi-square"
        if self.dof > 0 and self.expected.min() < CHI2_TRUSTED:
            self._monte_carlo()

    def _monte_carlo(self) -> None:
        """Where some bin's expected count is below CHI2_TRUSTED the chi-square approximation of
        G's null distribution is anti-conservative (many bins of expected 5-20: the SD-1
        end-to-end test's 119 bins rejected 2.0e-3 of 200,000 exact draws at alpha = 1e-3): take
        the critical value from G's exact null distribution instead, the (1 - alpha) quantile of
        G over ``MC_EXCEEDANCES / alpha`` multinomial(n, binned probabilities) draws (binned
        counts of a multinomial are multinomial; seeded by (n, bins, alpha): reproducible), never
        below the asymptotic one. Skipped (asymptotic kept) where the draws would exceed
        MC_BUDGET numbers."""
        draws = int(np.ceil(MC_EXCEEDANCES / self.alpha))
        if draws * self.bins > MC_BUDGET:
            return
        self.critical = max(self.critical, _mc_critical(self.expected.tobytes(), int(self.n), self.alpha, draws))
        self.calibration = f"Monte Carlo ({draws} draws)"

    def _g(self, obs: np.ndarray) -> np.ndarray:
        return _g_statistic(obs, self.expected, self.n)
    def binned(self, counts: np.ndarray) -> np.ndarray:
        """(m, k) category counts -> (m, bins) binned counts."""
        counts = np.asarray(counts, dtype=np.float64)
        out = np.zeros((counts.shape[0], self.bins))
        np.add.at(out.T, self.bin[self.support], counts[:, self.support].T)
        return out

    def statistics(self, counts) -> np.ndarray:
        """G = 2 Σ O ln(O / E) over the bins, (m,) for (m, k) counts; +inf where an impossible
        category has a count."""
        counts = np.atleast_2d(np.asarray(counts, dtype=np.float64))
        g = self._g(self.binned(counts))
        return np.where(counts[:, ~self.support].sum(1) > 0, np.inf, g)

    def rejects(self, counts) -> np.ndarray:
        """(m,) bool: the G-test rejects each of (m, k) counts at ``alpha``."""
        return self.statistics(counts) > self.critical


def check_counts(observed, probs, *, alpha: float = DEFAULT_ALPHA, what: str = "counts") -> Comparison:
    """G-test (log-likelihood ratio) of category ``observed`` counts (k,) against ``probs`` (k,).

    Rejects with probability ``alpha`` when the counts are multinomial(n, probs) (bins with
    expected count below MIN_EXPECTED are pooled; where a bin's expected count is below
    CHI2_TRUSTED the critical value comes from G's exact null distribution by Monte Carlo:
    :class:`GTest`; its false-alarm rate
    at the sizes the laws use is measured on exact multinomial draws by ``tests/test_stats.py``).
    A count in a category of probability 0 is an immediate failure. Raises ValueError for
    probabilities that are negative or do not sum to 1 (within 1e-6), mismatched sizes, or fewer
    than 20 observations.
    """
    obs_all = np.asarray(observed, dtype=np.float64).reshape(-1)
    p = np.asarray(probs, dtype=np.float64).reshape(-1)
    if obs_all.shape != p.shape:
        raise ValueError(f"observed has {obs_all.size} categories, probs {p.size}")
    n = obs_all.sum()
    test = GTest(p, n, alpha)
    impossible = obs_all[~test.support].sum()
    if impossible:
        k = int(np.flatnonzero(~test.support & (obs_all > 0))[0])
        return report_verdict(Comparison(False, "statistical: zero-probability outcomes never occur", float(impossible),
                               0.0, what, f"{int(impossible)} observations in zero-probability categories "
                               f"(e.g. outcome {k}: observed {int(obs_all[k])} vs expected 0)"))
    exp_all = test.expected_all
    z = np.where(test.support, np.abs(obs_all - exp_all) / np.sqrt(np.maximum(exp_all, 1e-300)), 0.0)
    worst = int(np.argmax(z))
    if test.dof < 1:
        return report_verdict(Comparison(True, "statistical: single outcome", 0.0, 0.0, what))
    from scipy import stats as sps  # here, not at import: benchmark processes import this module

    stat = float(test.statistics(obs_all[None])[0])
    critical, dof = test.critical, test.dof
    pvalue = float(sps.chi2.sf(stat, dof))
    rule = (f"statistical: G-test({dof}) statistic <= {critical:.4g} (false-alarm rate alpha={alpha:g}, "
            f"n={int(n)}, critical value by {test.calibration}, asymptotic p-value {pvalue:.3g})")
    detail = (f"G = {stat:.4g} {'<=' if stat <= critical else '>'} critical value {critical:.4g} "
              f"(dof {dof}, alpha {alpha:g}); most discrepant outcome {worst}: observed "
              f"{int(obs_all[worst])} vs expected {exp_all[worst]:.1f}")
    return report_verdict(Comparison(stat <= critical, rule, stat, critical, what, detail))


def multinomial_counts(probs, n: int, draws: int, rng: np.random.Generator) -> np.ndarray:
    """(draws, k) exact multinomial(n, probs) count vectors (what a correct sampler's counts are)."""
    p = np.asarray(probs, dtype=np.float64).reshape(-1)
    return rng.multinomial(n, p / p.sum(), size=draws)


def upper_bound(k: int, m: int, confidence: float = 0.999) -> float:
    """One-sided Clopper-Pearson upper confidence bound of a binomial proportion k / m."""
    from scipy import stats as sps

    return 1.0 if k >= m else float(sps.beta.ppf(confidence, k + 1, m - k))
