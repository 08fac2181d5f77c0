"""Benchmark history: one JSON file per run in ``history/<series>/<date>-<commit>.json``.

An entry holds the run's fingerprint, the measured ceilings of the device (copy bandwidth,
matmul peak) and every benchmark record (statistics, raw per-round samples, extra_info). One
folder is one series (:func:`inference_conformance.perf.env.series_key`): runs on the same device model and core or
GPU count with the same pinned benchmark settings, comparable with each other; the gate
(:mod:`inference_conformance.perf.gate`) compares a run with the earlier entries of its series. Entries of format 1
(``history/cpu-amd-epyc/``) were keyed by the device model alone: they keep their folder and
their recorded ``series``.

Reading is strict: :func:`load` raises :class:`EntryError` naming the file, the entry and the
field of anything that is not a usable entry; :func:`series` reports every unreadable file.
"""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

from inference_conformance.conformance import atomic
from inference_conformance.perf.env import ROOT, series_key
from inference_conformance.perf.records import fractions

HISTORY = ROOT / "history"
#: The environment variable that names the history folder for ``run`` and ``gate`` alike.
HISTORY_ENV = "INFERENCE_CONFORMANCE_HISTORY"
#: The one output folder under the current directory (``inference_conformance.reports.publish.OUT_NAME``).
OUT_NAME = "inference-conformance-out"
#: 2: series keyed by :func:`inference_conformance.perf.env.series_key` (device, count, settings); 1: by the device model.
FORMAT = 2


class EntryError(ValueError):
    """A run file or history entry that cannot be used, in one line: the file, the entry (the
    benchmark, by index and name) and the field."""

    def __init__(self, path, message: str, entry: str | None = None, field: str | None = None):
        self.path, self.entry, self.field = str(path), entry, field
        where = "".join(f"{x}: " for x in (entry, f"field {field!r}" if field else None) if x)
        super().__init__(f"{path}: {where}{message}")


def default_folder(environ: dict | None = None) -> Path:
    """Where ``inference-conformance run`` writes the history and ``inference-conformance gate``
    reads it unless ``--history`` says otherwise: ``$INFERENCE_CONFORMANCE_HISTORY`` when set
    (``environ``, default ``os.environ``), else the checkout's ``history/`` when the suite runs
    from its checkout, else ``./inference-conformance-out/history`` under the current folder
    (an installed suite: never inside the installed package)."""
    configured = (os.environ if environ is None else environ).get(HISTORY_ENV, "").strip()
    if configured:
        return Path(configured).expanduser()
    checkout = (ROOT / "pyproject.toml").is_file() and (ROOT / "tests").is_dir()
    return HISTORY if checkout else Path.cwd() / OUT_NAME / "history"


def make_entry(fp: dict, records: list[dict], ceilings: dict | None = None, note: str = "",
               settings: dict | None = None) -> dict:
    """A history entry; each benchmark record gains ``fractions`` of the measured ceilings
    (achieved FLOP/s and bytes/s over matmul peak and copy bandwidth) when it states its
    ``flops`` / ``bytes`` per call; ``settings`` (:func:`inference_conformance.perf.settings.bench_settings`: timer
    and pinned environment) says how the benchmarks were measured."""
    records = [dict(r, fractions=fractions(r, ceilings)) for r in records]
    return {"format": FORMAT, "fingerprint": fp, "series": series_key(fp, settings), "ceilings": ceilings or {},
            "note": note, "settings": {k: v for k, v in (settings or {}).items() if k != "pytest_args"},
            "benchmarks": records}


def entry_name(entry: dict) -> str:
    fp = entry["fingerprint"]
    date = (fp.get("date") or "0000-00-00T00:00:00Z").replace(":", "").replace("-", "")
    commit = (fp.get("commit") or "nocommit")[:10] + ("-dirty" if fp.get("dirty") else "")
    return f"{date[:8]}T{date[9:15]}-{commit}.json"


def append(entry: dict, history: Path = HISTORY) -> Path:
    """Write ``entry`` into its series folder, whole or not at all (a temporary file renamed
    over the final name, :mod:`inference_conformance.conformance.atomic`); returns the path. Temporary files a killed
    writer left in that folder are removed."""
    folder = Path(history) / entry["series"]
    atomic.sweep(folder)
    return atomic.write_text(folder / entry_name(entry), json.dumps(entry, indent=1, sort_keys=True) + "\n")


def read_json(path: str | Path) -> dict:
    """The JSON object in ``path``; :class:`EntryError` for a missing, unreadable, empty or
    truncated file, or a top level that is not an object."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise EntryError(p, "no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise EntryError(p, f"cannot be read ({e.__class__.__name__}: {e})") from None
    if not text.strip():
        raise EntryError(p, "empty file: truncated or never written")
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise EntryError(p, f"not valid JSON (line {getattr(e, 'lineno', '?')}, column {getattr(e, 'colno', '?')}: "
                            f"{getattr(e, 'msg', e)}): truncated or damaged") from None
    if not isinstance(doc, dict):
        raise EntryError(p, f"the top level is a JSON {_kind(doc)}, expected an object "
                            f"(a history entry or a pytest-benchmark JSON)")
    return doc


def _kind(x) -> str:
    return {list: "list", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null", dict: "object"}.get(type(x), type(x).__name__)


def _time(x) -> str | None:
    """Why ``x`` is not a usable time in seconds, None when it is."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return f"is {json.dumps(x)[:40]} (a {_kind(x)}), expected a positive time in seconds"
    if not math.isfinite(x):
        return f"is {x}, expected a finite positive time in seconds"
    if x <= 0:
        return f"is {x:g}, expected a positive time in seconds"
    return None


def validate(doc: dict, path: str | Path) -> dict:
    """``doc`` (a history entry or a pytest-benchmark JSON) if every benchmark is usable, else
    :class:`EntryError` naming the first bad field: ``benchmarks`` a non-empty list of objects,
    each with a non-empty unique ``fullname`` and a finite positive ``stats.median`` (or, without
    one, raw samples ``data`` / ``stats.data`` that give it), every raw sample a finite positive
    time; ``fingerprint``, where present, an object and ``series`` a non-empty string."""
    for key, typ in (("fingerprint", dict), ("series", str)):
        if key in doc and not (isinstance(doc[key], typ) and doc[key]):
            raise EntryError(path, f"is {json.dumps(doc[key])[:40]}, expected a non-empty "
                                   f"{'object' if typ is dict else 'string'}", field=key)
    benches = doc.get("benchmarks")
    if benches is None:
        raise EntryError(path, "missing: no benchmark in this file", field="benchmarks")
    if not isinstance(benches, list):
        raise EntryError(path, f"is a JSON {_kind(benches)}, expected a list", field="benchmarks")
    if not benches:
        raise EntryError(path, "is empty: no benchmark in this file", field="benchmarks")
    seen: dict[str, int] = {}
    for i, b in enumerate(benches):
        if not isinstance(b, dict):
            raise EntryError(path, f"is a JSON {_kind(b)}, expected an object", entry=f"benchmarks[{i}]")
        name = b.get("fullname")
        label = f"benchmarks[{i}]" + (f" {b['name']!r}" if isinstance(b.get("name"), str) else "")
        if not isinstance(name, str) or not name:
            raise EntryError(path, "missing or not a non-empty string" if name is None or isinstance(name, str)
                             else f"is a JSON {_kind(name)}, expected a string", entry=label, field="fullname")
        label = f"benchmarks[{i}] {name!r}"
        if name in seen:
            raise EntryError(path, f"duplicate: benchmarks[{seen[name]}] has the same fullname", entry=label,
                             field="fullname")
        seen[name] = i
        st = b.get("stats")
        if st is not None and not isinstance(st, dict):
            raise EntryError(path, f"is a JSON {_kind(st)}, expected an object", entry=label, field="stats")
        st = st or {}
        for field, data in (("data", b.get("data")), ("stats.data", st.get("data"))):
            if data is None:
                continue
            if not isinstance(data, list):
                raise EntryError(path, f"is a JSON {_kind(data)}, expected a list of times", entry=label, field=field)
            for j, x in enumerate(data):
                why = _time(x)
                if why:
                    raise EntryError(path, why, entry=label, field=f"{field}[{j}]")
        if "median" in st:
            why = _time(st["median"])
            if why:
                raise EntryError(path, why, entry=label, field="stats.median")
        elif not (b.get("data") or st.get("data")):
            raise EntryError(path, "missing, and no raw samples (data) to compute it from", entry=label,
                             field="stats.median")
    return doc


def load(path: str | Path) -> dict:
    """The entry in ``path``, validated (:func:`read_json`, :func:`validate`): raises
    :class:`EntryError` naming the file, the entry and the field."""
    return validate(read_json(path), path)


def series(slug: str, history: Path = HISTORY, errors: list | None = None) -> list[tuple[Path, dict]]:
    """Every usable entry of one series, oldest first (file names start with the UTC date). A
    file that is not a usable entry is never skipped without a word: its :class:`EntryError` is
    appended to ``errors`` when given, else printed to stderr."""
    folder = Path(history) / slug
    if not folder.is_dir():
        return []
    out = []
    for p in sorted(folder.glob("*.json")):
        try:
            out.append((p, load(p)))
        except EntryError as e:
            if errors is None:
                print(f"history: skipped {e}", file=sys.stderr)
            else:
                errors.append(e)
    return out


def newest_series(fp: dict, history: Path = HISTORY) -> str:
    """The series of this machine that holds the newest entry: a folder named
    :func:`inference_conformance.perf.env.device_slug` or that slug followed by a settings tag (the benchmarks' pinned
    settings are part of the key, :func:`inference_conformance.perf.env.series_key`); the bare slug when there is none."""
    from inference_conformance.perf.env import device_slug

    slug = device_slug(fp)
    folders = [d for d in Path(history).glob(f"{slug}*") if d.is_dir() and (d.name == slug or d.name.startswith(slug + "-"))]
    dated = [(max((p.name for p in d.glob("*.json")), default=""), d.name) for d in folders]
    return max(dated)[1] if dated else slug


def all_series(history: Path = HISTORY) -> dict[str, list[tuple[Path, dict]]]:
    h = Path(history)
    if not h.is_dir():
        return {}
    return {d.name: series(d.name, h) for d in sorted(h.iterdir()) if d.is_dir()}
