"""``python -m perf.gate RUN.json [--baseline DIR_OR_FILE] [--threshold 0.10] [--alpha 0.05]``

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
n - 2 degrees of freedom (:func:`perf.stats.speed_test`; the slope is measured: about 1 for a benchmark
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
model holds (its measured rate: ``perf/calibration/gate_calibration.json``). Then, per
benchmark, with p the Holm-adjusted p-value:

- **regression** (exit 1): r > 1 + threshold and p_slower < alpha: larger than the practical
  threshold and statistically significant.
- **improvement**: r < 1 - threshold and p_faster < alpha: the baseline should be updated.
- **noisy** (a warning, exit 0): neither of the above, and either the interval reaches past
  1 + threshold (a regression larger than the threshold can be neither shown nor ruled out) or
  r is beyond the threshold without significance: the run cannot decide.
- **ok**: otherwise: the interval rules out a slowdown larger than the threshold.

Benchmarks only in the run are "new"; only in the baseline, "missing" (neither fails the gate).
The interleaved A/B mode (:mod:`perf.ab`) applies the same rule to paired passes.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np

from perf import env, history, records
from perf.stats import (DEFAULT_ALPHA, MIN_HISTORY, MIN_NORMALIZE, Decision, history_test, judge_family,
                        normalize_by_run_speed, print_decisions, rounds_test, speed_test)

#: Earlier entries of the series the between-run model uses (the last ones before the run): 20
#: rather than 10 gave the run-speed fit more power at the same false-alarm rate in the calibration.
DEFAULT_WINDOW = 20
#: The pseudo-benchmark that judges the run's speed itself (the median shift of its benchmarks).
RUN_SPEED = "(run speed: the median shift of all benchmarks)"


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
    return history.make_entry(fp, records.records(doc))


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
    (:func:`perf.stats.normalize_by_run_speed`) and the run's speed itself is one more decision
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
    out = {}
    rc, bc = run.get("ceilings") or {}, base.get("ceilings") or {}
    for key in ("copy_bytes_per_s",):
        if isinstance(rc.get(key), (int, float)) and isinstance(bc.get(key), (int, float)) and bc[key] > 0:
            out[key] = rc[key] / bc[key] - 1
    rp, bp = records.matmul_peaks(rc), records.matmul_peaks(bc)
    for d in sorted(set(rp) & set(bp)):
        if bp[d] > 0:
            out[f"matmul_flops_per_s[{d}]"] = rp[d] / bp[d] - 1
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.gate", description=__doc__.split("\n\n")[1])
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
