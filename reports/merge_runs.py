"""The run folders the conformance matrix (:mod:`inference_conformance.reports.merge`) is merged
from: found (a ``pytest --results DIR`` folder, a report folder's ``rows/``, or a folder holding
them) and read (``run.json``, ``impls-*.json``, the rows); a missing or damaged one is a
:class:`MergeError` naming the folder, the file and the line.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from inference_conformance.conformance.results import Row
from inference_conformance.conformance.runinfo import RUN_FILE


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
