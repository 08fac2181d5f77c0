"""``python -m reports``: run the conformance properties and benchmarks, write reports/out/.

Writes ``reports/out/report.md`` and ``reports/out/results.json`` (every result row, the
claims ledger with verdicts, and an environment fingerprint). A failing property does not stop
the report; the exit status is 0 when the report was written, whatever the verdicts.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from reports import build

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reports", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "reports" / "out"), help="output folder")
    ap.add_argument("--device", default=None, choices=["cpu", "cuda", "auto"])
    ap.add_argument("--profile", default="ci", help="Hypothesis profile (ci, dev, thorough)")
    ap.add_argument("--no-run", action="store_true", help="only rebuild the report from existing rows")
    ap.add_argument("pytest_args", nargs="*", help="extra arguments passed to pytest")
    args = ap.parse_args(argv)
    out = Path(args.out)
    rows_dir = out / "rows"
    if not args.no_run:
        if rows_dir.exists():
            shutil.rmtree(rows_dir)
        rows_dir.mkdir(parents=True)
        cmd = [sys.executable, "-m", "pytest", "properties", "tests", "benchmarks", "-q",
               f"--results={rows_dir}", f"--hypothesis-profile={args.profile}",
               "--benchmark-enable", f"--benchmark-json={out / 'benchmarks.json'}", "-p", "no:cacheprovider"]
        if args.device:
            cmd.append(f"--device={args.device}")
        cmd += args.pytest_args
        print("running:", " ".join(cmd), flush=True)
        subprocess.call(cmd, cwd=ROOT)
    paths = build.write_report(rows_dir, out)
    for p in paths:
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
