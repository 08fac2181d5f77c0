"""``python -m inference_conformance.perf.gate RUN.json [--baseline DIR_OR_FILE] [--threshold 0.10] [--alpha 0.05] [--strict]``

Compare a benchmark run with the stored history of the same device and settings: exit 0 pass,
1 regression, 2 usage or input error, 3 inconclusive (only with --strict). RUN.json is a history entry (``history/<series>/*.json``, written by
``python -m inference_conformance.reports``) or a pytest-benchmark ``--benchmark-json`` file. The baseline defaults to
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
n - 2 degrees of freedom (:func:`inference_conformance.perf.stats.speed_test`; the slope is measured: about 1 for a benchmark
that follows the machine, about 0 for one that does not). The run's speed itself,
exp(median shift of all benchmarks), is judged by the plain between-run model as one more
member of the family, ``(run speed: ...)``: a change that slows every benchmark alike fails
there (with the wider spread of the machine's speed; when most benchmarks slow down, the
unchanged rest look faster than the run's speed predicts and show as improvements). Each
benchmark's own row cancels a uniform shift by construction, so the run-speed row is the only
one that sees it: it holds half of alpha (:data:`RUN_SPEED_SHARE`, weighted Holm) rather than
1/(m+1) of it. Its measured effect is in the calibration.

With fewer entries a benchmark is **inconclusive**: the rounds of the run and of the baseline
give its ratio r = median(run) / median(baseline) (bootstrap interval, Mann-Whitney U), but the
rounds of one run do not see the variance between runs (that rule fails unchanged code often
on a shared machine), so they call no regression; the message points to the A/B mode.

Family-wise control: the p-values of all the run's judged benchmarks are adjusted by Holm's
step-down method, so ``alpha`` (default 0.05) bounds the **run-level** false-alarm rate, the
probability that the gate fails a run of unchanged code whatever the number of benchmarks, as
far as the model holds (its measured rate: ``perf/calibration/gate_calibration.json``). Then,
per benchmark, with p the Holm-adjusted p-value:

- **regression** (exit 1): r > ``--hard-limit`` (default 1.5), whatever the noise and in every
  mode (the rounds too); or r > 1 + threshold and p_slower < alpha: larger than the practical
  threshold and statistically significant.
- **improvement**: r < 1 - threshold and p_faster < alpha: the baseline should be updated.
- **noisy** (a warning; exit 0, 3 with ``--strict``): neither of the above, and either the interval reaches past
  1 + threshold (a regression larger than the threshold can be neither shown nor ruled out) or
  r is beyond the threshold without significance: the run cannot decide.
- **ok**: otherwise: the interval rules out a slowdown larger than the threshold.

Benchmarks only in the run are "new"; only in the baseline, "missing" (exit 2 unless
``--allow-missing``). A damaged run file or history entry, no baseline, no benchmark in common
with it and a baseline of another device exit 2 with one line naming the file, the entry and
the field (``--allow-new-series``, ``--allow-corrupt-history`` accept the second and an
unusable entry, which is then named). The interleaved A/B mode (:mod:`inference_conformance.perf.ab`) applies the
same rule to paired passes.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np

from inference_conformance.perf import env, history, records
from inference_conformance.perf.stats import (DEFAULT_ALPHA, DEFAULT_HARD_LIMIT, EXIT_INCONCLUSIVE, EXIT_INPUT, EXIT_PASS,
                        EXIT_REGRESSION, MIN_HISTORY, MIN_NORMALIZE, Decision, decide,
                        history_test, judge_family, normalize_by_run_speed, print_decisions, rounds_test, speed_test)

#: Earlier entries of the series the between-run model uses (the last ones before the run): 20
#: rather than 10 gave the run-speed fit more power at the same false-alarm rate in the calibration.
DEFAULT_WINDOW = 20
#: The pseudo-benchmark that judges the run's speed itself (the median shift of its benchmarks).
RUN_SPEED = "(run speed: the median shift of all benchmarks)"
#: The run-speed row's share of alpha in the weighted Holm family (the benchmarks share the rest).
#: It is the one row that sees a change slowing every benchmark alike (each benchmark's own row,
#: relative to the run's speed, cancels a uniform shift by construction): with an equal share,
#: 1 of 21 rows, a uniform 2x slowdown was caught in about half of the synthetic runs.
RUN_SPEED_SHARE = 0.5


def samples(rec: dict) -> list[float]:
    """A benchmark record's per-round times in seconds (its raw ``data``, else its median alone)."""
    data = rec.get("data") or []
    if data:
        return [float(x) for x in data]
    med = (rec.get("stats") or {}).get("median")
    return [float(med)] if med else []


def load_run(path: str | Path) -> dict:
    """A history entry from a history entry or a pytest-benchmark JSON file, validated
    (:func:`inference_conformance.perf.history.load`): raises :class:`inference_conformance.perf.history.EntryError` naming the file, the
    entry and the field of anything unusable."""
    doc = history.validate(history.read_json(path), path)
    if "fingerprint" in doc and "series" in doc:
        return doc
    fp = env.fingerprint(None)
    mi = doc.get("machine_info") if isinstance(doc.get("machine_info"), dict) else {}
    cpu = mi.get("cpu") if isinstance(mi.get("cpu"), dict) else {}
    if cpu.get("brand_raw") and fp.get("device") == "cpu":
        fp["cpu"] = cpu["brand_raw"]
        if isinstance(cpu.get("count"), int):
            fp["cpu_count"] = cpu["count"]
    ci = doc.get("commit_info") if isinstance(doc.get("commit_info"), dict) else {}
    if ci.get("id"):
        fp["commit"], fp["dirty"] = ci["id"], bool(ci.get("dirty"))
    return history.make_entry(fp, records.records(doc))


def is_entry(doc: dict) -> bool:
    """Whether ``doc`` is a history entry (rather than a pytest-benchmark JSON)."""
    return "fingerprint" in doc and "series" in doc


def earlier_files(folder: Path, run_path: Path, up_to: Path | None = None) -> list[Path]:
    """The ``*.json`` files of ``folder`` that come before the run (oldest first): the run itself
    excluded and, when the run lies in ``folder``, only the files named before it; with
    ``up_to``, only those up to that file."""
    rp = run_path.resolve()
    out = []
    for q in sorted(Path(folder).glob("*.json")):
        qr = q.resolve()
        if qr == rp or (rp.parent == qr.parent and q.name > rp.name) or (up_to is not None and q.name > up_to.name):
            continue
        out.append(q)
    return out


def load_entries(paths: list[Path], errors: list) -> list[tuple[Path, dict]]:
    """The usable history entries among ``paths``; every unusable file's
    :class:`inference_conformance.perf.history.EntryError` goes to ``errors`` (never skipped without a word)."""
    out = []
    for q in paths:
        try:
            doc = history.load(q)
        except history.EntryError as e:
            errors.append(e)
            continue
        if not is_entry(doc):
            errors.append(history.EntryError(q, "not a history entry (no 'fingerprint' and 'series')",
                                             field="fingerprint"))
            continue
        out.append((q, doc))
    return out


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
         history: list[dict] | None = None, min_history: int = MIN_HISTORY, normalize: bool = True,
         hard_limit: float | None = DEFAULT_HARD_LIMIT, speed_share: float = RUN_SPEED_SHARE) -> list[Decision]:
    """Decide every benchmark of ``run`` against ``base``; ``history`` (earlier entries of the
    series, the baseline included, oldest first): benchmarks with at least ``min_history`` of
    them are judged by the between-run model; the others are **inconclusive** (the rounds of one
    run against ``base`` give their ratio, which fails only beyond ``hard_limit``).
    ``normalize`` (default): where at least :data:`MIN_NORMALIZE` benchmarks are in the run and
    in every history entry, they are judged relative to each run's speed
    (:func:`inference_conformance.perf.stats.normalize_by_run_speed`) and the run's speed itself is one more decision
    (:data:`RUN_SPEED`) holding the share ``speed_share`` of alpha in the weighted Holm family
    (the benchmarks share the rest). Holm's method over all judged benchmarks makes ``alpha``
    the run-level level; a ratio beyond ``hard_limit`` fails whatever the noise."""
    base_by = {b["fullname"]: b for b in base.get("benchmarks", [])}
    meds = history_medians(history or [])
    run_meds = {}
    for rec in run.get("benchmarks", []):
        rs = samples(rec)
        med = (rec.get("stats") or {}).get("median") or (float(np.median(rs)) if rs else None)
        if med:
            run_meds[rec["fullname"]] = float(med)
    speed = None
    if normalize and history and len(history) >= max(2, min_history):
        speed = normalize_by_run_speed(run_meds, [{n: v[0] for n, v in history_medians([e]).items()}
                                                  for e in history])
    names, tests, weights, other = [], [], [], {}
    seen = set()
    for rec in run.get("benchmarks", []):
        name = rec["fullname"]
        seen.add(name)
        rs, b = samples(rec), base_by.get(name)
        h = meds.get(name, [])
        if speed and name in speed.y_run:
            tests.append(speed_test(speed, name, alpha=alpha))
        elif name in run_meds and len(h) >= max(2, min_history):
            tests.append(history_test(run_meds[name], h, alpha=alpha))
        elif b is not None and samples(b) and rs:
            other[name] = _few_history(name, rounds_test(samples(b), rs, alpha=alpha), len(h), threshold=threshold,
                                       alpha=alpha, hard_limit=hard_limit)
            continue
        else:
            other[name] = Decision(name, "new", reason="no baseline samples for this benchmark")
            continue
        names.append(name)
        weights.append(1.0)
    order = [rec["fullname"] for rec in run.get("benchmarks", [])]
    if speed:
        names.append(RUN_SPEED)
        order.append(RUN_SPEED)
        weights.append(len(tests) * speed_share / (1 - speed_share))
        tests.append(history_test(speed.speed_run, speed.speed_history, alpha=alpha, relative=(
            f" (all {len(speed.names)} benchmarks shifted alike: the machine, or a change that slows them all)")))
    decided = {d.name: d for d in judge_family(names, tests, threshold=threshold, alpha=alpha, weights=weights,
                                               hard_limit=hard_limit)}
    result = [decided.get(n) or other[n] for n in order]
    for name in base_by:
        if name not in seen:
            result.append(Decision(name, "missing", reason="in the baseline, not in this run"))
    return result


def _few_history(name: str, t, n_history: int, *, threshold: float, alpha: float, hard_limit: float | None) -> Decision:
    """A benchmark with fewer than :data:`MIN_HISTORY` earlier entries: a regression only beyond
    ``hard_limit``, else inconclusive (the rounds of one run do not see the between-run variance)."""
    d = decide(name, t, t.p_slower, t.p_faster, threshold=threshold, alpha=alpha, hard_limit=hard_limit)
    if hard_limit is None or t.ratio <= hard_limit:
        d.status = "inconclusive"
        d.reason = (f"median {(t.ratio - 1) * 100:+.1f}% against the baseline's rounds (interval "
                    f"[{t.ci_low:.3f}, {t.ci_high:.3f}], {t.detail}), within the hard limit "
                    f"{hard_limit:g}x; {n_history} earlier entr{'y' if n_history == 1 else 'ies'} hold this benchmark, "
                    f"fewer than {MIN_HISTORY}: not judged from one run's rounds, use python -m inference_conformance.perf.ab"
                    if hard_limit is not None else
                    f"median {(t.ratio - 1) * 100:+.1f}% against the baseline's rounds; fewer than {MIN_HISTORY} "
                    f"earlier entries: not judged from one run's rounds, use python -m inference_conformance.perf.ab")
    return d


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


EXIT_CODES = f"""exit status:
  {EXIT_PASS}  pass: no regression (noisy or inconclusive benchmarks are reported; with --strict they exit {EXIT_INCONCLUSIVE})
  {EXIT_REGRESSION}  regression: a benchmark (or the run's speed) is significantly slower than the threshold
     allows, or slower than the hard limit whatever the noise
  {EXIT_INPUT}  usage or input error: a missing, empty, truncated or malformed run file or history entry
     (the message names the file, the entry and the field), a benchmark of the baseline missing from the
     run (--allow-missing), no baseline or no benchmark in common with it (--allow-new-series), an
     unreadable history entry (--allow-corrupt-history), a baseline measured on another device;
     it wins over {EXIT_REGRESSION}
  {EXIT_INCONCLUSIVE}  inconclusive, only with --strict: no regression, but some benchmark could not be decided
     (noisy, or fewer than {MIN_HISTORY} earlier entries: use python -m inference_conformance.perf.ab)"""


class InputError(Exception):
    """An input the gate cannot judge (exit :data:`EXIT_INPUT`): one line saying what and where."""


def _bounded(kind: type, ok, says: str):
    """An argparse type: ``kind`` (float or int) for which ``ok(value)`` holds, else a usage
    error saying ``says`` (argparse then exits :data:`EXIT_INPUT`)."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not ok(v):
            raise argparse.ArgumentTypeError(f"must be {says}, got {text}")
        return v
    return parse


_positive_float = _bounded(float, lambda v: v > 0, "> 0")
_alpha = _bounded(float, lambda v: 0 < v < 1, "in (0, 1)")
_hard_limit = _bounded(float, lambda v: v > 1, "a ratio > 1 (inf: no hard limit)")
_window = _bounded(int, lambda v: v >= 0, ">= 0")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m inference_conformance.perf.gate", description=__doc__.split("\n\n")[1],
                                 epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="history entry or pytest-benchmark JSON of the run to judge")
    ap.add_argument("--baseline", default=None, help="baseline entry, or folder (its latest entry)")
    ap.add_argument("--threshold", type=_positive_float, default=0.10,
                    help="practical threshold on the median ratio (> 0; default 0.10)")
    ap.add_argument("--alpha", type=_alpha, default=DEFAULT_ALPHA,
                    help="run-level (family-wise, Holm) significance level, in (0, 1)")
    ap.add_argument("--hard-limit", type=_hard_limit, default=DEFAULT_HARD_LIMIT,
                    help=f"a ratio beyond this fails whatever the noise, in every mode (default {DEFAULT_HARD_LIMIT:g}; "
                         f"inf: none)")
    ap.add_argument("--history", default=str(history.HISTORY), help="history folder")
    ap.add_argument("--window", type=_window, default=DEFAULT_WINDOW,
                    help=f"earlier entries of the series (up to the baseline) for the between-run model; "
                         f"fewer than {MIN_HISTORY}: inconclusive unless beyond the hard limit (0: never use the history)")
    ap.add_argument("--no-normalize", action="store_true",
                    help="judge raw medians (default: each benchmark relative to the run's speed, estimated from "
                         f"its other benchmarks, when at least {MIN_NORMALIZE} are in every entry; the run's speed "
                         "is then judged as one more row)")
    ap.add_argument("--strict", action="store_true",
                    help=f"exit {EXIT_INCONCLUSIVE} when no benchmark regressed but some could not be decided")
    ap.add_argument("--allow-missing", action="store_true",
                    help="a benchmark of the baseline missing from the run is reported, not an error")
    ap.add_argument("--allow-new-series", action="store_true",
                    help="no baseline (a run that starts its series), or no benchmark in common with it, exits 0")
    ap.add_argument("--allow-corrupt-history", action="store_true",
                    help="skip unreadable history entries (each is named) instead of failing")
    ap.add_argument("--json", default=None, help="also write the decisions as JSON here")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        return _main(a)
    except (InputError, history.EntryError) as e:
        print(f"gate: error: {e}", file=sys.stderr)
        return EXIT_INPUT


def _check_device(run: dict, run_path: Path, doc: dict, path: Path, what: str) -> None:
    rf, bf = run.get("fingerprint") or {}, doc.get("fingerprint") or {}
    if not env.same_device(rf, bf):
        raise InputError(f"{path}: field 'fingerprint': {what} was measured on {env.device_label(bf)}, the run "
                         f"{run_path} on {env.device_label(rf)}: times of two devices are not comparable "
                         f"(its series: history/{run['series']}/)")


def _main(a) -> int:
    run_path = Path(a.run)
    run = load_run(run_path)
    errors: list = []
    if a.baseline:
        bp = Path(a.baseline)
        if bp.is_file():
            bdoc = history.load(bp)
            base_doc = bdoc if is_entry(bdoc) else load_run(bp)
            bpath = bp
            folder = bp.parent if is_entry(bdoc) else None
        elif bp.is_dir():
            bpath, base_doc, folder = None, None, bp
        else:
            raise InputError(f"{bp}: --baseline: no such file or folder")
    else:
        bpath, base_doc, folder = None, None, Path(a.history) / run["series"]
    entries = []
    if folder is not None and folder.is_dir():
        entries = load_entries(earlier_files(folder, run_path, up_to=bpath), errors)
    if bpath is None and entries:
        bpath, base_doc = entries[-1]
    if errors:
        listing = "; ".join(str(e) for e in errors)
        if not a.allow_corrupt_history:
            raise InputError(f"{len(errors)} unusable history entr{'y' if len(errors) == 1 else 'ies'} before the "
                             f"run: {listing} (repair or delete, or pass --allow-corrupt-history to skip them)")
        for e in errors:
            print(f"gate: WARNING: skipped an unusable history entry (--allow-corrupt-history): {e}")
    if base_doc is None:
        msg = (f"no baseline for series {run['series']!r} (looked in {a.baseline or Path(a.history) / run['series']}): "
               f"nothing to compare")
        if a.allow_new_series:
            print(f"gate: {msg}; a run that starts its series (--allow-new-series): store it as the first baseline.")
            return EXIT_PASS
        raise InputError(f"{run_path}: {msg} (pass --allow-new-series to accept a run that starts a series)")
    _check_device(run, run_path, base_doc, bpath, "the baseline")
    earlier = []
    if a.window > 0:
        for q, doc in entries:
            _check_device(run, run_path, doc, q, "this history entry")
            earlier.append(doc)
        earlier = earlier[-a.window:]
    base = base_doc
    if base.get("series") and base["series"] != run["series"]:
        print(f"gate: warning: baseline series {base['series']!r} differs from the run's {run['series']!r}")
    decisions = gate(run, base, threshold=a.threshold, alpha=a.alpha, history=earlier, normalize=not a.no_normalize,
                     hard_limit=None if a.hard_limit == float("inf") else a.hard_limit)
    how = "" if a.no_normalize else f", relative to the run's speed where {MIN_NORMALIZE}+ benchmarks allow"
    print(f"gate: run {run_path} vs baseline {bpath} (threshold {a.threshold:.0%}, hard limit {a.hard_limit:g}x, "
          f"run-level alpha {a.alpha:g}, Holm; {len(earlier)} earlier entries for the between-run model{how})")
    code = print_decisions(decisions, strict=a.strict)
    counts = {s: sum(d.status == s for d in decisions) for s in ("regression", "improvement", "missing", "new")}
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
    judged = [d for d in decisions if d.status not in ("new", "missing")]
    if counts["missing"] and not a.allow_missing:
        names = ", ".join(d.name for d in decisions if d.status == "missing")
        print(f"gate: error: {run_path}: field 'benchmarks': {counts['missing']} benchmark(s) of the baseline {bpath} "
              f"missing from the run: {names} (pass --allow-missing if they were removed on purpose)", file=sys.stderr)
        return EXIT_INPUT
    if not judged and not a.allow_new_series:
        print(f"gate: error: {run_path}: field 'benchmarks': no benchmark of the run is in the baseline {bpath} "
              f"({counts['new']} new): nothing was compared (pass --allow-new-series for a run that starts a new "
              f"set of benchmarks)", file=sys.stderr)
        return EXIT_INPUT
    return code


if __name__ == "__main__":
    sys.exit(main())
