"""``python -m reports.gate RUN.json [--baseline DIR_OR_FILE] [--threshold 0.10] [--alpha 0.01]``

Compare a benchmark run with the stored baseline of the same device model and exit 1 on a
regression. RUN.json is a history entry (``history/<series>/*.json``, written by
``python -m reports``) or a pytest-benchmark ``--benchmark-json`` file. The baseline defaults to
the latest other entry of the run's series in ``history/``; a folder means its latest entry.

The decision, per benchmark, from the rounds' raw samples (seconds per call):

- ratio r = median(run) / median(baseline); its (1 - alpha) bootstrap confidence interval
  [lo, hi] (each sample resampled independently, 2000 resamples, fixed seed);
  p = one-sided Mann-Whitney U p-value that the run is slower (resp. faster).
- **regression** (exit 1): r > 1 + threshold and p_slower < alpha: larger than the practical
  threshold and statistically significant.
- **improvement**: r < 1 - threshold and p_faster < alpha: the baseline should be updated.
- **noisy** (a warning, exit 0): neither of the above, and either the interval reaches past
  1 + threshold (hi > 1 + threshold: a regression larger than the threshold can be neither shown
  nor ruled out) or r is beyond the threshold without significance (too few rounds): the run
  cannot decide; rerun with more rounds (``--benchmark-min-rounds``) or on a quieter machine.
- **ok**: otherwise: the interval rules out a slowdown larger than the threshold.

Runs on one machine also differ from each other (load, clocks, caches) by more than the samples
of one run show. So when the series holds earlier entries (``--window``, default the last 5
before the run), a significant slowdown is called a regression only if the run's median is
also beyond the threshold above the slowest of those runs' medians; otherwise it is **noisy**
("within the run-to-run spread of the history").

Benchmarks only in the run are "new"; only in the baseline, "missing" (neither fails the gate).
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


def compare(base: list[float] | np.ndarray, run: list[float] | np.ndarray, *, threshold: float = 0.10,
            alpha: float = 0.01, name: str = "", seed: int = 0) -> Decision:
    """Decide whether ``run`` is a regression against ``base`` (samples in seconds per call).

    Raises ValueError when a sample list is empty or holds a non-positive or non-finite time.
    """
    from scipy.stats import mannwhitneyu

    b, r = np.asarray(base, dtype=float), np.asarray(run, dtype=float)
    for label, x in (("base", b), ("run", r)):
        if x.size == 0:
            raise ValueError(f"{label} samples are empty")
        if not np.all(np.isfinite(x)) or np.any(x <= 0):
            raise ValueError(f"{label} samples must be finite positive times")
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
    d = Decision(name, "ok", ratio, lo, hi, p_slow, p_fast, int(r.size), int(b.size))
    pct = f"{(ratio - 1) * 100:+.1f}%"
    if ratio > 1 + threshold and p_slow < alpha:
        d.status, d.reason = "regression", (f"median {pct} (> {threshold:.0%}), significant "
                                            f"(Mann-Whitney p={p_slow:.2g} < {alpha:g})")
    elif ratio < 1 - threshold and p_fast < alpha:
        d.status, d.reason = "improvement", (f"median {pct}, significant (p={p_fast:.2g}): "
                                             f"update the baseline")
    elif hi > 1 + threshold:
        d.status, d.reason = "noisy", (f"median {pct}, but the {1 - alpha:.0%} interval of the ratio "
                                       f"[{lo:.3f}, {hi:.3f}] reaches past {1 + threshold:.2f}: cannot decide")
    elif abs(ratio - 1) > threshold:
        d.status, d.reason = "noisy", (f"median {pct} beyond {threshold:.0%} but not significant "
                                       f"(p={min(p_slow, p_fast):.2g}, {r.size} vs {b.size} rounds): cannot decide")
    else:
        d.reason = f"median {pct}, interval [{lo:.3f}, {hi:.3f}] rules out a slowdown > {threshold:.0%}"
    return d


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


def gate(run: dict, base: dict, *, threshold: float = 0.10, alpha: float = 0.01,
         history: list[dict] | None = None) -> list[Decision]:
    """Decide every benchmark of ``run`` against ``base``; ``history`` (earlier entries of the
    series, the baseline included) widens the regression rule by the run-to-run spread."""
    base_by = {b["fullname"]: b for b in base.get("benchmarks", [])}
    spread = history_medians(history or [])
    out: list[Decision] = []
    seen = set()
    for rec in run.get("benchmarks", []):
        name = rec["fullname"]
        seen.add(name)
        rs, b = _samples(rec), base_by.get(name)
        if b is None or not _samples(b) or not rs:
            out.append(Decision(name, "new", reason="no baseline samples for this benchmark"))
            continue
        d = compare(_samples(b), rs, threshold=threshold, alpha=alpha, name=name)
        meds = spread.get(name, [])
        if d.status == "regression" and len(meds) >= 2:
            run_med = float(np.median(rs))
            if run_med <= max(meds) * (1 + threshold):
                d.status = "noisy"
                d.reason += (f"; but within the run-to-run spread of the last {len(meds)} runs "
                             f"(slowest median {max(meds) / float(np.median(_samples(b))):.2f}x the baseline's): cannot decide")
        out.append(d)
    for name in base_by:
        if name not in seen:
            out.append(Decision(name, "missing", reason="in the baseline, not in this run"))
    return out


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reports.gate", description=__doc__.split("\n\n")[1])
    ap.add_argument("run", help="history entry or pytest-benchmark JSON of the run to judge")
    ap.add_argument("--baseline", default=None, help="baseline entry, or folder (its latest entry)")
    ap.add_argument("--threshold", type=float, default=0.10, help="practical threshold on the median ratio")
    ap.add_argument("--alpha", type=float, default=0.01, help="significance level")
    ap.add_argument("--history", default=str(history.HISTORY), help="history folder")
    ap.add_argument("--window", type=int, default=5,
                    help="earlier entries of the series whose spread widens the regression rule (0: none)")
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
    decisions = gate(run, base, threshold=a.threshold, alpha=a.alpha, history=earlier)
    print(f"gate: run {run_path} vs baseline {bpath} (threshold {a.threshold:.0%}, alpha {a.alpha:g})")
    width = max([len(d.name) for d in decisions] + [10])
    for d in decisions:
        ratio = f"{d.ratio:.3f}" if d.ratio is not None else "-"
        print(f"  {d.status.upper():<12} {d.name:<{width}} ratio {ratio:>6}  {d.reason}")
    counts = {s: sum(d.status == s for d in decisions) for s in ("regression", "improvement", "noisy", "ok", "new", "missing")}
    print("gate: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n))
    drift = {k: v for k, v in ceiling_drift(run, base).items() if abs(v) > a.threshold}
    if drift:
        print("gate: WARNING: the machine's measured ceilings changed since the baseline ("
              + ", ".join(f"{k} {v:+.0%}" for k, v in drift.items())
              + "): the machine may be busier or different; read the verdicts with care"
              + (" (the two were measured with different sizes: quick vs full)"
                 if (run.get("ceilings") or {}).get("quick") != (base.get("ceilings") or {}).get("quick") else ""))
    if counts["noisy"]:
        print("gate: WARNING: some benchmarks were too noisy to decide (see 'noisy' above)")
    if counts["improvement"]:
        print(f"gate: improvements beyond {a.threshold:.0%}: update the baseline "
              f"(commit this run into history/{run['series']}/)")
    if a.json:
        Path(a.json).write_text(json.dumps([asdict(d) for d in decisions], indent=1))
    return 1 if counts["regression"] else 0


if __name__ == "__main__":
    sys.exit(main())
