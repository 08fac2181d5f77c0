"""``inference-conformance run``: run the conformance properties and benchmarks, write ./inference-conformance-out/.

``python -m inference_conformance.reports`` is the same command. ``inference-conformance merge RUN... [--out DIR]``
(also ``python -m inference_conformance.reports merge``) merges run folders into one conformance matrix
(:mod:`inference_conformance.reports.merge`); ``--merge RUN`` shows other runs beside this one's in its report.
From a checkout (on ``PYTHONPATH`` or installed editable) the stages collect the checkout's
``properties``, ``tests`` and ``benchmarks`` folders; from an installed wheel they collect the
installed packages (``pytest --pyargs inference_conformance.properties``), in a pytest
configuration of the suite's own (never the current project's).

Steps (each prints its progress; a failing property never stops the report):

1. the properties and the suite's analytic tests, in parallel (``pytest -n 2``, ci profile),
   writing result rows (one JSON-lines file per pytest process);
2. the benchmarks, serially (pytest-benchmark disables itself under xdist), with
   ``--benchmark-enable --benchmark-json`` (raw per-round samples included), in the pinned
   benchmark environment (:func:`inference_conformance.perf.settings.bench_settings`: on the CPU, process CPU time,
   one intra-op thread, glibc's allocator pinned), the same the A/B mode and the calibration use;
   ``--bench-passes M`` repeats them in M processes (:func:`inference_conformance.perf.records.merge_passes`);
3. the device's ceilings (copy bandwidth, matmul peak) from ``perf/ceilings.py``;
4. a history entry ``history/<device-model>/<date>-<commit>.json`` (benchmarks + ceilings +
   fingerprint), which ``python -m inference_conformance.perf.gate`` compares later runs with;
5. ``index.html`` (static, opens from disk), ``report.md``, ``results.json`` and ``plots/``.

Each run writes into its own folder ``<out>/runs/<id>/`` with a manifest (complete or
interrupted) and is published whole at the end (:mod:`inference_conformance.reports.publish`): ``<out>/index.html``,
``report.md``, ``results.json``, ``benchmarks.json``, ``plots``, ``rows`` and ``manifest.json``
always belong to one complete run. One run at a time per output folder.

Exit status: 0 when the report was written, whatever the verdicts (``--strict``: 1 when a claim
fails or a bug-zoo kill rate is below 100%); 2 when the output folder is refused (not the
suite's, in use by another run, nothing complete to render); 128 + N when stopped by signal N
(the run is then marked interrupted and the published report stays the previous one).
"""
from __future__ import annotations

import argparse
import atexit
import gc
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from inference_conformance.conformance import atomic
from inference_conformance.perf import env
from inference_conformance.perf import history as hist
from inference_conformance.perf.records import merge_passes, records as read_records
from inference_conformance.perf.settings import bench_settings
from inference_conformance.conformance.sizes import FULL_ENV
from inference_conformance.reports import build, merge, progress, publish, selection

ROOT = publish.ROOT
#: The suite's own tooling tests (browser, packaging) run in CI, not in the report.
REPORT_IGNORES = ("tests/test_browser.py", "tests/test_plugin.py", "tests/test_cli_wheel.py")
#: The pytest configuration of an installed suite's children (a checkout uses its pyproject.toml).
INSTALLED_INI = """[pytest]
python_files = test_*.py bench_*.py
addopts = -ra
timeout = 900
filterwarnings = ignore::DeprecationWarning:triton.*
"""


class Interrupted(Exception):
    """A signal (SIGTERM, SIGINT, SIGHUP) or a pytest child killed by one stopped the run."""


def _on_signal(signum, _frame):
    raise Interrupted(f"stopped by {signal.Signals(signum).name}", 128 + signum)


class Job:
    """One invocation of the main job: its run folder's :class:`publish.Run` once started, and its
    live pytest children (killed, group by group, when it stops). Owned by :func:`main`."""

    def __init__(self) -> None:
        self.run: publish.Run | None = None
        self.children: list[subprocess.Popen] = []
        self.cwd: Path = ROOT
        #: the folder the command was run in: the children (run elsewhere) import ``--impl`` targets from it
        self.origin = Path.cwd()
        #: where the children collect: the checkout's folders, or the installed packages
        self.pyargs = not publish.CHECKOUT

    def child(self, cmd: list[str], point: str, env: dict | None = None) -> int:
        """Run one pytest child in its own process group; a child killed by a signal stops the run."""
        started = publish.now()
        env = dict(os.environ if env is None else env)
        paths = [str(self.origin / p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p] + [str(self.origin)]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))   # relative entries meant the command's folder
        proc = publish.spawn(cmd, cwd=self.cwd, env=env)
        self.children.append(proc)
        self.run.update(child_pgid=proc.pid)
        atomic.kill_point(point)
        rc = proc.wait()
        self.children.remove(proc)
        self.run.command(cmd, rc, started)
        if rc < 0 or rc >= 128:
            sig = -rc if rc < 0 else rc - 128
            raise Interrupted(f"the {point} pytest process died of signal {sig}", 128 + sig)
        return rc

    def stage(self, i: int, n: int, text: str) -> None:
        print(f"\n=== [{i}/{n}] {text}", flush=True)
        if self.run is not None:
            self.run.update(stage=text.split(":")[0])

    def pytest(self, *targets: str) -> list[str]:
        """``python -m pytest`` collecting ``targets`` (checkout folders, or the installed packages'
        names under ``--pyargs`` with the suite's own configuration file in the run folder, run
        there: never the current project's configuration or conftest)."""
        cmd = [sys.executable, "-m", "pytest"]
        if not self.pyargs:
            return cmd + list(targets)
        ini = self.run.folder / "pytest.ini"
        if not ini.exists():
            atomic.write_text(ini, INSTALLED_INI)
        self.cwd = self.run.folder
        # rootdir: the installed package, so that test ids read as from the checkout (properties/test_x.py::...)
        return cmd + ["-c", str(ini), f"--rootdir={ROOT}", "--pyargs", *targets]


def measure_ceilings(device: str, quick: bool = True) -> dict | None:
    """The device's measured ceilings from ``inference_conformance.perf.ceilings.measure_ceilings`` (None when the
    probe fails; the report then says so)."""
    try:
        from inference_conformance.perf.ceilings import measure_ceilings as m

        c = m(device, quick)
        return json.loads(json.dumps(c, default=str)) if c else None
    except Exception as exc:  # noqa: BLE001 - a broken probe must not stop the report
        print(f"ceilings: not measured ({type(exc).__name__}: {exc})", flush=True)
        return None


def ceilings_line(c: dict | None) -> str:
    """The measured ceilings in one line: "ceilings: copy 12.3 GB/s; matmul float32 45.6 GFLOP/s,
    ... (quick sizes)"; "ceilings: not measured" for None."""
    if not c:
        return "ceilings: not measured"
    peaks = ", ".join(f"{k} {float(v) / 1e9:.3g} GFLOP/s" for k, v in (c.get("matmul_flops_per_s") or {}).items())
    copy = c.get("copy_bytes_per_s")
    text = "; ".join(filter(None, (f"copy {float(copy) / 1e9:.3g} GB/s" if copy else "", f"matmul {peaks}" if peaks else "")))
    return f"ceilings: {text or 'nothing measured'}" + (" (quick sizes)" if c.get("quick") else "")


def _skip_final_collection() -> None:
    """At exit (after the atexit handlers registered later): no last collection of reference
    cycles over the modules the report imported (torch's: half a second of CPU per run), unless
    Triton's compiled module is loaded (nanobind then reports its uncollected objects as leaks)."""
    if "triton._C.libtriton" not in sys.modules:
        gc.freeze()


def _parser(prog: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0].replace("``", ""))
    ap.add_argument("--out", default=None,
                    help=f"output folder (default: ./{publish.OUT_NAME} under the current folder): a new or empty "
                         f"one, or one an earlier run made (it carries the {publish.MARKER} marker); any other "
                         "folder is refused")
    ap.add_argument("--impl", action="append", default=[], metavar="TECHNIQUE=MODULE:ATTR",
                    help="check this outside implementation (repeatable; pytest's --impl): only its technique's "
                         "properties run, against it")
    ap.add_argument("--engine-url", default=None, metavar="URL", help="judge the OpenAI-compatible server at URL "
                    "(http://host:8000/v1) as an engine (pytest's --engine-url): only the engine laws run, against it")
    ap.add_argument("--device", default=None, choices=["cpu", "cuda", "auto"])
    ap.add_argument("--profile", default="ci", help="Hypothesis profile (ci, dev, thorough)")
    ap.add_argument("-n", "--workers", default="2", help="pytest-xdist workers for the properties ('0': none, 'auto')")
    ap.add_argument("--no-run", action="store_true",
                    help="only rebuild the report from the rows of the newest complete run")
    ap.add_argument("--no-bench", action="store_true", help="skip the benchmarks (and the history entry)")
    ap.add_argument("--no-properties", action="store_true",
                    help="skip the properties (keep the rows of the last complete run): benchmarks, ceilings, "
                         "history, report")
    ap.add_argument("--select", action="append", default=None, metavar="PATH",
                    help="the properties stage runs these test paths (repeatable) instead of properties/ and tests/ "
                         "(from an installed suite: module names, e.g. inference_conformance.properties.roofline.test_roofline)")
    ap.add_argument("--bench-k", default=None, metavar="EXPR", help="pytest -k expression selecting benchmarks")
    ap.add_argument("--no-history", action="store_true", help="do not append this run to history/")
    ap.add_argument("--bench-passes", type=int, default=1, metavar="M",
                    help="run the benchmarks in M separate processes and store the geometric mean of their "
                         "medians: each process has its own memory layout, so M > 1 narrows the run-to-run "
                         "spread the history gate sees (docs/guide/benchmark-history.md, 'Which mode in CI')")
    ap.add_argument("--history", default=None,
                    help=f"history folder (default: ${hist.HISTORY_ENV} when set, else the checkout's history/; "
                         f"installed: ./{publish.OUT_NAME}/history; the gate reads the same folder)")
    ap.add_argument("--bench-max-time", type=float, default=None,
                    help="pytest-benchmark --benchmark-max-time (default 0.2 s on cpu, 1 s on cuda)")
    ap.add_argument("--quick-ceilings", action="store_true", help="measure the device's ceilings on tiny sizes")
    ap.add_argument("--model", default=None, metavar="PATH",
                    help="run the model-level claims (KV-1, KV-2, FA-3 on a real layer) on this checkpoint: a "
                         "Hugging Face Llama folder or a world checkpoint (default: the shipped target)")
    ap.add_argument("--full", action="store_true",
                    help="run the experiments at their full sizes (conformance/sizes.py; slow), not the defaults")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a claim fails or a kill rate < 100%%")
    ap.add_argument("--merge", action="append", default=[], metavar="RUN",
                    help="show this run folder's rows (pytest --results DIR, another environment's or machine's, or "
                         "a folder of them) beside this run's in the conformance matrix (repeatable; see "
                         "inference-conformance merge)")
    ap.add_argument("pytest_args", nargs="*", help="extra arguments passed to pytest (after --)")
    return ap


def main(argv: list[str] | None = None, prog: str = "inference-conformance run") -> int:
    """The main job (see the module doc); ``argv`` without the program name. Returns the exit status."""
    given = list(sys.argv[1:] if argv is None else argv)
    atexit.register(_skip_final_collection)
    if given[:1] == ["merge"]:
        return merge.main(given[1:])
    ap = _parser(prog)
    args = ap.parse_args(given)
    try:
        args.merge_runs = merge.load(args.merge)
    except merge.MergeError as exc:
        print(f"{prog}: --merge: {exc}", file=sys.stderr)
        return 2
    if args.bench_passes < 1:
        ap.error("--bench-passes must be >= 1")
    args.pytest_args += [f"--impl={i}" for i in args.impl]
    if args.engine_url:                    # an outside engine, as --impl names an outside implementation
        args.pytest_args, args.impl = args.pytest_args + [f"--engine-url={args.engine_url}"], args.impl + ["engine"]
    if args.history is None:
        args.history = str(hist.default_folder())
    default = publish.default_out()
    out = (Path(args.out).expanduser() if args.out else default).resolve()
    job = Job()
    try:
        notes = publish.prepare_out(out, default=default)
        lock = publish.Lock(out).acquire()
    except publish.Refused as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    for note in notes + [lock.note]:
        if note:
            print(f"note: {note}", file=sys.stderr, flush=True)
    handlers = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        return _main(args, out, given, job)
    except BaseException as exc:
        for proc in list(job.children):
            publish.kill_group(proc)
        refused = isinstance(exc, publish.Refused)
        reason = exc.args[0] if isinstance(exc, (Interrupted, publish.Refused)) else f"{type(exc).__name__}: {exc}"
        if refused:
            print(f"{prog}: {reason}", file=sys.stderr)
        if job.run is not None and job.run.manifest["status"] == "running":
            job.run.finish("interrupted", reason=f"{reason} during stage {job.run.manifest['stage']!r}")
            shown = publish.published(out)
            print(f"{prog}: run {job.run.id} interrupted ({reason}); {out} still shows "
                  f"{'run ' + shown if shown else 'no report'}", file=sys.stderr)
        if isinstance(exc, Interrupted):
            return exc.args[1]
        if refused:
            return 2
        raise
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
        lock.release()


def _main(args, out: Path, argv: list[str], job: Job) -> int:
    from inference_conformance.conformance.device import select_device

    device = select_device(args.device)
    earlier = publish.runs(out)  # under the lock: runs left "running" are marked interrupted
    publish.sweep(out)
    complete = [m for m in earlier if m["status"] == "complete"]
    if args.no_run and not complete:
        raise publish.Refused(f"{out} holds no complete run to render from"
                              + (f" (the newest, {earlier[0]['id']}, was {earlier[0]['status']})" if earlier else "")
                              + ": run inference-conformance run without --no-run")
    source = complete[0] if complete and (args.no_run or args.no_properties) else None
    run = job.run = publish.Run(out, "render" if args.no_run else "run", argv,
                                  source=source["id"] if source else None)
    report_notes = []
    if source is not None and earlier[0]["status"] != "complete":
        report_notes.append(f"The newest run, {earlier[0]['id']} (started {earlier[0]['started']}), was interrupted: "
                            f"{earlier[0].get('reason', '')}. {'These results are' if args.no_run else 'The properties are'}"
                            f" the rows of run {source['id']} (complete, ended {source['ended']}).")
        print(f"note: {report_notes[-1]}", file=sys.stderr, flush=True)
    if args.no_properties and not args.no_run and source is None:
        print(f"note: {out} holds no complete run: this report has no property rows", file=sys.stderr, flush=True)
    rows_dir = run.folder / "rows"
    bench_json = run.folder / "benchmarks.json"
    history_dir = Path(args.history)
    t0 = time.time()
    n_stages = 5
    ceilings = None
    settings = None
    if args.no_run:
        for name in ("rows", "benchmarks.json"):
            src = source["folder"] / name
            if src.is_dir():
                shutil.copytree(src, run.folder / name)
            elif src.is_file():
                shutil.copy2(src, run.folder / name)
        try:
            ceilings = json.loads((source["folder"] / "results.json").read_text()).get("ceilings") or None
        except (OSError, ValueError):
            ceilings = None
    else:
        scratch = run.folder / publish.ROWS_PARTIAL
        (scratch / "bench").mkdir(parents=True)
        if args.no_properties and source is not None:
            for f in (source["folder"] / "rows").glob("*.jsonl"):
                shutil.copy2(f, scratch / f.name)
        common = ["-p", "no:cacheprovider", "-p", "inference_conformance.reports.progress",
                  f"--hypothesis-profile={args.profile}", f"--device={device}"]
        sized = dict(os.environ, **{FULL_ENV: "1"} if args.full else {})
        if args.model:
            common.append(f"--model={Path(args.model).resolve()}")
        if not args.no_properties:
            own = ["inference_conformance.properties"] if job.pyargs else selection.main_job_paths(ROOT)
            cmd = job.pytest(*(args.select or own)) + ["-q", "--benchmark-disable", f"--results={scratch}",
                                                       "--durations=10", *common]
            cmd += [] if job.pyargs else [f"--ignore={p}" for p in REPORT_IGNORES]
            if args.workers not in ("0", "") and importlib.util.find_spec("xdist") is not None:
                cmd += ["-n", args.workers]
            # an outside implementation gets every check (-m claim would leave out the generic ones)
            cmd += ([] if args.select or args.impl else selection.marker_args(args.pytest_args)) + args.pytest_args
            job.stage(1, n_stages, "properties and analytic tests: " + " ".join(cmd[2:]))
            job.child(cmd, "properties", env=sized)
        if not args.no_bench:
            max_time = args.bench_max_time or (1.0 if device == "cuda" else 0.2)
            settings = dict(bench_settings(device), passes=args.bench_passes)
            names = ["benchmarks.json"] if args.bench_passes == 1 else [
                f"benchmarks-pass{i}.json" for i in range(args.bench_passes)]
            for i, name in enumerate(names):
                partial = run.folder / f".{name}.partial"
                cmd = job.pytest("inference_conformance.benchmarks" if job.pyargs else "benchmarks") + [
                       "-q", "--benchmark-enable",
                       f"--benchmark-json={partial}", f"--benchmark-max-time={max_time}",
                       "--benchmark-min-rounds=5", "--durations=10", "--experiments", *settings["pytest_args"], *common]
                cmd += [f"--results={scratch / 'bench'}"] if i == 0 else []  # the claims' rows: first pass only
                if args.bench_k:
                    cmd += ["-k", args.bench_k]
                cmd += args.pytest_args
                job.stage(2, n_stages, f"benchmarks, pass {i + 1}/{len(names)}: "
                       + " ".join(f"{k}={v}" for k, v in settings["env"].items()) + " " + " ".join(cmd[2:]))
                job.child(cmd, "benchmarks", env=dict(sized, **settings["env"]))
                if partial.exists():
                    os.replace(partial, run.folder / name)
            if len(names) > 1:
                merged = merge_passes([read_records(run.folder / j) for j in names])
                first = json.loads((run.folder / names[0]).read_text(encoding="utf-8"))  # how they were measured
                atomic.write_text(bench_json, json.dumps({"benchmarks": merged, "passes": len(names),
                                                          "settings": first.get("settings")}))
            job.stage(3, n_stages, f"device ceilings ({device})")
            ceilings = measure_ceilings(device, quick=args.quick_ceilings)
            print(ceilings_line(ceilings), flush=True)
        os.replace(scratch, rows_dir)
    fp = env.fingerprint(device)
    records = read_records(bench_json)
    # outside rows are named by their place (impl, impl2), not their target: never a series entry
    outside = any(a in ("--impl", "--engine-url") or a.startswith(("--impl=", "--engine-url=")) for a in args.pytest_args)
    if outside and records and not (args.no_run or args.no_bench or args.no_history):
        print("history: not appended (--impl: the outside implementations' rows are named impl, impl2, ... "
              "whatever their targets; compare two targets with inference-conformance ab --impl-a ... --impl-b ...)",
              flush=True)
    if not args.no_run and not args.no_bench and not args.no_history and records and not outside:
        job.stage(4, n_stages, "history")
        path = hist.append(hist.make_entry(fp, records, ceilings, settings=settings), history_dir)
        print(f"appended {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}", flush=True)
        run.update(history_entry=str(path))
    job.stage(5, n_stages, "report")
    shown = {"id": run.id, "kind": run.manifest["kind"], "started": run.manifest["started"],
             "rows_of": source["id"] if args.no_run else run.id, "notes": report_notes}
    build.write_report(rows_dir, run.folder, bench_json=bench_json, ceilings=ceilings, fp=fp,
                       history_dir=history_dir, run=shown, matrix_runs=args.merge_runs)
    doc = json.loads((run.folder / "results.json").read_text())
    s = doc["summary"]
    run.update(counts={"rows": doc["n_rows"], "benchmarks": doc["n_bench"],
                       **{k: v for k, v in s.items()}})
    run.finish("complete")
    publish.publish(out, run)
    publish.prune(out)
    print(f"{s['total']} claims: {s['checked']} checked, {s['holding']} holding ({s.get('partial', 0)} partially), "
          f"{s['failing']} failing, {s.get('inconclusive', 0)} inconclusive, "
          f"{s['not_measured']} not measured on this device, {s['not_checked']} without a check")
    for t, k in doc["killrates"].items():
        print(f"bug zoo {t}: {k['killed']}/{k['total']} rejected"
              + (f", {len(k['not_killed'])} not killed (skipped, unsupported or not run)" if k.get("not_killed") else ""))
    for line in progress.cached_results(rows_dir):
        print(f"from the experiment cache: {line}")
    print(f"published run {run.id} in {out} (index.html, report.md, results.json -> {run.folder})")
    print(f"done in {time.time() - t0:.0f} s")
    if args.strict and (s["failing"] or any(k["rate"] not in (None, 1.0) for k in doc["killrates"].values())):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
