"""``python -m inference_conformance.perf.gate RUN.json [--baseline DIR_OR_FILE] [--threshold 0.10] [--alpha 0.05] [--strict]``

Compare a benchmark run with the stored history of the same device and settings: exit 0 pass,
1 regression, 2 usage or input error, 3 inconclusive (only with --strict). RUN.json is a
history entry (``<history>/<series>/*.json``, written by ``inference-conformance run``) or a
pytest-benchmark ``--benchmark-json`` file. The history is
read where ``run`` writes it (``$INFERENCE_CONFORMANCE_HISTORY``, else the checkout's ``history/``,
else ``./inference-conformance-out/history``; an entry is judged against its own series folder);
the baseline defaults to the latest earlier entry of the run's series; a folder means its latest
entry. A run is never its own baseline: the entry its run stored (its run folder's manifest, or
the same measurements) is left out, with any after it, and the gate names the entry it compared
against and its mode's measured false-alarm rate (:mod:`inference_conformance.perf.gate_modes`).
The rule (the between-run model, relative to the run's speed, Holm's family-wise control, the
verdicts regression, improvement, noisy, ok, inconclusive, ungated) is :mod:`inference_conformance.perf.gate_rule`'s.
Benchmarks only in the run are "new"; only in the baseline, "missing" (exit 2 unless
``--allow-missing``). A damaged run file or history entry, no baseline, no benchmark in common
with it, a baseline of another device and inputs measured with other settings (timer, threads,
pinned environment: :mod:`inference_conformance.perf.settings_compare`) exit 2 with one line naming the file,
the entry and the field or each setting that differs (``--allow-new-series``,
``--allow-corrupt-history`` accept the second and an unusable entry, which is then named); an
input not taken with the pinned settings is warned about on stderr. The interleaved A/B mode
(:mod:`inference_conformance.perf.ab`) applies the same rule to paired passes.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from inference_conformance.perf import gate_modes, history
from inference_conformance.perf.gate_inputs import (InputError, check_device, check_settings, earlier_files,  # noqa: F401
                                                    is_entry, load_entries, load_run, same_run, warn_unpinned,
                                                    without_the_run)
from inference_conformance.perf.settings_compare import measured, version_notes
from inference_conformance.perf.gate_rule import (DEFAULT_WINDOW, RUN_SPEED, RUN_SPEED_SHARE, TIMER_TICKS,  # noqa: F401
                                                  ceiling_drift, gate, history_medians, samples)
from inference_conformance.perf.stats import (DEFAULT_ALPHA, DEFAULT_HARD_LIMIT, EXIT_INCONCLUSIVE, EXIT_INPUT, EXIT_PASS,
                                              EXIT_REGRESSION, MIN_HISTORY, MIN_NORMALIZE, print_decisions)

EXIT_CODES = f"""exit status:
  {EXIT_PASS}  pass: no regression (noisy or inconclusive benchmarks are reported; with --strict they exit {EXIT_INCONCLUSIVE})
  {EXIT_REGRESSION}  regression: a benchmark (or the run's speed) is significantly slower than the threshold
     allows, or slower than the hard limit where its measured run-to-run spread is well below it
  {EXIT_INPUT}  usage or input error: a missing, empty, truncated or malformed run file or history entry
     (the message names the file, the entry and the field), a benchmark of the baseline missing from the
     run (--allow-missing), no baseline or no benchmark in common with it, the run itself as baseline, an
     unreadable history entry (--allow-corrupt-history), a baseline measured on another device
     or with other settings (timer, threads, pinned environment: each difference is named);
     it wins over {EXIT_REGRESSION}
  {EXIT_INCONCLUSIVE}  inconclusive, only with --strict: no regression, but some benchmark could not be decided
     (noisy, or fewer than {MIN_HISTORY} earlier entries: use inference-conformance ab); an ungated benchmark
     (one timed round, or rounds within {TIMER_TICKS} ticks of the timer) never counts"""



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


def parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The command's options; ``prog``: the usage line's command (default ``python -m inference_conformance.perf.gate``)."""
    ap = argparse.ArgumentParser(prog=prog or "python -m inference_conformance.perf.gate", description=__doc__.split("\n\n")[1],
                                 epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="history entry or pytest-benchmark JSON of the run to judge")
    ap.add_argument("--baseline", default=None, help="baseline entry, or folder (its latest entry)")
    ap.add_argument("--threshold", type=_positive_float, default=0.10,
                    help="practical threshold on the median ratio (> 0; default 0.10)")
    ap.add_argument("--alpha", type=_alpha, default=DEFAULT_ALPHA,
                    help="run-level (family-wise, Holm) significance level, in (0, 1)")
    ap.add_argument("--hard-limit", type=_hard_limit, default=DEFAULT_HARD_LIMIT,
                    help=f"a ratio beyond this fails whatever the Holm step where the measured run-to-run spread is "
                         f"well below it; never from one baseline's rounds (default {DEFAULT_HARD_LIMIT:g}; inf: none)")
    ap.add_argument("--history", default=None,
                    help=f"history folder (default: where `inference-conformance run` writes it: ${history.HISTORY_ENV} "
                         f"when set, else the checkout's history/, installed ./{history.OUT_NAME}/history; a run that is "
                         f"an entry of a series folder is judged against that folder)")
    ap.add_argument("--window", type=_window, default=DEFAULT_WINDOW,
                    help=f"earlier entries of the series (up to the baseline) for the between-run model; "
                         f"fewer than {MIN_HISTORY}: inconclusive, whatever the ratio (0: never use the history)")
    ap.add_argument("--no-normalize", action="store_true",
                    help="judge raw medians (default: each benchmark relative to the run's speed, estimated from "
                         f"its other benchmarks, when at least {MIN_NORMALIZE} are in every entry; the run's speed "
                         "is then judged as one more row)")
    ap.add_argument("--strict", action="store_true",
                    help=f"exit {EXIT_INCONCLUSIVE} when no benchmark regressed but some could not be decided")
    ap.add_argument("--allow-missing", action="store_true",
                    help="a benchmark of the baseline missing from the run is reported, not an error")
    ap.add_argument("--allow-new-series", action="store_true",
                    help="exit 0 although nothing was compared (no baseline, or no benchmark in common with it): "
                         "only for the run that starts a series, never as a CI gate")
    ap.add_argument("--allow-corrupt-history", action="store_true",
                    help="skip unreadable history entries (each is named) instead of failing")
    ap.add_argument("--json", default=None, help="also write the decisions as JSON here")
    return ap


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run the gate on ``argv`` (default ``sys.argv[1:]``); ``prog``: the command named in its usage
    line. Returns the exit status (see :data:`EXIT_CODES`)."""
    a = parser(prog).parse_args(argv)
    try:
        return _main(a)
    except (InputError, history.EntryError) as e:
        print(f"gate: error: {e}", file=sys.stderr)
        return EXIT_INPUT


def passes_of(run: dict) -> int:
    """The benchmark processes (``--bench-passes``) a run's medians come from: its settings'
    ``passes``, else the per-pass medians its records keep, else 1."""
    p = (run.get("settings") or {}).get("passes")
    if isinstance(p, int) and p >= 1:
        return p
    return max([len(r.get("passes") or []) for r in run.get("benchmarks", [])] + [1])


def _series_folder(a, run: dict, run_path: Path) -> Path:
    """The series folder a run without ``--baseline`` is judged against: the folder holding the
    run when it is an entry of its series (and no ``--history`` was given), else the run's series
    in the history folder (:func:`inference_conformance.perf.history.default_folder` unless
    ``--history``), else the series of this device there that holds the newest entry."""
    if a.history is None and a.run_is_entry and run_path.resolve().parent.name == run["series"]:
        return run_path.resolve().parent
    root = Path(a.history) if a.history else history.default_folder()
    folder = root / run["series"]
    if not folder.is_dir() and not a.run_is_entry:
        folder = root / history.newest_series(run["fingerprint"], root)
    return folder


def _main(a) -> int:
    run_path = Path(a.run)
    run = load_run(run_path)
    a.run_is_entry = is_entry(history.read_json(run_path))  # its series recorded, not derived
    errors: list = []
    if a.baseline:
        bp = Path(a.baseline)
        if bp.is_file():
            bdoc = history.load(bp)
            base_doc = bdoc if is_entry(bdoc) else load_run(bp)
            bpath = bp
            folder = bp.parent if is_entry(bdoc) else None
            if same_run(run, base_doc, a.run_is_entry and is_entry(bdoc)) or bp.resolve() == run_path.resolve():
                raise InputError(f"{bp}: --baseline: this is the run itself (the same measurements as {run_path}): "
                                 f"a run is never its own baseline; name an earlier entry or its series folder")
        elif bp.is_dir():
            bpath, base_doc, folder = None, None, bp
        else:
            raise InputError(f"{bp}: --baseline: no such file or folder")
    else:
        bpath, base_doc, folder = None, None, _series_folder(a, run, run_path)
    entries, itself = [], None
    if folder is not None and folder.is_dir():
        entries = load_entries(earlier_files(folder, run_path, up_to=bpath), errors)
        entries, itself = without_the_run(run, run_path, entries, a.run_is_entry)
    if itself is not None:
        print(f"gate: note: {itself} is this run itself (the entry its run stored): left out, with any entry after "
              f"it; a run is never its own baseline")
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
        where = a.baseline or folder
        msg = (f"no baseline for series {run['series']!r}: no earlier entry in {where}"
               f"{' other than the run itself' if itself is not None else ''}: nothing to compare")
        if a.allow_new_series:
            print(f"gate: {msg}; a run that starts its series (--allow-new-series): NOTHING WAS COMPARED.")
            return EXIT_PASS
        raise InputError(f"{run_path}: {msg}. Store a baseline first: `inference-conformance run` of the unchanged "
                         f"code writes it there (3 or more earlier entries for a verdict); or name one with --baseline, "
                         f"or the history folder with --history (default: ${history.HISTORY_ENV}, else where run writes)")
    check_device(run, run_path, base_doc, bpath, "the baseline")
    check_settings(run, run_path, base_doc, bpath, "the baseline")
    earlier = []
    if a.window > 0:
        for q, doc in entries:
            check_device(run, run_path, doc, q, "this history entry")
            check_settings(run, run_path, doc, q, "this history entry")
            earlier.append(doc)
        earlier = earlier[-a.window:]
    warn_unpinned([(f"the run {run_path}", run), (f"the baseline {bpath}", base_doc)])
    base = base_doc
    if a.run_is_entry and base.get("series") and base["series"] != run["series"]:
        print(f"gate: warning: baseline series {base['series']!r} differs from the run's {run['series']!r}")
    decisions = gate(run, base, threshold=a.threshold, alpha=a.alpha, history=earlier, normalize=not a.no_normalize,
                     hard_limit=None if a.hard_limit == float("inf") else a.hard_limit, timer=measured(run)["timer"])
    how = "" if a.no_normalize else f", relative to the run's speed where {MIN_NORMALIZE}+ benchmarks allow"
    bfp = base.get("fingerprint") or {}
    named = ", ".join(x for x in ((bfp.get("commit") or "")[:10], bfp.get("date") or "") if x)
    print(f"gate: run {run_path} vs baseline {bpath or a.baseline}{f' ({named})' if named else ''} "
          f"(threshold {a.threshold:.0%}, hard limit {a.hard_limit:g}x, "
          f"run-level alpha {a.alpha:g}, Holm; {len(earlier)} earlier entries for the between-run model{how})")
    code = print_decisions(decisions, strict=a.strict)
    ungated = sum(d.status == "ungated" for d in decisions)
    if ungated:
        print(f"gate: note: {ungated} benchmark(s) not gated: one timed round, or rounds within {TIMER_TICKS} ticks "
              f"of the timer: no measurement of the code's speed (see 'ungated' above)")
    key, words = gate_modes.mode_of(decisions, passes_of(run), any(d.name == RUN_SPEED for d in decisions))
    for line in gate_modes.statement(key, words, len(earlier)):
        print(line)
    counts = {s: sum(d.status == s for d in decisions) for s in ("regression", "improvement", "missing", "new")}
    drift = {k: v for k, v in ceiling_drift(run, base).items() if abs(v) > a.threshold}
    if drift:
        print("gate: WARNING: the machine's measured ceilings changed since the baseline ("
              + ", ".join(f"{k} {v:+.0%}" for k, v in drift.items())
              + "): the machine may be busier or different; read the verdicts with care"
              + (" (the two were measured with different sizes: quick vs full)"
                 if (run.get("ceilings") or {}).get("quick") != (base.get("ceilings") or {}).get("quick") else ""))
    versions = version_notes(measured(base), measured(run))
    if versions:
        print(f"gate: note: library versions differ ({'; '.join(versions)}): their effect is part of the verdicts")
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
              f"({counts['new']} new): nothing was compared (a renamed benchmark or another -k selection: compare "
              f"runs of the same benchmarks)", file=sys.stderr)
        return EXIT_INPUT
    return code


if __name__ == "__main__":
    sys.exit(main())
