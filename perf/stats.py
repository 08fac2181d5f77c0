"""The statistics of the benchmark machinery, in one place: the evidence for one benchmark (a
ratio, its interval and one-sided p-values) from the rounds of one run, from the between-run
model of a history series, from the run-speed prediction or from interleaved pairs; Holm's
family-wise adjustment; the threshold-and-significance rule that turns evidence into a decision
(:func:`decide`); and the calibration's measures (exact binomial rates, the slowdown a test
catches with a given power). The history gate (:mod:`inference_conformance.perf.gate`), the interleaved A/B mode
(:mod:`inference_conformance.perf.ab`) and the calibration (:mod:`inference_conformance.perf.calibration_analysis`) all judge through
these functions, so the three apply one rule.

scipy is imported inside the functions that need it: a benchmark process imports none of this.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

#: Bootstrap resamples of the rounds test's interval.
N_BOOT = 2000
#: Run-level (family-wise) significance level.
DEFAULT_ALPHA = 0.05
#: Fewest earlier runs for the between-run model; with fewer the gate falls back to the rounds.
MIN_HISTORY = 3
#: Fewest benchmarks common to the run and every entry of the window to normalise by the run's speed.
MIN_NORMALIZE = 4
#: A ratio beyond this fails whatever the Holm step, where the measured run-to-run spread is well
#: below it (:func:`hard_limit_applies`); never from one run's rounds, never on a spread that reaches it.
DEFAULT_HARD_LIMIT = 1.5
#: The hard limit applies where unchanged code would pass it less than once in this many runs
#: of one benchmark under its measured spread (Student's t with the spread's degrees of freedom).
HARD_LIMIT_RISK = 0.001
#: The exit codes of the gate: pass, regression, usage or input error, inconclusive (``--strict``).
EXIT_PASS, EXIT_REGRESSION, EXIT_INPUT, EXIT_INCONCLUSIVE = 0, 1, 2, 3


@dataclass
class Decision:
    name: str
    status: str  # regression | improvement | noisy | inconclusive | ungated | ok | new | missing
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    p_slower: float | None = None
    p_faster: float | None = None
    n_run: int = 0
    n_base: int = 0
    reason: str = ""
    basis: str = ""  # between-run | rounds | pairs


@dataclass
class Test:
    """One benchmark's evidence: the ratio (run / reference), its interval, one-sided p-values."""
    ratio: float
    ci_low: float
    ci_high: float
    p_slower: float
    p_faster: float
    n_run: int
    n_base: int
    basis: str  # "between-run" | "rounds" | "pairs"
    detail: str = ""
    spread: float | None = None  # the log ratio's measured standard error between runs (None: not measured)
    df: int | None = None  # its degrees of freedom


def hard_limit_applies(t: Test, hard_limit: float, risk: float = HARD_LIMIT_RISK) -> bool:
    """Whether the hard limit may fail ``t`` whatever its p-value: only where the run-to-run
    spread was measured (between runs or pairs, not one run's rounds) and is well below the
    limit: t_{1 - risk, df} * spread <= ln(hard_limit), so unchanged code passes the limit by
    chance in fewer than ``risk`` of its runs under the measured spread."""
    from scipy.stats import t as student

    if t.spread is None or not t.df or t.df < 1:
        return False
    return float(student.ppf(1 - risk, t.df)) * t.spread <= float(np.log(hard_limit))


def holm(pvalues, weights=None) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error control, any dependence).

    p_(i) sorted ascending, adjusted_(i) = max_{j <= i} min(1, (m - j + 1) p_(j)); reject where
    adjusted < alpha. With ``weights`` w_i > 0 (the weighted version of the same paper): order by
    p_i / w_i and adjusted_(i) = max_{j <= i} min(1, p_(j) (sum_{k >= j} w_(k)) / w_(j)), so a
    hypothesis of weight w gets the share w / sum(w) of alpha at the first step (equal weights:
    the plain method). Raises ValueError for a p-value outside [0, 1] or not finite, or a weight
    not finite and positive.
    Source: S. Holm, "A simple sequentially rejective multiple test procedure", Scand. J. Stat. 1979.
    """
    p = np.asarray(pvalues, dtype=float)
    if p.size and (not np.all(np.isfinite(p)) or np.any((p < 0) | (p > 1))):
        raise ValueError(f"p-values must be finite and in [0, 1], got {p.tolist()}")
    w = np.ones(p.size) if weights is None else np.asarray(weights, dtype=float)
    if w.shape != p.shape or (w.size and (not np.all(np.isfinite(w)) or np.any(w <= 0))):
        raise ValueError(f"weights must be finite, positive and one per p-value, got {w.tolist()}")
    order = np.argsort(p / w, kind="stable")
    remaining = np.cumsum(w[order][::-1])[::-1]  # sum of the weights from each step on
    adj = np.empty(p.size)
    running = 0.0
    for step, i in enumerate(order):
        running = max(running, min(1.0, p[i] * remaining[step] / w[i]))
        adj[i] = running
    return adj


def _positive(label: str, x: np.ndarray) -> None:
    if x.size == 0:
        raise ValueError(f"{label} samples are empty")
    if not np.all(np.isfinite(x)) or np.any(x <= 0):
        raise ValueError(f"{label} samples must be finite positive times")


def rounds_test(base, run, *, alpha: float = 0.05, seed: int = 0) -> Test:
    """Evidence from the rounds of one run against one baseline (seconds per call): median
    ratio, its (1 - alpha) bootstrap interval (each sample resampled, N_BOOT resamples, fixed
    seed), one-sided Mann-Whitney U p-values (1.0 with fewer than 2 samples a side).
    Raises ValueError when a sample list is empty or holds a non-positive or non-finite time."""
    from scipy.stats import mannwhitneyu

    b, r = np.asarray(base, dtype=float), np.asarray(run, dtype=float)
    _positive("base", b)
    _positive("run", r)
    ratio = float(np.median(r) / np.median(b))
    rng = np.random.default_rng(seed)
    rb = np.median(b[rng.integers(0, b.size, (N_BOOT, b.size))], axis=1)
    rr = np.median(r[rng.integers(0, r.size, (N_BOOT, r.size))], axis=1)
    lo, hi = (float(v) for v in np.quantile(rr / rb, [alpha / 2, 1 - alpha / 2]))
    if b.size >= 2 and r.size >= 2:
        p_slow = float(mannwhitneyu(r, b, alternative="greater").pvalue)
        p_fast = float(mannwhitneyu(r, b, alternative="less").pvalue)
    else:
        p_slow = p_fast = 1.0
    return Test(ratio, lo, hi, p_slow, p_fast, int(r.size), int(b.size), "rounds",
                f"{r.size} vs {b.size} rounds")


def history_test(run_median: float, history_medians, *, alpha: float = 0.05, relative: str = "") -> Test:
    """Evidence from the between-run model: the run's median against the medians of n >= 2
    earlier runs of the series (seconds, or any positive quantity such as a median relative to
    the run's speed), on the log scale, Student's t prediction interval with n - 1 degrees of
    freedom (see the module docstring); ``relative`` names what the medians are relative to,
    for the message.
    Raises ValueError with fewer than 2 history medians or a non-positive time."""
    from scipy.stats import t as student

    h = np.asarray(history_medians, dtype=float)
    _positive("history", h)
    _positive("run", np.asarray([run_median], dtype=float))
    if h.size < 2:
        raise ValueError(f"history_medians needs at least 2 runs, got {h.size}")
    lh = np.log(h)
    mu, sd, n = float(lh.mean()), float(lh.std(ddof=1)), int(h.size)
    diff = float(np.log(run_median)) - mu
    se = max(sd, 1e-12) * np.sqrt(1 + 1 / n)
    tstat = diff / se
    q = float(student.ppf(1 - alpha / 2, n - 1))
    return Test(float(np.exp(diff)), float(np.exp(diff - q * se)), float(np.exp(diff + q * se)),
                float(student.sf(tstat, n - 1)), float(student.cdf(tstat, n - 1)), 1, n, "between-run",
                f"vs the geometric mean of {n} earlier runs{relative}, between-run sd {sd:.1%}", float(se), n - 1)


@dataclass
class RunSpeed:
    """Each run's speed and, per benchmark, its log medians beside the speed of the same run
    estimated from the *other* benchmarks (see :func:`normalize_by_run_speed`)."""
    names: list[str]
    y_hist: dict[str, np.ndarray]  # ln(median) per history entry
    f_hist: dict[str, np.ndarray]  # the entry's speed from the other benchmarks (log, centred)
    y_run: dict[str, float]
    f_run: dict[str, float]
    speed_run: float  # exp(median shift of all the run's benchmarks)
    speed_history: list[float]

    def fit(self, name: str) -> tuple[float, float, float, float, float]:
        """Least squares of y on f over the history: (intercept, slope, residual sd, mean f, Sff)."""
        y, f = self.y_hist[name], self.f_hist[name]
        fm, sff = float(f.mean()), float(((f - f.mean()) ** 2).sum())
        slope = float(((f - fm) * (y - y.mean())).sum() / sff) if sff > 0 else 0.0
        icpt = float(y.mean()) - slope * fm
        resid = y - (icpt + slope * f)
        return icpt, slope, float(np.sqrt((resid ** 2).sum() / max(y.size - 2, 1))), fm, sff


def normalize_by_run_speed(run_medians: dict[str, float], history_medians: list[dict[str, float]],
                           min_benchmarks: int = MIN_NORMALIZE) -> RunSpeed | None:
    """Each run's speed, for judging the run's benchmarks by what that speed predicts
    (:func:`speed_test`): None when fewer than ``min_benchmarks`` benchmarks are in the run and
    in every history entry, or fewer than 4 entries (the fit needs n - 2 >= 2 degrees of freedom).

    With m_hk the ln(median) of benchmark k in history entry h, c_k = mean_h m_hk and e_hk =
    m_hk - c_k (the run: x_k, e_k = x_k - c_k), the speed of entry h as benchmark j sees it is
    f_hj = median_{k != j} e_hk (the run: f_j = median_{k != j} e_k): the shift that the run's
    other benchmarks share (the machine's speed in that run: clocks, load, memory layout), which
    one regressed benchmark barely moves. ``speed_run`` / ``speed_history`` are exp(median_k
    e_k) per run: the run's speed itself, judged as one more member of the family
    (:data:`inference_conformance.perf.gate_rule.RUN_SPEED`), so a change that slows every benchmark alike still fails the gate."""
    names = [n for n in run_medians if all(n in h for h in history_medians)]
    if len(names) < min_benchmarks or len(history_medians) < 4:
        return None
    hist = np.log([[h[n] for n in names] for h in history_medians])  # (entries, benchmarks)
    x = np.log([run_medians[n] for n in names])  # (benchmarks,)
    center = hist.mean(axis=0)
    e_hist, e_run = hist - center, x - center
    y_hist, f_hist, y_run, f_run = {}, {}, {}, {}
    for j, n in enumerate(names):
        others = [k for k in range(len(names)) if k != j]
        y_hist[n], f_hist[n] = hist[:, j], np.median(e_hist[:, others], axis=1)
        y_run[n], f_run[n] = float(x[j]), float(np.median(e_run[others]))
    return RunSpeed(names, y_hist, f_hist, y_run, f_run, float(np.exp(np.median(e_run))),
                    np.exp(np.median(e_hist, axis=1)).tolist())


def speed_test(sp: RunSpeed, name: str, *, alpha: float = 0.05) -> Test:
    """Evidence for benchmark ``name`` from the run's speed: over the n history entries, the
    least-squares line ln(median) = a + b f (f: the entry's speed from its other benchmarks);
    the run's ln(median) x against the line's prediction at the run's speed f_r: r = exp(x - a -
    b f_r), Student's t prediction interval with n - 2 degrees of freedom, se = s sqrt(1 + 1/n +
    (f_r - mean f)^2 / Sff). The slope is measured, not assumed: b near 1 for a benchmark that
    follows the machine's speed (the shared shift cancels), near 0 for one that does not (the
    raw between-run model, one degree of freedom less)."""
    from scipy.stats import t as student

    icpt, slope, sd, fm, sff = sp.fit(name)
    n = sp.y_hist[name].size
    diff = sp.y_run[name] - (icpt + slope * sp.f_run[name])
    lever = (sp.f_run[name] - fm) ** 2 / sff if sff > 0 else 0.0
    se = max(sd, 1e-12) * np.sqrt(1 + 1 / n + lever)
    tstat, q = diff / se, float(student.ppf(1 - alpha / 2, n - 2))
    raw_sd = float(sp.y_hist[name].std(ddof=1))
    return Test(float(np.exp(diff)), float(np.exp(diff - q * se)), float(np.exp(diff + q * se)),
                float(student.sf(tstat, n - 2)), float(student.cdf(tstat, n - 2)), 1, n, "between-run",
                f"vs the prediction of {n} earlier runs from this run's speed (median of the other "
                f"{len(sp.names) - 1} benchmarks, slope {slope:.2f}), residual sd {sd:.1%} (raw {raw_sd:.1%})",
                float(se), n - 2)


def log_ratio_test(log_ratios, *, alpha: float = 0.05, label: str = "pairs") -> Test:
    """Evidence from k >= 2 paired log ratios ln(B / A) (interleaved A/B passes): r =
    exp(mean), Student's t interval and one-sided one-sample t-test p-values, k - 1 degrees of
    freedom. Raises ValueError with fewer than 2 ratios or a non-finite one."""
    from scipy.stats import t as student

    d = np.asarray(log_ratios, dtype=float)
    if d.size < 2 or not np.all(np.isfinite(d)):
        raise ValueError(f"log_ratios needs at least 2 finite values, got {d.tolist()}")
    k, mean, sd = int(d.size), float(d.mean()), float(d.std(ddof=1))
    se = max(sd, 1e-12) / np.sqrt(k)
    tstat = mean / se
    q = float(student.ppf(1 - alpha / 2, k - 1))
    return Test(float(np.exp(mean)), float(np.exp(mean - q * se)), float(np.exp(mean + q * se)),
                float(student.sf(tstat, k - 1)), float(student.cdf(tstat, k - 1)), k, k, label,
                f"{k} interleaved pairs, sd of the paired log ratios {sd:.3f}", float(se), k - 1)


def decide(name: str, t: Test, p_slow: float, p_fast: float, *, threshold: float, alpha: float,
           family: int = 1, hard_limit: float | None = None) -> Decision:
    """The threshold-and-significance rule on one benchmark's evidence ``t``, with its
    (Holm-adjusted, when ``family`` > 1) p-values; a ratio beyond ``hard_limit`` is a
    regression whatever its p-value where the measured spread is well below the limit
    (:func:`hard_limit_applies`)."""
    d = Decision(name, "ok", t.ratio, t.ci_low, t.ci_high, p_slow, p_fast, t.n_run, t.n_base, basis=t.basis)
    pct = f"{(t.ratio - 1) * 100:+.1f}%"
    padj = "Holm-adjusted over {} benchmarks ".format(family) if family > 1 else ""
    spread = " (within the run-to-run spread)" if t.basis == "between-run" else ""
    test = {"rounds": "Mann-Whitney", "between-run": "between-run t", "pairs": "paired t"}.get(t.basis, t.basis)
    if hard_limit is not None and t.ratio > hard_limit and hard_limit_applies(t, hard_limit):
        d.status, d.reason = "regression", (f"median {pct}, beyond the hard limit {hard_limit:g}x, which the measured "
                                            f"spread reaches in fewer than {HARD_LIMIT_RISK:.1%} of unchanged runs "
                                            f"({test}, {padj}p={p_slow:.2g}; {t.detail})")
    elif t.ratio > 1 + threshold and p_slow < alpha:
        d.status, d.reason = "regression", (f"median {pct} (> {threshold:.0%}), significant "
                                            f"({test}, {padj}p={p_slow:.2g} < {alpha:g}; {t.detail})")
    elif t.ratio < 1 - threshold and p_fast < alpha:
        d.status, d.reason = "improvement", (f"median {pct}, significant ({padj}p={p_fast:.2g}): "
                                             f"update the baseline")
    elif abs(t.ratio - 1) > threshold:
        d.status, d.reason = "noisy", (f"median {pct} beyond {threshold:.0%} but not significant{spread} "
                                       f"({test}, {padj}p={min(p_slow, p_fast):.2g}; {t.detail}): cannot decide")
    elif t.ci_high > 1 + threshold:
        d.status, d.reason = "noisy", (f"median {pct}, but the {1 - alpha:.0%} interval of the ratio "
                                       f"[{t.ci_low:.3f}, {t.ci_high:.3f}] reaches past {1 + threshold:.2f}"
                                       f"{spread} ({t.detail}): cannot decide")
    else:
        d.reason = (f"median {pct}, interval [{t.ci_low:.3f}, {t.ci_high:.3f}] rules out a slowdown "
                    f"> {threshold:.0%} ({t.detail})")
    return d


def judge_family(names: list[str], tests: list[Test], *, threshold: float = 0.10,
                 alpha: float = DEFAULT_ALPHA, weights=None, hard_limit: float | None = None) -> list[Decision]:
    """Decisions for a family of benchmarks: Holm-adjusted p-values (slower and faster each;
    weighted by ``weights`` when given, :func:`holm`), then :func:`decide`; ``alpha`` is the
    family-wise (run-level) level, ``hard_limit`` the ratio that fails whatever the noise."""
    if not tests:
        return []
    ps, pf = holm([t.p_slower for t in tests], weights), holm([t.p_faster for t in tests], weights)
    return [decide(n, t, float(a), float(b), threshold=threshold, alpha=alpha, family=len(tests),
                   hard_limit=hard_limit) for n, t, a, b in zip(names, tests, ps, pf)]


def compare(base: list[float] | np.ndarray, run: list[float] | np.ndarray, *, threshold: float = 0.10,
            alpha: float = DEFAULT_ALPHA, name: str = "", seed: int = 0) -> Decision:
    """Decide whether ``run`` is a regression against ``base`` from their rounds (seconds per
    call), one benchmark alone (no family adjustment).

    Raises ValueError when a sample list is empty or holds a non-positive or non-finite time.
    """
    t = rounds_test(base, run, alpha=alpha, seed=seed)
    return decide(name, t, t.p_slower, t.p_faster, threshold=threshold, alpha=alpha)


STATUSES = ("regression", "improvement", "noisy", "inconclusive", "ungated", "ok", "new", "missing")


def exit_code(decisions: list[Decision], strict: bool = False) -> int:
    """:data:`EXIT_REGRESSION` on any regression; else, ``strict``, :data:`EXIT_INCONCLUSIVE`
    when a benchmark is noisy or inconclusive (an ungated one never counts); else :data:`EXIT_PASS`."""
    if any(d.status == "regression" for d in decisions):
        return EXIT_REGRESSION
    if strict and any(d.status in ("noisy", "inconclusive") for d in decisions):
        return EXIT_INCONCLUSIVE
    return EXIT_PASS


def print_decisions(decisions: list[Decision], out=None, strict: bool = False) -> int:
    """Print one line per decision and the counts; returns the exit code (:func:`exit_code`)."""
    out = out or sys.stdout
    width = max([len(d.name) for d in decisions] + [10])
    for d in decisions:
        ratio = f"{d.ratio:.3f}" if d.ratio is not None else "-"
        print(f"  {d.status.upper():<12} {d.name:<{width}} ratio {ratio:>6}  {d.reason}", file=out)
    counts = {s: sum(d.status == s for d in decisions) for s in STATUSES}
    print("gate: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n), file=out)
    if counts["inconclusive"]:
        print(f"gate: WARNING: {counts['inconclusive']} benchmark(s) inconclusive: fewer than {MIN_HISTORY} earlier "
              f"entries of the series hold them, so their run-to-run spread is not measured and nothing is called "
              f"a regression there (one run's rounds against one baseline fail unchanged code often: "
              f"perf/calibration/gate_calibration.json). Store more runs of the unchanged code, or judge the change "
              f"with the interleaved A/B mode (inference-conformance ab --a <base> --b <change>)", file=out)
    if counts["noisy"]:
        print("gate: WARNING: some benchmarks were too noisy to decide (see 'noisy' above)", file=out)
    return exit_code(decisions, strict)


def binomial_rate(hits: int, n: int) -> dict:
    """hits / n with its 95% Clopper-Pearson (exact binomial) interval; None rate when n == 0."""
    from scipy.stats import binomtest

    if n == 0:
        return {"hits": 0, "n": 0, "rate": None, "ci95": None}
    ci = binomtest(hits, n).proportion_ci(confidence_level=0.95, method="exact")
    return {"hits": int(hits), "n": int(n), "rate": hits / n, "ci95": [float(ci.low), float(ci.high)]}


def _detectable_log_ratio(se: float, *, df: int, alpha: float, threshold: float, power: float) -> float:
    """The smallest log ratio ln(1 + slowdown) caught with probability ``power`` (normal
    approximation): past both the practical threshold and the one-sided t critical value."""
    from scipy.stats import norm, t as student

    crit = float(student.ppf(1 - alpha, df)) * se
    return max(float(np.log1p(threshold)), crit) + float(norm.ppf(power)) * se


def detectable_slowdown(se: float, *, df: int, alpha: float, threshold: float, power: float = 0.9) -> float:
    """The smallest relative slowdown (0.15: +15%) that the threshold-and-significance rule
    (:func:`decide`) catches with probability ``power`` when the log ratio's standard error is
    ``se`` and its t statistic has ``df`` degrees of freedom, at one-sided level ``alpha`` (for
    a family, the worst Holm step alpha / m): expm1(max(ln(1 + threshold), t_{1-alpha,df} se)
    + z_power se), a normal approximation of the power."""
    return float(np.expm1(_detectable_log_ratio(se, df=df, alpha=alpha, threshold=threshold, power=power)))


def pairs_needed(sd: float, slowdown: float, *, alpha: float, threshold: float, power: float = 0.9,
                 max_pairs: int = 1000) -> int | None:
    """The fewest interleaved pairs k (3 to ``max_pairs``) whose paired log ratios, of standard
    deviation ``sd``, catch ``slowdown`` with probability ``power`` (:func:`detectable_slowdown`
    with se = sd / sqrt(k), k - 1 degrees of freedom); None when more are needed."""
    target = float(np.log1p(slowdown))
    for k in range(3, max_pairs + 1):
        if _detectable_log_ratio(sd / np.sqrt(k), df=k - 1, alpha=alpha, threshold=threshold, power=power) <= target:
            return k
    return None
