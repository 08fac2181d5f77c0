"""Which mode the gate judged a run in, and that mode's false-alarm rate on unchanged code as
the calibration measured it (``perf/calibration/gate_calibration.json``, written by
``python -m inference_conformance.perf.calibrate analyse`` from A/A runs), for the gate to state
beside its verdicts.

The modes: **one baseline** (fewer than ``MIN_HISTORY`` earlier entries: the run's rounds against
one entry; no run-to-run spread is measured, so no verdict and no false alarm, and no power
either), and the **history** modes (the between-run model over the earlier entries) by passes
per run (``inference-conformance run --bench-passes``: 1, 3, 5) and by whether each benchmark was
judged relative to the run's speed or on raw medians; their rate also depends on how many
earlier entries the model had (``false_alarm_by_window``). A mode whose measured rate is above
:data:`CI_RATE` is said to be a trend warning, not a CI gate, with the modes that are.
"""
from __future__ import annotations

import json
from importlib import resources

from inference_conformance.perf.stats import MIN_HISTORY

#: The calibration the gate quotes (the committed result of ``calibrate analyse``).
CALIBRATION = resources.files("inference_conformance.perf") / "calibration" / "gate_calibration.json"
#: The most false alarms on unchanged code (share of A/A runs failed) of a mode that gates CI.
CI_RATE = 0.05
#: Passes per run the calibration measured the history mode at.
MEASURED_PASSES = (1, 3, 5)


def history_key(passes: int, normalize: bool) -> str:
    """The calibration's key of the history mode at ``passes`` passes per run, relative to the
    run's speed (``normalize``) or on raw medians: "history", "history_3_passes_raw", ..."""
    return "history" + (f"_{passes}_passes" if passes > 1 else "") + ("" if normalize else "_raw")


def mode_of(decisions: list, passes: int, normalized: bool) -> tuple[str, str]:
    """(calibration key, words) of the mode ``decisions`` were made in: one baseline when no
    benchmark was judged by the between-run model, else the history mode at the largest measured
    pass count not above ``passes``, ``normalized`` (the run-speed row was judged) or raw."""
    if not any(d.basis == "between-run" for d in decisions):
        return "one_baseline", (f"one baseline (fewer than {MIN_HISTORY} earlier entries: no run-to-run spread "
                                f"measured, no verdict)")
    m = max(k for k in MEASURED_PASSES if k <= max(1, passes))
    return history_key(m, normalized), (f"history, {passes} pass{'es' if passes > 1 else ''} per run, "
                                        + ("relative to the run's speed" if normalized else "raw medians"))


def measured_rate(key: str, window: int, path=CALIBRATION) -> dict | None:
    """The calibration's false-alarm rate of mode ``key`` with the nearest measured window not
    above ``window`` earlier entries (the mode's own rate when no window was measured apart):
    {"hits", "n", "rate", "ci95", "window", "where"}; None when the mode was not measured or the
    file is missing or unreadable."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    cals = [c for c in doc.get("calibrations", []) if c.get("lockstep")] or doc.get("calibrations", [])
    if not cals:
        return None
    cal = cals[0]
    fa = (cal.get("modes", {}).get(key) or {}).get("false_alarm")
    win = cal.get("settings", {}).get("window")
    by_window = {int(w): r for w, r in (cal.get("false_alarm_by_window", {}).get(key) or {}).items()}
    fits = [w for w in by_window if w <= window]
    if fits and (win is None or window < win):
        win = max(fits)
        fa = by_window[win]
    if not fa or fa.get("rate") is None:
        return None
    m = doc.get("machine", {})
    where = (f"{len(cal.get('benchmarks', []))} CPU benchmarks on {m.get('cpu', 'the calibration machine')} "
             f"({m.get('cores', '?')} cores, load {cal.get('loadavg_1min', ['?'])[0]:.1f}-"
             f"{cal.get('loadavg_1min', ['?', '?'])[-1]:.1f}), analysed {cal.get('date', '')[:10]}")
    return dict(fa, window=win, where=where)


def statement(key: str, words: str, window: int, path=CALIBRATION, prog: str = "gate") -> list[str]:
    """The lines the gate (``prog``) prints about its mode: the measured false-alarm rate on
    unchanged code, and, above :data:`CI_RATE`, that this mode is a trend warning and which modes
    gate CI. ``window``: the earlier entries the history model had (the A/B mode: its pairs)."""
    r = measured_rate(key, window, path)
    if key == "ab" and r is not None:
        return [f"{prog}: mode: {words}: false alarms on unchanged code {r['hits']}/{r['n']} sessions = {r['rate']:.0%}"
                f" [95% CI {r['ci95'][0]:.0%}, {r['ci95'][1]:.0%}] (calibration: sessions of 10 lockstep pairs, "
                f"{r['where']})"]
    if key == "one_baseline":
        line = (f"{prog}: mode: {words}: it calls no regression, so no false alarm on unchanged code"
                + (f" (measured {r['hits']}/{r['n']})" if r else "")
                + ", and catches none either: store 3 or more runs of the unchanged code, or use inference-conformance ab")
        return [line]
    if r is None:
        return [f"{prog}: mode: {words}: its false-alarm rate on unchanged code was not measured "
                f"({path.name} has no {key!r}): read a regression as a warning until it is"]
    ci = f" [95% CI {r['ci95'][0]:.0%}, {r['ci95'][1]:.0%}]" if r.get("ci95") else ""
    lines = [f"{prog}: mode: {words}, {window} earlier entries: false alarms on unchanged code {r['hits']}/{r['n']} = "
             f"{r['rate']:.0%}{ci} (calibration at {r['window']} earlier entries: {r['where']})"]
    if r["rate"] > CI_RATE:
        lines.append(f"{prog}: WARNING: this mode failed more than {CI_RATE:.0%} of runs of unchanged code in the "
                     f"calibration: read its regressions as a trend warning; to gate CI take runs of 5 passes "
                     f"(inference-conformance run --bench-passes 5) or the interleaved A/B mode (inference-conformance ab)")
    return lines
