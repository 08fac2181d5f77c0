"""Benchmark history: one JSON file per run in ``history/<device-model-slug>/<date>-<commit>.json``.

An entry holds the run's fingerprint, the measured ceilings of the device (copy bandwidth,
matmul peak) and every benchmark record (statistics, raw per-round samples, extra_info). One
folder is one series: runs on the same device model, comparable with each other; the gate
(:mod:`perf.gate`) compares a run with the latest entry of its series.
"""
from __future__ import annotations

import json
from pathlib import Path

from conformance import atomic
from perf.env import ROOT, device_slug
from perf.records import fractions

HISTORY = ROOT / "history"
FORMAT = 1


def make_entry(fp: dict, records: list[dict], ceilings: dict | None = None, note: str = "",
               settings: dict | None = None) -> dict:
    """A history entry; each benchmark record gains ``fractions`` of the measured ceilings
    (achieved FLOP/s and bytes/s over matmul peak and copy bandwidth) when it states its
    ``flops`` / ``bytes`` per call; ``settings`` (:func:`perf.settings.bench_settings`: timer
    and pinned environment) says how the benchmarks were measured."""
    records = [dict(r, fractions=fractions(r, ceilings)) for r in records]
    return {"format": FORMAT, "fingerprint": fp, "series": device_slug(fp), "ceilings": ceilings or {},
            "note": note, "settings": {k: v for k, v in (settings or {}).items() if k != "pytest_args"},
            "benchmarks": records}


def entry_name(entry: dict) -> str:
    fp = entry["fingerprint"]
    date = (fp.get("date") or "0000-00-00T00:00:00Z").replace(":", "").replace("-", "")
    commit = (fp.get("commit") or "nocommit")[:10] + ("-dirty" if fp.get("dirty") else "")
    return f"{date[:8]}T{date[9:15]}-{commit}.json"


def append(entry: dict, history: Path = HISTORY) -> Path:
    """Write ``entry`` into its series folder, whole or not at all (a temporary file renamed
    over the final name, :mod:`conformance.atomic`); returns the path. Temporary files a killed
    writer left in that folder are removed."""
    folder = Path(history) / entry["series"]
    atomic.sweep(folder)
    return atomic.write_text(folder / entry_name(entry), json.dumps(entry, indent=1, sort_keys=True) + "\n")


def load(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def series(slug: str, history: Path = HISTORY) -> list[tuple[Path, dict]]:
    """Every entry of one series, oldest first (file names start with the UTC date)."""
    folder = Path(history) / slug
    if not folder.is_dir():
        return []
    out = []
    for p in sorted(folder.glob("*.json")):
        try:
            out.append((p, load(p)))
        except (OSError, ValueError):
            continue
    return out


def all_series(history: Path = HISTORY) -> dict[str, list[tuple[Path, dict]]]:
    h = Path(history)
    if not h.is_dir():
        return {}
    return {d.name: series(d.name, h) for d in sorted(h.iterdir()) if d.is_dir()}
