"""``python -m reports.gate RUN.json [--baseline DIR_OR_FILE] [--threshold 0.10] [--alpha 0.05]``

Compare a benchmark run with the stored history of the same device model and exit 1 on a
regression. RUN.json is a history entry (``history/<series>/*.json``, written by
``python -m reports``) or a pytest-benchmark ``--benchmark-json`` file. The baseline defaults to
the latest other entry of the run's series in ``history/``; a folder means its latest entry.

Runs of unchanged code on one machine differ from each other (load, clocks, caches,
neighbours) by more than the rounds of one run show: rounds of one run share the machine's
state. So each benchmark is judged by the **between-run model** when the series holds at least
``MIN_HISTORY`` (3) earlier entries with it (``--window``, default the last 20 up to the
baseline): with m_1..m_n the ln(median) of those runs (mean mu, standard deviation s) and x the
run's ln(median),

- ratio r = exp(x - mu) (against the history's geometric mean), t = (x - mu) / (s sqrt(1 + 1/n)),
  one-sided p-values from Student's t with n - 1 degrees of freedom (the run as a new draw
  from the history's distribution of run medians: a prediction interval), and r's (1 - alpha)
  interval exp(x - mu +- t_{1-alpha/2} s sqrt(1 + 1/n)).

**Relative to the run's speed** (default; ``--no-normalize`` to judge raw medians): the
benchmarks of one run share much of their shift (the machine's speed in that run), so where at
least ``MIN_NORMALIZE`` (4) benchmarks are in the run and in every one of at least 4 entries of
the window, each one is judged against what the run's speed predicts: the run's speed as that
benchmark sees it is the median shift of the run's *other* benchmarks from their history means
(one regressed benchmark barely moves it), and over the history a least-squares line of the
benchmark's ln(median) on that speed gives the prediction and a t prediction interval with
n - 2 degrees of freedom (:func:`speed_test`; the slope is measured: about 1 for a benchmark
that follows the machine, about 0 for one that does not). The run's speed itself,
exp(median shift of all benchmarks), is judged by the plain between-run model as one more
member of the family, ``(run speed: ...)``: a change that slows every benchmark alike fails
there (with the wider spread of the machine's speed; when most benchmarks slow down, the
unchanged rest look faster than the run's speed predicts and show as improvements). Its
measured effect is in the calibration.

With fewer entries the benchmark falls back to the **rounds** of the run and of the baseline
(the former rule, which fails unchanged code often on a shared machine: a warning says so):
r = median(run) / median(baseline), a bootstrap interval and one-sided Mann-Whitney U p-values.

Family-wise control: the p-values of all the run's benchmarks are adjusted by Holm's step-down
method, so ``alpha`` (default 0.05) bounds the **run-level** false-alarm rate, the probability
that the gate fails a run of unchanged code whatever the number of benchmarks, as far as the
model holds (its measured rate: ``reports/calibration/gate_calibration.json``). Then, per
benchmark, with p the Holm-adjusted p-value:

- **regression** (exit 1): r > 1 + threshold and p_slower < alpha: larger than the practical
  threshold and statistically significant.
- **improvement**: r < 1 - threshold and p_faster < alpha: the baseline should be updated.
- **noisy** (a warning, exit 0): neither of the above, and either the interval reaches past
  1 + threshold (a regression larger than the threshold can be neither shown nor ruled out) or
  r is beyond the threshold without significance: the run cannot decide.
- **ok**: otherwise: the interval rules out a slowdown larger than the threshold.

Benchmarks only in the run are "new"; only in the baseline, "missing" (neither fails the gate).
The interleaved A/B mode (:mod:`reports.ab`) applies the same rule to paired passes.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from reports import bench, env, history

N_BOOT = 2000
#: Earlier entries of the series the between-run model uses (the last ones before the run): 20
#: rather than 10 gave the run-speed fit more power at the same false-alarm rate in the calibration.
DEFAULT_WINDOW = 20
#: Fewest earlier entries for the between-run model; with fewer the gate falls back to the rounds.
MIN_HISTORY = 3
#: Run-level (family-wise) significance level.
DEFAULT_ALPHA = 0.05
#: Fewest benchmarks common to the run and every entry of the window to normalise by the run's speed.
MIN_NORMALIZE = 4
#: The pseudo-benchmark that judges the run's speed itself (the median shift of its benchmarks).
RUN_SPEED = "(run speed: the median shift of all benchmarks)"


@dataclass
class Decision:
    name: str
    status: str  # regression | improvement | noisy | ok | new | missing
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


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error control, any dependence).

    p_(i) sorted ascending, adjusted_(i) = max_{j <= i} min(1, (m - j + 1) p_(j)); reject where
    adjusted < alpha. Raises ValueError for a p-value outside [0, 1] or not finite.
    Source: S. Holm, "A simple sequentially rejective multiple test procedure", Scand. J. Stat. 1979.
    """
    p = np.asarray(pvalues, dtype=float)
    if p.size and (not np.all(np.isfinite(p)) or np.any((p < 0) | (p > 1))):
        raise ValueError(f"p-values must be finite and in [0, 1], got {p.tolist()}")
    m = p.size
    order = np.argsort(p, kind="stable")
    adj = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
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
                f"vs the geometric mean of {n} earlier runs{relative}, between-run sd {sd:.1%}")


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
    (:data:`RUN_SPEED`), so a change that slows every benchmark alike still fails the gate."""
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
                f"{len(sp.names) - 1} benchmarks, slope {slope:.2f}), residual sd {sd:.1%} (raw {raw_sd:.1%})")


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
                f"{k} interleaved pairs, sd of the paired log ratios {sd:.3f}")


def decide(name: str, t: Test, p_slow: float, p_fast: float, *, threshold: float, alpha: float,
           family: int = 1) -> Decision:
    """The threshold-and-significance rule on one benchmark's evidence ``t``, with its
    (Holm-adjusted, when ``family`` > 1) p-values."""
    d = Decision(name, "ok", t.ratio, t.ci_low, t.ci_high, p_slow, p_fast, t.n_run, t.n_base, basis=t.basis)
    pct = f"{(t.ratio - 1) * 100:+.1f}%"
    padj = "Holm-adjusted over {} benchmarks ".format(family) if family > 1 else ""
    spread = " (within the run-to-run spread)" if t.basis == "between-run" else ""
    test = {"rounds": "Mann-Whitney", "between-run": "between-run t", "pairs": "paired t"}.get(t.basis, t.basis)
    if t.ratio > 1 + threshold and p_slow < alpha:
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
                 alpha: float = DEFAULT_ALPHA) -> list[Decision]:
    """Decisions for a family of benchmarks: Holm-adjusted p-values (slower and faster each),
    then :func:`decide`; ``alpha`` is the family-wise (run-level) level."""
    if not tests:
        return []
    ps, pf = holm([t.p_slower for t in tests]), holm([t.p_faster for t in tests])
    return [decide(n, t, float(a), float(b), threshold=threshold, alpha=alpha, family=len(tests))
            for n, t, a, b in zip(names, tests, ps, pf)]


def compare(base: list[float] | np.ndarray, run: list[float] | np.ndarray, *, threshold: float = 0.10,
            alpha: float = DEFAULT_ALPHA, name: str = "", seed: int = 0) -> Decision:
    """Decide whether ``run`` is a regression against ``base`` from their rounds (seconds per
    call), one benchmark alone (no family adjustment).

    Raises ValueError when a sample list is empty or holds a non-positive or non-finite time.
    """
    t = rounds_test(base, run, alpha=alpha, seed=seed)
    return decide(name, t, t.p_slower, t.p_faster, threshold=threshold, alpha=alpha)


def _samples(rec: dict) -> list[float]:
    data = rec.get("data") or []
    if data:
        return [float(x) for x in data]
    med = (rec.get("stats") or {}).get("median")
    return [float(med)] if med else []


def load_run(path: str | Path) -> dict:
    """A history entry from a history entry or a pytest-benchmark JSON file."""
    doc = json.loads(Path(path).read_text())
    if "fingerprint" in doc and "series" in doc:
        return doc
    fp = env.fingerprint(None)
    mi = doc.get("machine_info") or {}
    cpu = (mi.get("cpu") or {}).get("brand_raw")
    if cpu and fp.get("device") == "cpu":
        fp["cpu"] = cpu
    ci = doc.get("commit_info") or {}
    if ci.get("id"):
        fp["commit"], fp["dirty"] = ci["id"], bool(ci.get("dirty"))
    return history.make_entry(fp, bench.records(doc))


def find_baseline(run_path: Path, run: dict, baseline: str | None, history_dir: Path = history.HISTORY) -> Path | None:
    if baseline:
        p = Path(baseline)
        if p.is_file():
            return p
        entries = sorted(p.glob("*.json")) if p.is_dir() else []
    else:
        entries = [q for q, _ in history.series(run["series"], history_dir)]
    rp = run_path.resolve()
    older = [q for q in entries if q.resolve() != rp and (rp.parent != q.resolve().parent or q.name < rp.name)]
    return older[-1] if older else None


def history_medians(entries: list[dict]) -> dict[str, list[float]]:
    """benchmark fullname -> its median in each of ``entries`` (where present)."""
    out: dict[str, list[float]] = {}
    for e in entries:
        for b in e.get("benchmarks", []):
            med = (b.get("stats") or {}).get("median")
            if med:
                out.setdefault(b["fullname"], []).append(float(med))
    return out


def gate(run: dict, base: dict, *, threshold: float = 0.10, alpha: float = DEFAULT_ALPHA,
         history: list[dict] | None = None, min_history: int = MIN_HISTORY, normalize: bool = True) -> list[Decision]:
    """Decide every benchmark of ``run`` against ``base``; ``history`` (earlier entries of the
    series, the baseline included, oldest first): benchmarks with at least ``min_history`` of
    them are judged by the between-run model, the others by the rounds against ``base``.
    ``normalize`` (default): where at least :data:`MIN_NORMALIZE` benchmarks are in the run and
    in every history entry, they are judged relative to each run's speed
    (:func:`normalize_by_run_speed`) and the run's speed itself is one more decision
    (:data:`RUN_SPEED`). Holm's method over all judged benchmarks makes ``alpha`` the run-level
    level."""
    base_by = {b["fullname"]: b for b in base.get("benchmarks", [])}
    meds = history_medians(history or [])
    run_meds = {}
    for rec in run.get("benchmarks", []):
        rs = _samples(rec)
        med = (rec.get("stats") or {}).get("median") or (float(np.median(rs)) if rs else None)
        if med:
            run_meds[rec["fullname"]] = float(med)
    speed = None
    if normalize and history and len(history) >= max(2, min_history):
        speed = normalize_by_run_speed(run_meds, [{n: v[0] for n, v in history_medians([e]).items()}
                                                  for e in history])
    names, tests, out = [], [], []
    seen = set()
    for rec in run.get("benchmarks", []):
        name = rec["fullname"]
        seen.add(name)
        rs, b = _samples(rec), base_by.get(name)
        h = meds.get(name, [])
        if speed and name in speed.y_run:
            tests.append(speed_test(speed, name, alpha=alpha))
        elif name in run_meds and len(h) >= max(2, min_history):
            tests.append(history_test(run_meds[name], h, alpha=alpha))
        elif b is not None and _samples(b) and rs:
            tests.append(rounds_test(_samples(b), rs, alpha=alpha))
        else:
            out.append(Decision(name, "new", reason="no baseline samples for this benchmark"))
            continue
        names.append(name)
    order = [rec["fullname"] for rec in run.get("benchmarks", [])]
    if speed:
        names.append(RUN_SPEED)
        order.append(RUN_SPEED)
        tests.append(history_test(speed.speed_run, speed.speed_history, alpha=alpha, relative=(
            f" (all {len(speed.names)} benchmarks shifted alike: the machine, or a change that slows them all)")))
    decided = {d.name: d for d in judge_family(names, tests, threshold=threshold, alpha=alpha)}
    new = {d.name: d for d in out}
    result = [decided.get(n) or new[n] for n in order]
    for name in base_by:
        if name not in seen:
            result.append(Decision(name, "missing", reason="in the baseline, not in this run"))
    return result


def ceiling_drift(run: dict, base: dict) -> dict[str, float]:
    """Relative change of the measured ceilings (copy bandwidth, matmul peak per dtype) between
    the baseline and the run: a machine that got slower or busier shows here first."""
    from reports import bench

    out = {}
    rc, bc = run.get("ceilings") or {}, base.get("ceilings") or {}
    for key in ("copy_bytes_per_s",):
        if isinstance(rc.get(key), (int, float)) and isinstance(bc.get(key), (int, float)) and bc[key] > 0:
            out[key] = rc[key] / bc[key] - 1
    rp, bp = bench.matmul_peaks(rc), bench.matmul_peaks(bc)
    for d in sorted(set(rp) & set(bp)):
        if bp[d] > 0:
            out[f"matmul_flops_per_s[{d}]"] = rp[d] / bp[d] - 1
    return out


def print_decisions(decisions: list[Decision], out=None) -> int:
    """Print one line per decision and the counts; returns the exit code (1 on a regression)."""
    out = out or sys.stdout
    width = max([len(d.name) for d in decisions] + [10])
    for d in decisions:
        ratio = f"{d.ratio:.3f}" if d.ratio is not None else "-"
        print(f"  {d.status.upper():<12} {d.name:<{width}} ratio {ratio:>6}  {d.reason}", file=out)
    counts = {s: sum(d.status == s for d in decisions) for s in ("regression", "improvement", "noisy", "ok", "new", "missing")}
    print("gate: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n), file=out)
    rounds = sum(d.basis == "rounds" for d in decisions)
    if rounds:
        print(f"gate: WARNING: {rounds} benchmark(s) judged from the rounds of one run against one baseline "
              f"(fewer than {MIN_HISTORY} earlier entries in the series): that test does not see the variance "
              f"between runs and fails unchanged code far more often than alpha on a shared machine "
              f"(reports/calibration/gate_calibration.json); commit more baseline runs or use python -m reports.ab",
              file=out)
    if counts["noisy"]:
        print("gate: WARNING: some benchmarks were too noisy to decide (see 'noisy' above)", file=out)
    return 1 if counts["regression"] else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reports.gate", description=__doc__.split("\n\n")[1])
    ap.add_argument("run", help="history entry or pytest-benchmark JSON of the run to judge")
    ap.add_argument("--baseline", default=None, help="baseline entry, or folder (its latest entry)")
    ap.add_argument("--threshold", type=float, default=0.10, help="practical threshold on the median ratio")
    ap.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                    help="run-level (family-wise, Holm) significance level")
    ap.add_argument("--history", default=str(history.HISTORY), help="history folder")
    ap.add_argument("--window", type=int, default=DEFAULT_WINDOW,
                    help=f"earlier entries of the series (up to the baseline) for the between-run model; "
                         f"fewer than {MIN_HISTORY}: the rounds only (0: never use the history)")
    ap.add_argument("--no-normalize", action="store_true",
                    help="judge raw medians (default: each benchmark relative to the run's speed, estimated from "
                         f"its other benchmarks, when at least {MIN_NORMALIZE} are in every entry; the run's speed "
                         "is then judged as one more row)")
    ap.add_argument("--json", default=None, help="also write the decisions as JSON here")
    a = ap.parse_args(argv)
    run_path = Path(a.run)
    run = load_run(run_path)
    bpath = find_baseline(run_path, run, a.baseline, Path(a.history))
    if bpath is None:
        print(f"gate: no baseline for series {run['series']!r} (looked in {a.baseline or Path(a.history) / run['series']}); "
              f"nothing to compare — store this run as the baseline.")
        return 0
    base = history.load(bpath) if "series" in json.loads(bpath.read_text()) else load_run(bpath)
    if base.get("series") and base["series"] != run["series"]:
        print(f"gate: warning: baseline series {base['series']!r} differs from the run's {run['series']!r}")
    earlier = []
    if a.window > 0 and bpath.parent.is_dir():
        rp = run_path.resolve()
        for q in sorted(bpath.parent.glob("*.json")):
            if q.resolve() != rp and q.name <= bpath.name:
                try:
                    earlier.append(history.load(q))
                except (OSError, ValueError):
                    pass
        earlier = earlier[-a.window:]
    decisions = gate(run, base, threshold=a.threshold, alpha=a.alpha, history=earlier, normalize=not a.no_normalize)
    how = "" if a.no_normalize else f", relative to the run's speed where {MIN_NORMALIZE}+ benchmarks allow"
    print(f"gate: run {run_path} vs baseline {bpath} (threshold {a.threshold:.0%}, run-level alpha "
          f"{a.alpha:g}, Holm; {len(earlier)} earlier entries for the between-run model{how})")
    code = print_decisions(decisions)
    counts = {s: sum(d.status == s for d in decisions) for s in ("regression", "improvement")}
    drift = {k: v for k, v in ceiling_drift(run, base).items() if abs(v) > a.threshold}
    if drift:
        print("gate: WARNING: the machine's measured ceilings changed since the baseline ("
              + ", ".join(f"{k} {v:+.0%}" for k, v in drift.items())
              + "): the machine may be busier or different; read the verdicts with care"
              + (" (the two were measured with different sizes: quick vs full)"
                 if (run.get("ceilings") or {}).get("quick") != (base.get("ceilings") or {}).get("quick") else ""))
    if (run.get("settings") or {}) != (base.get("settings") or {}):
        print(f"gate: WARNING: the run and the baseline were measured differently (timer, threads, allocator: "
              f"{run.get('settings') or 'not recorded'} vs {base.get('settings') or 'not recorded'}): "
              f"their times are not comparable; start a new baseline")
    if counts["improvement"]:
        print(f"gate: improvements beyond {a.threshold:.0%}: update the baseline "
              f"(commit this run into history/{run['series']}/)")
    if a.json:
        Path(a.json).write_text(json.dumps([asdict(d) for d in decisions], indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main())
