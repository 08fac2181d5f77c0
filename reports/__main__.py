"""``python -m reports``: run the conformance properties and benchmarks, write reports/out/.

Steps (each prints its progress; a failing property never stops the report):

1. the properties and the suite's analytic tests, in parallel (``pytest -n 2``, ci profile),
   writing result rows (one JSON-lines file per pytest process) into ``reports/out/rows/``;
2. the benchmarks, serially (pytest-benchmark disables itself under xdist), with
   ``--benchmark-enable --benchmark-json`` (raw per-round samples included), in the pinned
   benchmark environment (:func:`perf.settings.bench_settings`: on the CPU, process CPU time,
   one intra-op thread, glibc's allocator pinned), the same the A/B mode and the calibration use;
   ``--bench-passes M`` repeats them in M processes (:func:`perf.records.merge_passes`);
3. the device's ceilings (copy bandwidth, matmul peak) from ``perf/ceilings.py``;
4. a history entry ``history/<device-model>/<date>-<commit>.json`` (benchmarks + ceilings +
   fingerprint), which ``python -m perf.gate`` compares later runs with;
5. ``reports/out/index.html`` (static, opens from disk), ``report.md``, ``results.json`` and
   ``plots/``.

The exit status is 0 when the report was written, whatever the verdicts (``--strict``: 1 when
a claim fails or a bug-zoo kill rate is below 100%).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from perf import env
from perf import history as hist
from perf.records import merge_passes, records as read_records
from perf.settings import bench_settings
from reports import build

ROOT = Path(__file__).resolve().parent.parent
#: The suite's own tooling tests (browser, packaging) run in CI, not in the report.
REPORT_IGNORES = ("tests/test_browser.py", "tests/test_plugin.py")


def _stage(i: int, n: int, text: str) -> None:
    print(f"\n=== [{i}/{n}] {text}", flush=True)


def measure_ceilings(device: str, quick: bool = True) -> dict | None:
    """The device's measured ceilings from ``perf.ceilings.measure_ceilings`` (None when the
    probe fails; the report then says so)."""
    try:
        from perf.ceilings import measure_ceilings as m

        c = m(device, quick)
        return json.loads(json.dumps(c, default=str)) if c else None
    except Exception as exc:  # noqa: BLE001 - a broken probe must not stop the report
        print(f"ceilings: not measured ({type(exc).__name__}: {exc})", flush=True)
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reports", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "reports" / "out"), help="output folder")
    ap.add_argument("--device", default=None, choices=["cpu", "cuda", "auto"])
    ap.add_argument("--profile", default="ci", help="Hypothesis profile (ci, dev, thorough)")
    ap.add_argument("-n", "--workers", default="2", help="pytest-xdist workers for the properties ('0': none, 'auto')")
    ap.add_argument("--no-run", action="store_true", help="only rebuild the report from existing rows")
    ap.add_argument("--no-bench", action="store_true", help="skip the benchmarks (and the history entry)")
    ap.add_argument("--no-properties", action="store_true",
                    help="skip the properties (keep the rows of the last run): benchmarks, ceilings, history, report")
    ap.add_argument("--bench-k", default=None, metavar="EXPR", help="pytest -k expression selecting benchmarks")
    ap.add_argument("--no-history", action="store_true", help="do not append this run to history/")
    ap.add_argument("--bench-passes", type=int, default=1, metavar="M",
                    help="run the benchmarks in M separate processes and store the geometric mean of their "
                         "medians: each process has its own memory layout, so M > 1 narrows the run-to-run "
                         "spread the history gate sees (see README, 'Which mode in CI')")
    ap.add_argument("--history", default=str(hist.HISTORY), help="history folder")
    ap.add_argument("--bench-max-time", type=float, default=None,
                    help="pytest-benchmark --benchmark-max-time (default 0.2 s on cpu, 1 s on cuda)")
    ap.add_argument("--model", default=None, metavar="PATH",
                    help="run the model-level claims (KV-1, KV-2, FA-3 on a real layer) on this checkpoint: a "
                         "Hugging Face Llama folder or a world checkpoint (default: the shipped target)")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a claim fails or a kill rate < 100%%")
    ap.add_argument("pytest_args", nargs="*", help="extra arguments passed to pytest (after --)")
    args = ap.parse_args(argv)
    if args.bench_passes < 1:
        ap.error("--bench-passes must be >= 1")
    from conformance.device import select_device

    device = select_device(args.device)
    out = Path(args.out)
    rows_dir = out / "rows"
    bench_json = out / "benchmarks.json"
    history_dir = Path(args.history)
    t0 = time.time()
    n_stages = 5
    ceilings = None
    if not args.no_run:
        bench_rows = rows_dir / "bench"
        if not args.no_properties and rows_dir.exists():
            shutil.rmtree(rows_dir)
        if bench_rows.exists():
            shutil.rmtree(bench_rows)
        bench_rows.mkdir(parents=True)
        if bench_json.exists():
            bench_json.unlink()
        common = ["-p", "no:cacheprovider", f"--hypothesis-profile={args.profile}", f"--device={device}"]
        if args.model:
            common.append(f"--model={Path(args.model).resolve()}")
        if not args.no_properties:
            cmd = [sys.executable, "-m", "pytest", "properties", "tests", "-q", "--benchmark-disable",
                   f"--results={rows_dir}", "--durations=10", *common]
            cmd += [f"--ignore={p}" for p in REPORT_IGNORES]
            if args.workers not in ("0", "") and importlib.util.find_spec("xdist") is not None:
                cmd += ["-n", args.workers]
            cmd += args.pytest_args
            _stage(1, n_stages, "properties and analytic tests: " + " ".join(cmd[2:]))
            subprocess.call(cmd, cwd=ROOT)
        if not args.no_bench:
            max_time = args.bench_max_time or (1.0 if device == "cuda" else 0.2)
            settings = dict(bench_settings(device), passes=args.bench_passes)
            jsons = ([bench_json] if args.bench_passes == 1 else
                     [out / f"benchmarks-pass{i}.json" for i in range(args.bench_passes)])
            for i, one_json in enumerate(jsons):
                cmd = [sys.executable, "-m", "pytest", "benchmarks", "-q", "--benchmark-enable",
                       f"--benchmark-json={one_json}", f"--benchmark-max-time={max_time}",
                       "--benchmark-min-rounds=5", "--durations=10", *settings["pytest_args"], *common]
                cmd += [f"--results={bench_rows}"] if i == 0 else []  # the claims' rows: first pass only
                if args.bench_k:
                    cmd += ["-k", args.bench_k]
                cmd += args.pytest_args
                _stage(2, n_stages, f"benchmarks, pass {i + 1}/{len(jsons)}: "
                       + " ".join(f"{k}={v}" for k, v in settings["env"].items()) + " " + " ".join(cmd[2:]))
                subprocess.call(cmd, cwd=ROOT, env=dict(os.environ, **settings["env"]))
            if len(jsons) > 1:
                merged = merge_passes([read_records(j) for j in jsons])
                bench_json.write_text(json.dumps({"benchmarks": merged, "passes": len(jsons)}))
            _stage(3, n_stages, f"device ceilings ({device})")
            ceilings = measure_ceilings(device, quick=False)
            print(f"ceilings: {ceilings}", flush=True)
    elif (out / "results.json").exists():
        try:
            ceilings = json.loads((out / "results.json").read_text()).get("ceilings") or None
        except ValueError:
            ceilings = None
    fp = env.fingerprint(device)
    records = read_records(bench_json)
    # outside rows are named by their place (impl, impl2), not their target: never a series entry
    outside = any(a == "--impl" or a.startswith("--impl=") for a in args.pytest_args)
    if outside and records and not (args.no_run or args.no_bench or args.no_history):
        print("history: not appended (--impl: the outside implementations' rows are named impl, impl2, ... "
              "whatever their targets; compare two targets with python -m perf.ab --impl-a ... --impl-b ...)",
              flush=True)
    if not args.no_run and not args.no_bench and not args.no_history and records and not outside:
        _stage(4, n_stages, "history")
        path = hist.append(hist.make_entry(fp, records, ceilings, settings=settings), history_dir)
        print(f"appended {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}", flush=True)
    _stage(5, n_stages, "report")
    paths = build.write_report(rows_dir, out, bench_json=bench_json, ceilings=ceilings, fp=fp,
                               history_dir=history_dir)
    doc = json.loads((out / "results.json").read_text())
    s = doc["summary"]
    print(f"{s['total']} claims: {s['checked']} checked, {s['holding']} holding, {s['failing']} failing, "
          f"{s['not_measured']} not measured on this device, {s['not_checked']} without a check")
    for t, k in doc["killrates"].items():
        print(f"bug zoo {t}: {k['killed']}/{k['total']} rejected")
    for p in paths:
        print(f"wrote {p}")
    print(f"done in {time.time() - t0:.0f} s")
    if args.strict and (s["failing"] or any(k["rate"] not in (None, 1.0) for k in doc["killrates"].values())):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
