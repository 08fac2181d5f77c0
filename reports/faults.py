"""``python -m inference_conformance.reports.faults --kills 20``: kill ``python -m inference_conformance.reports`` at random moments and
check
that nothing is lost or mixed (not part of CI: it takes minutes).

First one complete run; then, ``--kills`` times: start a run, SIGKILL its parent process at a
random moment of a run's duration (what ``timeout -s KILL`` or the OOM killer does), check that
no process of its pytest children's group is left and that the folder still publishes a complete
report; run again to the end and check the same, with nothing left behind. Each check walks the
output folder and the history folder: every file under its final name is whole (JSON parses,
each JSON line parses, HTML ends with ``</html>``, PNG with its IEND chunk) and, after a
finished run, no temporary or scratch file is left. By default the runs are tiny (one quick test
file, one benchmark, quick ceilings, a history folder of their own); ``-- ARGS`` replaces the
arguments of ``python -m inference_conformance.reports`` after ``--out`` and ``--history``.

Exit status 0 when every check held, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from inference_conformance.reports import publish

ROOT = Path(__file__).resolve().parent.parent
#: The tiny run: one quick test file, one benchmark, quick ceilings.
TINY = ["--select", "tests/test_fields.py", "-n", "0", "--bench-k", "test_bench_prefill and 128-torch-64-full",
        "--bench-max-time", "0.01", "--quick-ceilings"]
PNG_END = b"IEND\xaeB`\x82"


def whole(path: Path) -> str:
    """'' when the file at ``path`` is whole, else what is wrong with it."""
    data = path.read_bytes()
    try:
        if path.suffix == ".json":
            json.loads(data)
        elif path.suffix == ".jsonl":
            if data and not data.endswith(b"\n"):
                return "last line cut"
            for line in data.splitlines():
                json.loads(line)
        elif path.suffix == ".html" and not data.rstrip().endswith(b"</html>"):
            return "no closing </html>"
        elif path.suffix == ".png" and not data.endswith(PNG_END):
            return "no PNG end chunk"
        elif path.suffix == ".md" and not data.strip():
            return "empty"
    except ValueError as exc:
        return f"does not parse ({exc})"
    return ""


def check_tree(*roots: Path) -> dict[str, list[str]]:
    """Walk ``roots``: ``truncated``: files under a final name that are not whole; ``leftovers``:
    temporary and scratch files (:func:`inference_conformance.reports.publish.is_scratch`)."""
    found: dict[str, list[str]] = {"truncated": [], "leftovers": []}
    for root in roots:
        for folder, dirs, files in os.walk(root):
            for d in list(dirs):
                if publish.is_scratch(d):
                    found["leftovers"].append(str(Path(folder, d)))
                    dirs.remove(d)
            for f in files:
                p = Path(folder, f)
                if publish.is_scratch(f):
                    found["leftovers"].append(str(p))
                elif not p.is_symlink() and (why := whole(p)):
                    found["truncated"].append(f"{p}: {why}")
    return found


def check_published(out: Path) -> list[str]:
    """What is wrong with the report ``out`` publishes (empty: a complete run, every published
    name resolving into it, its results, report and manifest agreeing)."""
    out = Path(out)
    rid = publish.published(out)
    if rid is None:
        return [f"{out} publishes no run (no {publish.CURRENT} link)"]
    m = publish.read_manifest(out / publish.CURRENT)
    if m is None or m.get("status") != "complete" or m["id"] != rid:
        return [f"published run {rid}: manifest {m and m.get('status')!r}, not complete"]
    bad = [f"{name} does not resolve" for name in ("index.html", "report.md", "results.json", "rows", "manifest.json")
           if not (out / name).exists()]
    if bad:
        return bad
    doc = json.loads((out / "results.json").read_text())
    if (doc.get("run") or {}).get("id") != rid:
        bad.append(f"results.json shows run {(doc.get('run') or {}).get('id')}, the folder publishes {rid}")
    if doc.get("n_rows") != m["counts"].get("rows") or len(doc.get("rows", [])) != doc.get("n_rows"):
        bad.append(f"rows: results.json {doc.get('n_rows')} / {len(doc.get('rows', []))}, manifest {m['counts']}")
    if rid not in (out / "report.md").read_text():
        bad.append(f"report.md does not name run {rid}")
    return bad


def reports_cmd(out: Path, history: Path, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "inference_conformance.reports", "--out", str(out), "--history", str(history), *args]


def _run(cmd: list[str], log) -> tuple[int, float]:
    t = time.time()
    rc = subprocess.call(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, CI="true"))
    return rc, time.time() - t


def newest(out: Path) -> dict | None:
    found = publish.runs(out, settle=False)
    return found[0] if found else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m inference_conformance.reports.faults", description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=20, help="how many runs to kill (default 20)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default=None, help="folder for the output, history and log (default: a new temporary one)")
    ap.add_argument("args", nargs="*", help="arguments of python -m inference_conformance.reports (default: a tiny run)")
    a = ap.parse_args(argv)
    if a.kills < 1:
        ap.error(f"--kills must be >= 1, got {a.kills}")
    work = Path(a.work or tempfile.mkdtemp(prefix="report-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    out, history = work / "out", work / "history"
    args = a.args or TINY
    rng = random.Random(a.seed)
    problems: list[str] = []
    stages: Counter = Counter()
    with open(work / "faults.log", "w") as log:
        rc, duration = _run(reports_cmd(out, history, args), log)
        if rc != 0:
            print(f"the first run failed (exit {rc}); see {work / 'faults.log'}", file=sys.stderr)
            return 1
        print(f"a complete run takes {duration:.1f} s; killing {a.kills} runs at random moments in it", flush=True)
        for i in range(a.kills):
            before = newest(out)
            at = rng.uniform(0.0, duration)
            proc = subprocess.Popen(reports_cmd(out, history, args), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                    env=dict(os.environ, CI="true"))
            time.sleep(at)
            proc.send_signal(signal.SIGKILL)
            rc = proc.wait()
            m = newest(out)
            killed = m if m and before and m["id"] != before["id"] else None
            stage = (killed or {}).get("stage", "before the run folder") if rc == -signal.SIGKILL else "finished first"
            stages[stage] += 1
            pgid = (killed or {}).get("child_pgid")
            time.sleep(0.5)
            left = publish.group_members(pgid) if pgid else []
            found = check_tree(out, history)
            bad = ([f"kill {i + 1} at {at:.1f} s: children left alive: {left}"] if left else []) + [
                f"kill {i + 1} at {at:.1f} s: truncated {t}" for t in found["truncated"]] + [
                f"kill {i + 1} at {at:.1f} s: {p}" for p in check_published(out)]
            rc2, _ = _run(reports_cmd(out, history, args), log)
            found = check_tree(out, history)
            bad += ([f"run after kill {i + 1}: exit {rc2}"] if rc2 != 0 else []) + [
                f"run after kill {i + 1}: {k} {p}" for k in found for p in found[k]] + [
                f"run after kill {i + 1}: {p}" for p in check_published(out)]
            print(f"kill {i + 1:2d}/{a.kills} at {at:5.1f} s, stage {stage!r}: "
                  f"{'ok' if not bad else str(len(bad)) + ' problems'}", flush=True)
            problems += bad
    print(f"\n{a.kills} kills; stages hit: " + ", ".join(f"{k} {v}" for k, v in sorted(stages.items())))
    print(f"problems: {len(problems)}" + "".join(f"\n  {p}" for p in problems))
    print(f"work folder: {work}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
