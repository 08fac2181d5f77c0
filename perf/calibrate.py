"""``python -m inference_conformance.perf.calibrate collect|analyse``: the gate's own test of calibration (A/A runs).

Not part of CI (it takes about an hour on a 2-core machine). Two steps:

``collect`` runs interleaved sessions (:func:`inference_conformance.perf.ab.session`) of this checkout against
itself, alternating two kinds: **A/A** (both sides unchanged code) and **injected** (side B with a
``(1 + fraction)`` slowdown of one benchmark, :mod:`inference_conformance.perf.inject`). Every pass is one
``pytest benchmarks --benchmark-enable`` process on a small subset (``-k``); each pass also
records the machine's quick ceilings. The passes are appended, one session per line, to a JSON
lines file.

``analyse`` reads that file and measures, with 95% Clopper-Pearson intervals
(``scipy.stats.binomtest(...).proportion_ci(method="exact")``):

- **history mode** (:func:`inference_conformance.perf.gate.gate` with the default window): every unchanged pass,
  in time order, judged against the ``window`` unchanged passes before it (as a CI job judges
  its run against the series' last entries): the run-level false-alarm rate (share of runs with
  at least one "regression"); every injected pass judged the same way against the unchanged
  passes before it: the power (share where the injected benchmark is a "regression");
- **rounds only** (the former rule: one baseline, the rounds' Mann-Whitney test, no between-run
  model), for comparison, on the same passes;
- **A/B mode** (:func:`inference_conformance.perf.ab.decide`): each A/A session's false alarm and each injected
  session's detection;
- the between-run noise: per benchmark, the standard deviation of ln(median) over the unchanged
  passes, raw and normalised by the pass's own measured ceilings (copy bandwidth, float32 matmul
  peak), to see whether normalising by machine speed helps.

The result (``perf/calibration/gate_calibration.json``) is committed; the report shows it.
"""
from __future__ import annotations

import argparse
import importlib.resources
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from inference_conformance.perf import ab, inject, settings
from inference_conformance.perf.calibration_analysis import MODE_LABELS, analyse
from inference_conformance.perf.env import ROOT, cpu_model
from inference_conformance.perf.gate import DEFAULT_WINDOW
from inference_conformance.perf.stats import DEFAULT_ALPHA

#: The calibration's data: the raw passes ``collect`` appends to and the result ``analyse`` writes.
CAL_DIR = Path(str(importlib.resources.files("inference_conformance.perf") / "calibration"))
RESULT = CAL_DIR / "gate_calibration.json"
#: The committed raw passes, one file per design: lockstep pairs (the default), and sequential
#: passes with the CPU and the wall timer.
RAWS = (CAL_DIR / "passes_cpu_lockstep.jsonl", CAL_DIR / "passes_cpu.jsonl", CAL_DIR / "passes_wall.jsonl")
#: The subset of benchmarks the calibration runs (well under a minute per pass on 2 CPU cores).
DEFAULT_K = "bench_decode or prefill[128-naive-64 or prefill[128-torch-64"
#: The benchmarks slowed down in the injected sessions: one of the quieter ones and the noisiest
#: one of the subset (a pilot's between-pass spread: about 5% and 30% on the shared 2-core machine).
DEFAULT_TARGETS = ("test_bench_prefill[128-naive-64-causal]", "test_bench_decode[2048-B1H8-torch]")
KEEP_SAMPLES = 60


def _compact(records: list[dict]) -> dict[str, dict]:
    out = {}
    for r in records:
        med = (r.get("stats") or {}).get("median")
        if not med:
            continue
        data = r.get("data") or []
        if len(data) > KEEP_SAMPLES:
            step = len(data) / KEEP_SAMPLES
            data = [data[int(i * step)] for i in range(KEEP_SAMPLES)]
        out[r["fullname"]] = {"median": float(f"{med:.5g}"), "data": [float(f"{x:.4g}") for x in data],
                              "injected": (r.get("extra_info") or {}).get("injected_slowdown", 0.0)}
    return out


def collect(sessions: int, pairs: int, k: str, targets: list[str], fraction: float, out: Path,
            device: str = "cpu", threads: int | None = 1, timer: str = "cpu", lockstep: bool = True,
            max_time: float = 0.2, log=print) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    args = ["-p", "inference_conformance.perf.inject"] + ab.timer_args(timer)
    for s in range(sessions):
        kind = "aa" if s % 2 == 0 else "injected"
        env_a = dict(settings.pinned_env(device, threads or 0), **{inject.ENV: ""})
        env_b = dict(env_a, **{inject.ENV: ",".join(f"{t}={fraction}" for t in targets) if kind == "injected" else ""})
        t0 = time.time()
        with tempfile.TemporaryDirectory(prefix="calib-") as tmp:
            passes = ab.session(ROOT, ROOT, pairs, workdir=Path(tmp), env_a=env_a, env_b=env_b,
                                args_a=args, args_b=args, k=k, device=device, ceilings=True, log=log,
                                lockstep=lockstep, max_time=max_time)
        doc = {"session": s, "kind": kind, "pairs": pairs, "k": k, "targets": list(targets), "threads": threads,
               "timer": timer, "lockstep": lockstep, "max_time": max_time, "pinned": {k: v for k, v in env_a.items() if k != inject.ENV},
               "fraction": fraction if kind == "injected" else 0.0, "start": t0, "seconds": time.time() - t0,
               "loadavg": os.getloadavg(), "passes": [
                   {"side": p["side"], "pair": p["pair"], "start": p["start"], "seconds": p["seconds"],
                    "ceilings": p["ceilings"], "benchmarks": _compact(p["records"])} for p in passes]}
        with out.open("a") as f:
            f.write(json.dumps(doc) + "\n")
        log(f"calibrate: session {s + 1}/{sessions} ({kind}) in {time.time() - t0:.0f} s")


def load_raw(path: Path) -> list[dict]:
    """The sessions of a ``collect`` JSON lines file, oldest first."""
    out = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return sorted(out, key=lambda d: d["start"])


def _fmt(r: dict) -> str:
    if r["rate"] is None:
        return "n/a (no runs)"
    if r["ci95"] is None:
        return f"{r['hits']}/{r['n']} = {r['rate']:.1%} (resampled)"
    return f"{r['hits']}/{r['n']} = {r['rate']:.0%} [95% CI {r['ci95'][0]:.0%}, {r['ci95'][1]:.0%}]"


def summary_text(res: dict) -> str:
    lines = [f"calibration ({res['timer']} timer): subset -k {res['subset_k']!r}, {res['sessions']['aa']} A/A + "
             f"{res['sessions']['injected']} injected sessions of {res['pairs']} pairs, "
             f"{res['passes']} passes ({res['seconds_per_pass']:.0f} s each), injected "
             f"+{res['fraction']:.0%} into {', '.join(res['targets'])}",
             f"settings: threshold {res['settings']['threshold']:.0%}, run-level alpha {res['settings']['alpha']:g} "
             f"(Holm), window {res['settings']['window']}"]
    for mode, m in res["modes"].items():
        lines.append(f"{mode}: false alarms {_fmt(m['false_alarm'])}")
        for t, r in m["power"].items():
            lines.append(f"{mode}: power vs +{res['fraction']:.0%} on {t}: {_fmt(r)}")
    for t, e in res["injected_effect"].items():
        if e["mean_ln_ratio"] is not None:
            lines.append(f"injection check {t}: mean ln(B/A) {e['mean_ln_ratio']:.3f} (se {e['se_mean'] or 0:.3f}) "
                         f"over {e['pairs']} pairs "
                         f"(ln(1 + {res['fraction']:g}) = {np.log1p(res['fraction']):.3f})")
    for n, e in res["detectable"].items():
        lines.append(f"detectable with 90% power {n}: " + ", ".join(
            f"{k} {v:.0%}" if isinstance(v, float) else f"{k} {v}" for k, v in e.items()))
    if res.get("ceilings_missing"):
        lines.append(f"WARNING: {res['ceilings_missing']} of {res['passes']} passes have no ceilings "
                     f"({'; '.join(res['ceilings_errors']) or 'not measured'}): no normalisation by them")
    for n, e in res["noise"].items():
        lines.append(f"noise {n}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                                for k, v in e.items()))
    return "\n".join(lines)


def _design(res: dict) -> str:
    """How a calibration's pairs ran: lockstep (with the pinned allocator and rounds filling the
    time budget) or the former sequential passes."""
    return "lockstep pairs" if res.get("lockstep") else "sequential passes"


def report_table(doc: dict) -> dict:
    """The calibration as the report shows it (``analyse`` stores it under ``"report"`` in the
    result JSON, which the report reads as data): the machine, one entry per calibration run,
    one row per (timer, mode) with the run-level false-alarm rate and the power per injected
    benchmark as text with 95% Clopper-Pearson intervals, and the injected benchmarks."""
    rows, runs = [], []
    for res in doc.get("calibrations", []):
        runs.append({"timer": res["timer"], "design": _design(res), "subset": res["subset_k"], "benchmarks": len(res["benchmarks"]),
                     "sessions": res["sessions"], "pairs": res["pairs"], "passes": res["passes"],
                     "seconds_per_pass": round(res["seconds_per_pass"], 1),
                     "seconds_per_session": round(res["seconds_per_session"]),
                     "loadavg": [round(x, 1) for x in res["loadavg_1min"]], "threads": res.get("threads"), "date": res["date"],
                     "fraction": res["fraction"], "settings": res["settings"]})
        for mode, m in res["modes"].items():
            rows.append({"timer": res["timer"], "design": _design(res), "mode": MODE_LABELS.get(mode, mode),
                         "false_alarm": _fmt(m["false_alarm"]),
                         "power": {t.split("::")[-1]: _fmt(r) for t, r in m["power"].items()}})
    targets = sorted({t for r in rows for t in r["power"]})
    return {"machine": doc.get("machine", {}), "runs": runs, "rows": rows, "targets": targets}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m inference_conformance.perf.calibrate", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="run A/A and injected interleaved sessions, append them to RAW")
    c.add_argument("--sessions", type=int, default=20, help="sessions, alternately A/A and injected")
    c.add_argument("--pairs", type=int, default=ab.DEFAULT_PAIRS)
    c.add_argument("-k", dest="k", default=DEFAULT_K, help="pytest -k expression: the benchmark subset")
    c.add_argument("--target", action="append", default=None,
                   help="node id (substring) of a benchmark slowed down (repeatable; default: DEFAULT_TARGETS)")
    c.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every pass (0: torch's default)")
    c.add_argument("--fraction", type=float, default=0.15, help="injected slowdown")
    c.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    c.add_argument("--timer", default="cpu", choices=["cpu", "wall"],
                   help="pytest-benchmark's timer: process CPU time (time.process_time) or wall time")
    c.add_argument("--sequential", action="store_true",
                   help="run the passes of a pair one after the other (default: lockstep, see inference_conformance.perf.lockstep)")
    c.add_argument("--max-time", type=float, default=0.2, help="--benchmark-max-time of every pass")
    c.add_argument("--raw", default=None,
                   help="JSON lines file to append to (default: passes_<timer>[_lockstep].jsonl)")
    a_ = sub.add_parser("analyse", help="measure false alarms and power from the raw files, write the result JSON")
    a_.add_argument("--raw", action="append", default=None, help="raw JSON lines file (repeatable; default: RAWS)")
    a_.add_argument("--out", default=str(RESULT))
    a_.add_argument("--threshold", type=float, default=0.10)
    a_.add_argument("--alpha", type=float, default=DEFAULT_ALPHA)
    a_.add_argument("--window", type=int, default=DEFAULT_WINDOW)
    a = ap.parse_args(argv)
    if a.cmd == "collect":
        raw = a.raw or CAL_DIR / f"passes_{a.timer}{'' if a.sequential else '_lockstep'}.jsonl"
        collect(a.sessions, a.pairs, a.k, a.target or list(DEFAULT_TARGETS), a.fraction, Path(raw), a.device,
                a.threads or None, a.timer, lockstep=not a.sequential, max_time=a.max_time)
        return 0
    results = []
    for raw in a.raw or [str(p) for p in RAWS if p.exists()]:
        res = analyse(load_raw(Path(raw)), threshold=a.threshold, alpha=a.alpha, window=a.window)
        res["raw"] = Path(raw).name
        results.append(res)
        print(summary_text(res) + "\n")
    doc = {"machine": {"cpu": cpu_model(), "cores": os.cpu_count()}, "calibrations": results}
    doc["report"] = report_table(doc)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
