"""``python -m inference_conformance.reports.killrate``: run the bug-zoo tests and report the kill rate per technique.

Every law names the known-bad implementations it must reject (``@pytest.mark.kills``), or a zoo
test runs them through ``expect_rejected`` itself (the zoos of laws with no registry contract:
FP8 casts, KV-cache formats, tree scorers, engines); the zoo test of a law passes when the law
rejects the bad implementation. The kill rate of a technique
is the share of its (law, bad implementation) pairs rejected; it must be 100%: a law that lets
a known-bad implementation through has lost its power. Beside it, per technique, how many
distinct known-bad implementations at least one law rejects (``bugs_killed`` of ``bugs``; the
same name in two techniques' zoos is two bugs). Exit status 1 when any rate is below 100% or no
zoo test ran.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from inference_conformance.conformance.results import Row, read_rows

ROOT = Path(__file__).resolve().parent.parent


def _names(implementation: str) -> list[str]:
    """The known-bad implementations of a zoo row ("zoo:a" or, for a test that ran several
    through ``expect_rejected``, "zoo:a,b")."""
    return implementation.removeprefix("zoo:").split(",")


def _folder(check: str) -> str:
    """The technique of a test id by its place (``properties/<technique>/...``; "?" elsewhere)."""
    parts = check.split("::")[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "properties" else "?"


def kill_rates(rows: list[Row]) -> dict[str, dict]:
    """technique -> {killed, total, rate, survivors: [check ids], bugs_killed, bugs} from zoo rows
    (implementation ``zoo:<name>``); a zoo test that passed is a kill. ``killed``/``total``
    count (law, bad implementation) pairs; ``bugs_killed``/``bugs`` count distinct bad
    implementations of the technique rejected by at least one law."""
    seen: dict[str, dict[str, str]] = defaultdict(dict)
    bug_of: dict[str, str] = {}
    for r in rows:
        if not r.implementation.startswith("zoo:"):
            continue
        bug_of[r.check] = r.implementation
        technique = r.technique or _folder(r.check)
        prev = seen[technique].get(r.check)
        if prev is None or prev == "pass":
            seen[technique][r.check] = r.verdict
    out = {}
    for t, checks in sorted(seen.items()):
        judged = {c: v for c, v in checks.items() if v in ("pass", "fail", "error")}
        killed = sum(v == "pass" for v in judged.values())
        bugs = {b for c in judged for b in _names(bug_of[c])}
        bugs_killed = {b for c, v in judged.items() if v == "pass" for b in _names(bug_of[c])}
        out[t] = {"killed": killed, "total": len(judged), "bugs": len(bugs), "bugs_killed": len(bugs_killed),
                  "rate": killed / len(judged) if judged else None,
                  "survivors": sorted(c for c, v in judged.items() if v != "pass"),
                  "skipped": sorted(c for c, v in checks.items() if c not in judged)}
    return out


def format_rates(rates: dict[str, dict]) -> str:
    if not rates:
        return "no zoo tests ran"
    lines = [f"{'technique':<20} {'killed':>7} {'total':>6} {'rate':>7}   {'bugs rejected':>13}"]
    for t, r in rates.items():
        rate = f"{r['rate']:.0%}" if r["rate"] is not None else "-"
        lines.append(f"{t:<20} {r['killed']:>7} {r['total']:>6} {rate:>7}   "
                     f"{r['bugs_killed']:>6} of {r['bugs']:<3}")
        lines += [f"    survivor: {s}" for s in r["survivors"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m inference_conformance.reports.killrate", description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=None, help="read zoo rows from this folder instead of running pytest")
    ap.add_argument("-n", default="2", help="pytest-xdist workers (0: none)")
    ap.add_argument("pytest_args", nargs="*")
    a = ap.parse_args(argv)
    if a.rows:
        rows = read_rows(a.rows)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "pytest", "properties", "--zoo-only", "-q", "-p", "no:cacheprovider",
                   f"--results={tmp}"]
            if a.n not in ("0", ""):
                cmd += ["-n", a.n]
            cmd += a.pytest_args
            print("running:", " ".join(cmd), flush=True)
            subprocess.call(cmd, cwd=ROOT)
            rows = read_rows(tmp) if any(Path(tmp).glob("*.jsonl")) else []
    rates = kill_rates(rows)
    print(format_rates(rates))
    ok = bool(rates) and all(r["rate"] == 1.0 for r in rates.values() if r["total"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
