"""Write or refresh expectation files (:mod:`inference_conformance.conformance.expectations`) from a run's rows.

    inference-conformance expect update RUN --out PATH [--builtins] [--impl NAME ...]

(also ``python -m inference_conformance.reports.expect``).

RUN is the ``--results DIR`` folder (or one rows file) of any pytest run. One file per outside
implementation (``--builtins``: the built-ins too) lists the tests it failed, refused
("unsupported") or passed only in part, with the measured error text; a failure is listed with
its signature (the exception type, the failing check, its tolerance rule and a band of one
factor :data:`inference_conformance.conformance.expectations.BAND` either side of the measured
error), so that only that failure is expected, never another failure of the same test. PATH is a folder (one
``<implementation>.toml`` per implementation) or, for one implementation, a ``.toml`` file. An
existing file is refreshed: its reasons and links are kept, the measured text is the run's, an
entry whose test ran and passed is dropped (the ratchet), and an entry whose test did not run is
kept. A kept entry's signature is kept where it admits the run's failure (a band widened by hand
stays), else rewritten from the run; a listed failure now refused ("stale expectation") is listed
as "unsupported". Each file is written whole or not at all. The command prints one line per entry
it added, rewrote or dropped ("changed: <file>: <test id>: a new failure now expected: ..."): a
new failure turned into an expectation shows in review.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from inference_conformance.conformance import atomic, expectations
from inference_conformance.conformance.outcomes import Outcome
from inference_conformance.conformance.results import Row, read_rows

NEW_REASON = "new in this run: say why it is expected"


def is_outside(name: str) -> bool:
    """An ``--impl`` target (``module:attr``), not a built-in or a zoo entry."""
    return ":" in name and not name.startswith("zoo:")


def test_id(check: str) -> str:
    """The test's id without its file: ``path.py::test_x[p-q]`` -> ``test_x[p-q]``."""
    head, bracket, params = check.partition("[")
    return head.rsplit("::", 1)[-1] + bracket + params


def file_name(impl: str, technique: str = "") -> str:
    """``<implementation>.toml`` for an outside target; ``<technique>-<name>.toml`` for a built-in
    (their names repeat across techniques), as in the suite's own ``expectations/``."""
    stem = impl if is_outside(impl) or not technique else f"{technique}-{impl}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", stem).strip("_") + ".toml"


def _signature(listed: str, failure: dict, kept) -> dict:
    """The signature fields of a refreshed entry: none unless it lists a failure; the kept
    entry's where it admits ``failure`` (or the run recorded none), else written from ``failure``
    (a row's :func:`inference_conformance.conformance.failures.failure_kind`)."""
    if not Outcome.of(listed).fails_law:
        return {}
    old = {k: getattr(kept, k) for k in expectations.SIGNATURE} if kept is not None and kept.signed else None
    kind = dict(failure)
    if kind.get("error") is not None:
        kind["error"] = float(kind["error"])              # written as "inf" where infinite
    if old is not None and (not kind or not kept.admits(kind)):
        return old
    if not kind:
        return {}
    fields = {"exception": kind.get("exception") or "AssertionError", "check": kind.get("check") or ""}
    if kind.get("rule"):
        fields["rule"] = kind["rule"]
    if kind.get("error") is not None:
        fields["error"] = expectations.band(kind["error"])
    return fields


def _change(key: str, entry, kept, verdict: str) -> str:
    """What refreshing made of the entry for ``key`` in words ("" where nothing but its measured
    text changed): a failure of the run (row ``verdict``) newly expected, an outcome or a
    signature rewritten. A ratchet loosened by a run is one line in review, never silent."""
    new_failure = Outcome.of(verdict).new_failure
    listed_fails = Outcome.of(entry.expected).fails_law
    if kept is None:
        what = f"now expected: {entry.signature()}" if listed_fails else f"now listed {entry.expected!r}"
        return f"{key}: {'a new failure ' if new_failure else ''}{what} (it was not listed)"
    if kept.expected != entry.expected:
        return f"{key}: expected {entry.expected!r}, was {kept.expected!r}" + (
            f" ({entry.signature()})" if listed_fails else "")
    if listed_fails and kept.signature() != entry.signature():
        return f"{key}: {'a new failure ' if new_failure else ''}now expected: {entry.signature()}, was {kept.signature()}"
    return ""


def update(rows: list[Row], out: Path, *, builtins: bool = False, only: list[str] | None = None,
           changes: list[str] | None = None) -> list[Path]:
    """Write the expectation files for ``rows`` under ``out`` (see the module doc); returns them.
    ``changes``: given a list, one line per entry added, rewritten or dropped is appended to it
    ("<file>: <test id>: ..."). Raises ValueError for an ``only`` name no row has (naming the run's
    implementations) and for a one-file ``out`` given several implementations."""
    by_impl: dict[tuple[str, str], list[Row]] = {}   # (implementation, technique of a built-in)
    names = sorted({r.implementation for r in rows if r.implementation and not r.implementation.startswith("zoo:")})
    unknown = [n for n in only or [] if n not in names]
    if unknown:
        raise ValueError(f"--impl {', '.join(unknown)}: no row of the run names it; the run's implementations: "
                         f"{', '.join(names) or 'none'}")
    for r in rows:
        if not r.implementation or r.implementation.startswith("zoo:"):
            continue
        if only and r.implementation not in only:
            continue
        if not only and not (builtins or is_outside(r.implementation)):
            continue
        by_impl.setdefault((r.implementation, "" if is_outside(r.implementation) else r.technique), []).append(r)
    single = out.suffix == ".toml"
    if single and len(by_impl) > 1:
        raise ValueError(f"--out {out}: one file, but the run has {len(by_impl)} implementations "
                         f"({', '.join('/'.join(filter(None, (t, i))) for i, t in sorted(by_impl))}); "
                         "give a folder or --impl NAME")
    written = []
    by_impl = {i: rs for i, rs in by_impl.items()                     # not run: no file
               if any(Outcome.of(r.verdict) is not Outcome.SKIP for r in rs)}
    for (impl, own_technique), rs in sorted(by_impl.items()):
        path = out if single else out / file_name(impl, own_technique)
        old = expectations.parse(path.read_text(encoding="utf-8"), str(path)) if path.exists() else None
        ran, failing = {}, {}
        technique = ""
        for r in rs:
            key = test_id(r.check)
            ran[key] = r.dtype
            technique = technique or r.technique
            listed = Outcome.of(r.verdict).listed            # what an expectation lists for the row's outcome
            if listed is None:
                continue
            prev = failing.get(key)
            if prev is None or Outcome.of(listed).severity > Outcome.of(prev[0]).severity or (
                    listed == prev[0] and r.failure and not prev[2]):
                failing[key] = (listed, " ".join(str(r.message).split())[:500], r.failure or {}, r.verdict)
        exp = expectations.Expectations(name=impl, technique=technique or (old.technique if old else ""),
                                        target=old.target if old else "")
        if old is not None:
            for key, e in old.entries.items():
                if e.intermittent or not any(e.matches(k, k.split("[")[0], d) for k, d in ran.items()):
                    exp.entries[key] = e          # not run this time, or a race that passed: kept as it was
        covered = set()
        for key, (listed, measured, failure, verdict) in failing.items():
            kept = old.find(key, key.split("[")[0], ran[key]) if old is not None else None
            exp.entries[key] = expectations.Entry(
                key=key, expected=listed, measured=measured,
                reason=kept.reason if kept is not None else NEW_REASON,
                link=kept.link if kept is not None else "", intermittent=kept is not None and kept.intermittent,
                **_signature(listed, failure, kept))
            covered.add(kept.key if kept is not None else key)
            line = _change(key, exp.entries[key], kept, verdict)
            if line and changes is not None:
                changes.append(f"{path.name}: {line}")
        for key in sorted(set(old.entries if old is not None else ()) - set(exp.entries)):
            if changes is not None:
                changes.append(f"{path.name}: {key}: dropped: " + ("replaced by the entries of the tests it covered"
                                                                   if key in covered else "its tests ran without failing"))
        header = (f"Expected outcomes of {impl} in the conformance suite (pytest --expect {path.name}).\n"
                  "Refreshed by: inference-conformance expect update RUN --out PATH (reasons and links are kept).")
        atomic.write_text(path, expectations.dumps(exp, header))
        written.append(path)
    return written


def main(argv: list[str] | None = None, prog: str = "inference-conformance expect") -> int:
    """``expect update RUN --out PATH``: write the expectation files, one line per file written (its
    implementation and its entries by outcome); 0, or 2 naming the problem (an ``--impl`` no row
    names among them)."""
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("update", help="write or refresh expectation files from a run's rows")
    up.add_argument("run", type=Path, help="the run's --results folder (or one rows file)")
    up.add_argument("--out", type=Path, required=True, help="folder of expectation files, or one .toml file")
    up.add_argument("--builtins", action="store_true", help="the built-in implementations too")
    up.add_argument("--impl", action="append", default=[], metavar="NAME", help="only this implementation (repeatable)")
    args = ap.parse_args(argv)
    if not args.run.exists():
        ap.error(f"{args.run}: no such run folder or rows file")
    changes: list[str] = []
    try:
        written = update(read_rows(args.run), args.out, builtins=args.builtins, only=args.impl, changes=changes)
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    for p in written:
        exp = expectations.parse(p.read_text(encoding="utf-8"), str(p))
        counts = {}
        for e in exp.entries.values():
            counts[e.expected] = counts.get(e.expected, 0) + 1
        said = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "nothing expected: every test passed"
        print(f"wrote {p}: {exp.name}, {len(exp.entries)} entr{'y' if len(exp.entries) == 1 else 'ies'} ({said})")
    for line in changes:             # a ratchet loosened is visible in review: one line per entry changed
        print(f"changed: {line}")
    if not written:
        print("no implementation in the run's rows to write expectations for", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
