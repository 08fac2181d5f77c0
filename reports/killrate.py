"""``python -m inference_conformance.reports.killrate``: run the bug-zoo tests and report the kill rate per technique.

Every law names the known-bad implementations it must reject (``@pytest.mark.kills``), or a zoo
test runs them through ``expect_rejected`` itself (the zoos of laws with no registry contract:
FP8 casts, KV-cache formats, tree scorers, engines); the zoo test of a law passes when the law
rejects the bad implementation. The kill rate of a technique
is the share of its (law, bad implementation) pairs rejected; it must be 100%: a law that lets
a known-bad implementation through has lost its power. Every zoo entry counts: one whose zoo
test was skipped or "unsupported", and a registered one no zoo test ran, is "not killed" and
printed with its reason. Beside it, per technique, how many
distinct known-bad implementations at least one law rejects (``bugs_killed`` of ``bugs``; the
same name in two techniques' zoos is two bugs). Exit status 1 when any rate is below 100% or no
zoo test ran.
"""
from __future__ import annotations

import argparse
import functools
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from inference_conformance.conformance.results import Row, read_rows
from inference_conformance.conformance.outcomes import Outcome, read

ROOT = Path(__file__).resolve().parent.parent


def _names(implementation: str) -> list[str]:
    """The known-bad implementations of a zoo row ("zoo:a" or, for a test that ran several
    through ``expect_rejected``, "zoo:a,b")."""
    return implementation.removeprefix("zoo:").split(",")


def _folder(check: str) -> str:
    """The technique of a test id by its place (``properties/<technique>/...``; "?" elsewhere)."""
    parts = check.split("::")[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "properties" else "?"


def registered() -> dict[str, list[str]]:
    """technique -> the names of its registered known-bad implementations
    (``properties/<technique>/zoo.py``, read statically: :func:`inference_conformance.catalog.zoo`)."""
    return {t: list(names) for t, names in _registered().items()}


@functools.lru_cache(maxsize=1)
def _registered() -> dict[str, tuple[str, ...]]:        # read once per process (every report build asks)
    from inference_conformance import catalog

    return {t: tuple(names) for t, names in catalog.zoo().items()}


#: the reason of a registered entry no zoo test of the run ran
NOT_RUN = "no zoo test ran it in this run"


def _reason(row: Row) -> str:
    text = " ".join(str(row.message or "").split())
    return f"{row.verdict}: {text[:200]}" if text else row.verdict


def kill_rates(rows: list[Row], zoo: dict[str, list[str]] | None = None) -> dict[str, dict]:
    """technique -> {killed, total, rate, survivors: [check ids], not_killed: [{check, entries,
    reason}], bugs_killed, bugs} from zoo rows (implementation ``zoo:<name>``); a zoo test that
    passed is a kill. Every zoo entry is counted: a zoo test skipped or "unsupported" is not
    killed (its reason: the row's message), and so is each registered entry of a technique
    (``zoo``, default :func:`registered`) that no zoo test of the run ran. ``killed``/``total``
    count (law, bad implementation) pairs, an entry no test ran one pair; ``bugs_killed``/``bugs``
    count distinct bad implementations of the technique rejected by at least one law."""
    zoo = registered() if zoo is None else zoo
    seen: dict[str, dict[str, Row]] = defaultdict(dict)
    for r in rows:
        if not r.implementation.startswith("zoo:"):
            continue
        technique = r.technique or _folder(r.check)
        prev = seen[technique].get(r.check)
        if prev is None or read(prev) is Outcome.PASS:
            seen[technique][r.check] = r
    out = {}
    for t, checks in sorted(seen.items()):
        killed = sum(read(r) is Outcome.PASS for r in checks.values())
        ran = {b for c, r in checks.items() for b in _names(r.implementation)}
        bugs_killed = {b for r in checks.values() if read(r) is Outcome.PASS for b in _names(r.implementation)}
        not_killed = [{"check": c, "entries": _names(r.implementation), "reason": _reason(r)}
                      for c, r in sorted(checks.items()) if read(r) is not Outcome.PASS and not read(r).new_failure]
        not_killed += [{"check": f"zoo:{b}", "entries": [b], "reason": NOT_RUN} for b in zoo.get(t, ()) if b not in ran]
        total = len(checks) + sum(n["reason"] == NOT_RUN for n in not_killed)
        out[t] = {"killed": killed, "total": total, "bugs": len(ran | set(zoo.get(t, ()))),
                  "bugs_killed": len(bugs_killed), "rate": killed / total if total else None,
                  "survivors": sorted(c for c, r in checks.items() if read(r).new_failure),
                  "not_killed": not_killed}
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
        lines += [f"    not killed: {n['check']}: {n['reason']}" for n in r.get("not_killed", ())]
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
