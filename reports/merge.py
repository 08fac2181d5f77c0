"""The conformance matrix: result rows of runs made in different environments, on other machines
and devices, or as shards of one run (``pytest --shard K/N``), merged into one table.

    python -m inference_conformance.reports merge RUN... [--out DIR]

A RUN is a ``pytest --results DIR`` folder (its rows, ``run.json`` and ``impls-*.json``,
:mod:`inference_conformance.conformance.runinfo`), a report folder of ``python -m inference_conformance.reports`` (its ``rows/``), or a
folder holding such folders (a CI job's downloaded artifacts). ``--out`` (default
``inference-conformance-out/matrix`` under the current folder) receives ``index.html`` (the matrix, filterable by technique),
``report.md`` and ``results.json``.

Rows of the matrix are implementations in one environment (technique, name, package versions,
device); columns are the laws of that technique, grouped by claim; a cell is the law's outcome
over its parameters: pass, fail, expected fail, unexpected pass, unsupported, partial (some
parameters refused, the rest pass) or not run, and a failing cell links its message and the
failing input (Hypothesis's shrunk example, or the pinned one). Two runs with results for the
same test of the same implementation in the same environment are never mixed: the newer run's
results win, and the page says which run replaced which (shards of one run hold different
tests, so they simply add up). A missing or damaged run folder is a :class:`MergeError` naming
it.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from inference_conformance.conformance import atomic
from inference_conformance.conformance.results import Row
from inference_conformance.conformance.runinfo import RUN_FILE
from inference_conformance.perf import env
from inference_conformance.reports import publish, templating
from inference_conformance.reports.ledger import claims

#: relative to the current folder, inside the suite's one output folder (a pip-installed suite
#: would otherwise write beside its package in site-packages, or into a project's own reports/)
DEFAULT_OUT = Path(publish.OUT_NAME) / "matrix"
#: cell statuses, in the order the legend lists them
STATUSES = ("pass", "fail", "expected fail", "unexpected pass", "unsupported", "partial", "not run")


class MergeError(ValueError):
    """A run folder that is missing, has no run in it, or is damaged (the message names it)."""


@dataclass
class Run:
    """One run folder: where it is, its ``run.json`` (``started``, ``shard``, ``fingerprint``),
    its implementations' package versions and its rows."""

    folder: str
    started: str
    ended: str | None
    shard: str | None
    fingerprint: dict
    packages: dict = field(default_factory=dict)     # (technique, name) -> {distribution: version}
    rows: list = field(default_factory=list)
    id: str = ""


def find_runs(path: str | Path) -> list[Path]:
    """The run folders at ``path``: itself (it holds ``run.json``), its ``rows/`` (a report folder),
    or the folders below it that hold one (at most three levels down). MergeError otherwise."""
    p = Path(path)
    if not p.exists():
        raise MergeError(f"{p}: no such run folder")
    if not p.is_dir():
        raise MergeError(f"{p}: not a folder (a run folder is what pytest --results DIR writes)")
    if (p / RUN_FILE).is_file():
        return [p]
    if (p / "rows" / RUN_FILE).is_file():
        return [p / "rows"]
    found = sorted({f.parent for depth in ("*/", "*/*/", "*/*/*/") for f in p.glob(depth + RUN_FILE)})
    if not found:
        has_rows = any(p.glob("*.jsonl")) or any(p.glob("rows/*.jsonl"))
        raise MergeError(f"{p}: not a run folder: no {RUN_FILE} in it or below it"
                         + (" (it has rows, but no run.json: was it written by an older version of the suite?)"
                            if has_rows else " (pytest --results DIR writes one)"))
    return found


def read_run(folder: str | Path) -> Run:
    """One run folder (see :func:`find_runs`); MergeError naming the folder, the file and the line."""
    folder = Path(folder)
    meta_path = folder / RUN_FILE
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MergeError(f"{folder}: no {RUN_FILE} (not a run folder, or the run never started)") from None
    except (OSError, ValueError) as exc:
        raise MergeError(f"{meta_path}: damaged: {exc}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("fingerprint"), dict) or not meta.get("started"):
        raise MergeError(f"{meta_path}: damaged: needs 'started' and a 'fingerprint' object")
    run = Run(folder=str(folder), started=str(meta["started"]), ended=meta.get("ended"), shard=meta.get("shard"),
              fingerprint=meta["fingerprint"])
    for f in sorted(folder.glob("impls-*.json")):
        try:
            for d in json.loads(f.read_text(encoding="utf-8")):
                run.packages[(d["technique"], d["name"])] = dict(d.get("packages") or {})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise MergeError(f"{f}: damaged: {exc}") from None
    files = sorted(folder.glob("*.jsonl"))
    for f in files:
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                run.rows.append(Row(**json.loads(line)))
            except (ValueError, TypeError) as exc:
                raise MergeError(f"{f}, line {n}: damaged row: {exc}") from None
    if not run.rows and not run.ended:
        raise MergeError(f"{folder}: no result rows and no end recorded in {RUN_FILE}: the run did not finish "
                         "(killed, or still running)")
    return run


def env_key(fp: dict) -> str:
    """The environment a run's results belong to: device kind and model, Python, torch, Triton,
    CUDA (never the date, commit or host count: re-runs of one environment share it)."""
    return " · ".join([env.device_label(dict(fp, cpu_count=None, gpu_count=None)), f"Python {fp.get('python')}",
                       f"torch {fp.get('torch')}", f"Triton {fp.get('triton')}"]
                      + ([f"CUDA {fp['cuda']}"] if fp.get("cuda") else []))


def _law(r: Row) -> str:
    return r.check.split("::")[-1].split("[")[0]


def _packages_text(packages: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(packages.items()))


def _input_of(message: str) -> tuple[str, str]:
    """(the message, the failing input): Hypothesis's shrunk "Falsifying example" or the pinned
    "Failing explicit example" with what follows, split from the assertion's own text."""
    for marker in ("Falsifying explicit example", "Failing explicit example", "Falsifying example"):
        i = message.find(marker)
        if i >= 0:
            return message[:i].strip(), message[i:].strip()
    return message.strip(), ""


def _status(counts: dict[str, int]) -> str:
    """A cell's status from its verdict counts over the law's parameters."""
    if counts.get("fail") or counts.get("error"):
        return "fail"
    for s in ("unexpected pass", "expected fail"):
        if counts.get(s):
            return s
    if counts.get("partial") or (counts.get("pass") and counts.get("unsupported")):
        return "partial"
    if counts.get("pass"):
        return "pass"
    if counts.get("unsupported"):
        return "unsupported"
    return "not run"


_WORDS = {"skip": "not run", "error": "fail"}


def _impl_env(run: Run, row: Row) -> str:
    """An implementation's environment in a run: the machine and stack (``env_key``) and the
    versions of the packages it needs, so that a run where its package is missing (its rows
    "not run") never replaces one where it ran, whichever is newer."""
    packages = run.packages.get((row.technique, row.implementation), {})
    text = _packages_text(packages)
    return env_key(run.fingerprint) + (f" · {text}" if text else "")


def merge(runs: list[Run]) -> tuple[list[tuple[Row, Run]], list[str]]:
    """The rows the matrix shows, each with its run, and the notes on runs replaced: for each test
    of an implementation in an environment (with its packages' versions), the newest run that
    has it wins."""
    order = sorted(runs, key=lambda r: (r.started, r.folder))
    for i, r in enumerate(order):
        r.id = f"run{i + 1}"
    owner: dict[tuple, Run] = {}
    for run in order:                       # oldest first: a newer run overwrites
        for row in run.rows:
            if not row.technique or not row.implementation or row.implementation.startswith("zoo:"):
                continue
            owner[(row.technique, row.implementation, _impl_env(run, row), row.check)] = run
    kept, replaced = [], defaultdict(int)
    for run in order:
        for row in run.rows:
            key = (row.technique, row.implementation, _impl_env(run, row), row.check)
            winner = owner.get(key)
            if winner is None:
                continue
            if winner is run:
                kept.append((row, run))
            else:
                replaced[(row.technique, row.implementation, key[2], run.id, winner.id)] += 1
    by = {r.id: r for r in order}
    notes = [f"{t} / {impl} on {e}: {n} result row{'s' if n != 1 else ''} of {old} ({by[old].folder}, started "
             f"{by[old].started}) replaced by the newer {new} ({by[new].folder}, started {by[new].started})"
             for (t, impl, e, old, new), n in sorted(replaced.items())]
    return kept, notes


def matrix(runs: list[Run]) -> dict:
    """The matrix as one JSON-able dict: ``runs``, ``notes`` (replaced runs), ``techniques``
    (each: ``columns`` [{claim, law}] grouped by claim, ``rows`` [{implementation, packages,
    environment, device, runs, cells}]), ``details`` (each failing cell's ``tests``: test id, dtype, verdict, message, input, run),
    ``counts`` (cells per status), ``rows`` (the kept result rows, each with its ``run``)."""
    kept, notes = merge(runs)
    rank = {c.id: i for i, c in enumerate(claims())}   # the shipped ledger: columns in ledger order
    techniques: dict[str, dict] = {}
    for row, run in kept:
        t = techniques.setdefault(row.technique, {"columns": set(), "rows": {}})
        col = (row.claim, _law(row))
        t["columns"].add(col)
        packages = run.packages.get((row.technique, row.implementation), {})
        rkey = (row.implementation, env_key(run.fingerprint), _packages_text(packages))
        mrow = t["rows"].setdefault(rkey, {"implementation": row.implementation, "environment": rkey[1],
                                           "packages": packages, "packages_text": rkey[2],
                                           "device": row.device or run.fingerprint.get("device") or "",
                                           "device_label": env.device_label(run.fingerprint),
                                           "runs": set(), "cells": defaultdict(list)})
        mrow["runs"].add(run.id)
        mrow["cells"][col].append((row, run))
    details, counts, out = [], defaultdict(int), []
    for name in sorted(techniques):
        t = techniques[name]
        cols = sorted(t["columns"], key=lambda c: (rank.get(c[0], len(rank)), c[0], c[1]))
        groups = []
        for claim, law in cols:
            if groups and groups[-1]["claim"] == claim:
                groups[-1]["span"] += 1
            else:
                groups.append({"claim": claim or "(no claim)", "span": 1})
        rows = []
        for rkey in sorted(t["rows"]):
            m = t["rows"][rkey]
            cells = []
            for col in cols:
                got = m["cells"].get(col, [])
                vc: dict[str, int] = defaultdict(int)
                for row, _ in got:
                    vc[row.verdict] += 1
                status = _status(vc)
                counts[status] += 1
                words = defaultdict(int)
                for v, n in vc.items():
                    words[_WORDS.get(v, v)] += n
                cell = {"status": status, "counts": dict(words),
                        "text": status if len(words) <= 1 else " · ".join(f"{v} {n}" for v, n in sorted(words.items())),
                        "detail": None}
                bad = [(row, run) for row, run in got if row.verdict in ("fail", "error", "expected fail",
                                                                          "unexpected pass")]
                if bad:
                    cell["detail"] = f"d{len(details) + 1}"
                    items = []
                    for row, run in bad:
                        message, example = _input_of(row.message)
                        items.append({"check": row.check, "dtype": row.dtype, "verdict": row.verdict,
                                      "message": message, "input": example, "run": run.id})
                    details.append({"id": cell["detail"], "technique": name, "implementation": m["implementation"],
                                    "environment": m["environment"], "claim": col[0], "law": col[1],
                                    "status": status, "tests": items})
                cells.append(cell)
            rows.append({k: (sorted(v) if k == "runs" else v) for k, v in m.items() if k != "cells"} | {"cells": cells})
        out.append({"name": name, "columns": [{"claim": c or "(no claim)", "law": law} for c, law in cols],
                    "groups": groups, "rows": rows})
    return {"runs": [{"id": r.id, "folder": r.folder, "started": r.started, "ended": r.ended, "shard": r.shard,
                      "environment": env_key(r.fingerprint), "commit": (r.fingerprint.get("commit") or "")[:12],
                      "n_rows": len(r.rows)} for r in sorted(runs, key=lambda r: r.id)],
            "notes": notes, "techniques": out, "details": details,
            "counts": {s: counts.get(s, 0) for s in STATUSES}, "statuses": list(STATUSES),
            "rows": [dict(vars(row), run=run.id) for row, run in kept]}


def run_of(folder: str | Path, rows: list[Row], fp: dict) -> Run:
    """The run of a report's own rows folder: read from its ``run.json`` where it has one, else
    (rows written without one) made from ``rows`` and the report's fingerprint ``fp``."""
    try:
        return read_run(folder)
    except MergeError:
        return Run(folder=str(folder), started=str(fp.get("date") or ""), ended=None, shard=None, fingerprint=fp,
                   rows=list(rows))


def load(paths: list[str | Path]) -> list[Run]:
    """Every run found at ``paths`` (:func:`find_runs`), read (:func:`read_run`); a folder named
    twice is read once."""
    folders: list[Path] = []
    for p in paths:
        for f in find_runs(p):
            if f.resolve() not in {g.resolve() for g in folders}:
                folders.append(f)
    return [read_run(f) for f in folders]


def write(ctx: dict, out: Path) -> list[Path]:
    """index.html (the matrix page), report.md and results.json (the context and its kept rows)
    into ``out``, each whole or not at all."""
    out.mkdir(parents=True, exist_ok=True)
    html = templating.html_env().get_template("matrix.html.j2").render(matrix=ctx, standalone=True)
    md = templating.md_env().get_template("matrix.md.j2").render(matrix=ctx)
    return [atomic.write_text(out / "index.html", html), atomic.write_text(out / "report.md", md),
            atomic.write_text(out / "results.json", json.dumps(dict(ctx, kind="conformance matrix"),
                                                               default=str))]


def main(argv: list[str] | None = None, prog: str = "inference-conformance merge") -> int:
    """``merge RUN... [--out DIR]``: write the matrix of the runs; 0, or 2 naming a bad run folder."""
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", metavar="RUN", help="run folders (pytest --results DIR), report folders, "
                                                           "or folders holding them")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: %(default)s)")
    args = ap.parse_args(argv)
    try:
        runs = load(args.runs)
    except MergeError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    ctx = matrix(runs)
    for p in write(ctx, args.out):
        print(p)
    c = ctx["counts"]
    n_rows = sum(len(t["rows"]) for t in ctx["techniques"])
    print(f"{len(runs)} runs, {n_rows} implementation rows, "
          + ", ".join(f"{n} {s}" for s, n in c.items() if n) + " cells")
    for note in ctx["notes"]:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

