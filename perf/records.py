"""pytest-benchmark JSON -> benchmark records (one per benchmark) the report, history and gate read.

A record keeps the summary statistics (seconds), the raw per-round samples (``data``, which
``--benchmark-json`` always includes), the benchmark's ``extra_info`` (tokens/s, flops, bytes,
claim...) and, when the ceilings are known, the achieved fraction of them.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

#: Samples kept per benchmark in a history entry (evenly thinned beyond this, order kept).
MAX_SAMPLES = 400
STAT_FIELDS = ("min", "max", "mean", "stddev", "median", "iqr", "q1", "q3", "rounds", "iterations", "ops")


def _thin(data: list[float], n: int = MAX_SAMPLES) -> list[float]:
    if len(data) <= n:
        return [float(f"{x:.6g}") for x in data]
    step = len(data) / n
    return [float(f"{data[int(i * step)]:.6g}") for i in range(n)]


def technique_of(b: dict) -> str:
    """The technique a benchmark belongs to: extra_info['technique'], else its folder
    (benchmarks/<technique>/bench_*.py) or file name (benchmarks/bench_<technique>.py), else its group."""
    info = b.get("extra_info") or {}
    if info.get("technique"):
        return str(info["technique"])
    full = b.get("fullname", "")
    path = Path(full.split("::")[0])
    stem = path.stem
    if stem.startswith("bench_") and path.parent.name not in ("", "benchmarks"):
        return path.parent.name
    if stem.startswith("bench_"):
        return stem[len("bench_"):]
    return b.get("group") or stem or "other"


def records(bench_json: dict | str | Path | None) -> list[dict]:
    """Normalized records from a pytest-benchmark JSON document (dict or path); [] when absent."""
    if bench_json is None:
        return []
    if not isinstance(bench_json, dict):
        p = Path(bench_json)
        if not p.exists():
            return []
        try:
            bench_json = json.loads(p.read_text())
        except (OSError, ValueError):
            return []
    out = []
    for b in bench_json.get("benchmarks", []):
        stats = b.get("stats") or {}
        data = stats.get("data") or b.get("data") or []
        rec = {"name": b.get("name", ""), "fullname": b.get("fullname", b.get("name", "")),
               "group": b.get("group"), "params": b.get("params"), "technique": technique_of(b),
               "extra_info": b.get("extra_info") or {},
               "stats": {k: stats[k] for k in STAT_FIELDS if k in stats},
               "data": _thin(list(data))}
        out.append(rec)
    return out


def achieved(rec: dict) -> dict:
    """FLOP/s and bytes/s achieved by a benchmark, from extra_info ``flops`` / ``bytes`` (per call)
    and the median time; {} when the benchmark does not state them."""
    info, med = rec.get("extra_info") or {}, (rec.get("stats") or {}).get("median")
    out: dict[str, float] = {}
    if not med or med <= 0:
        return out
    for key, name in (("flops", "flop_per_s"), ("bytes", "bytes_per_s")):
        v = info.get(key)
        if isinstance(v, (int, float)) and v > 0:
            out[name] = float(v) / med
    if "flop_per_s" in out and "bytes_per_s" in out:
        out["intensity"] = out["flop_per_s"] / out["bytes_per_s"]
    return out


def _num(v: Any) -> float | None:
    if isinstance(v, dict):
        for k in ("value", "per_s", "median", "peak"):
            if isinstance(v.get(k), (int, float)):
                return float(v[k])
        return None
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0:
        return float(v)
    return None


def matmul_peaks(ceilings: dict | None) -> dict[str, float]:
    """dtype name -> measured matmul FLOP/s (``measure_ceilings``' ``matmul_flops_per_s``)."""
    m = (ceilings or {}).get("matmul_flops_per_s")
    if isinstance(m, dict):
        return {k: float(v) for k, v in m.items() if _num(v) is not None}
    return {"": float(m)} if _num(m) is not None else {}


def ceiling_values(ceilings: dict | None, dtype: str | None = None) -> dict[str, float]:
    """The peak FLOP/s (of ``dtype``'s matmul when measured per dtype: else bfloat16, else the
    best) and the copy bandwidth in bytes/s, out of ``inference_conformance.perf.ceilings.measure_ceilings``'s
    dict; other key names (``*flop*``, ``*byte*``/``*bandwidth*``) are accepted too."""
    out: dict[str, float] = {}
    if not ceilings:
        return out
    peaks = matmul_peaks(ceilings)
    if peaks:
        name = str(dtype).replace("torch.", "") if dtype else None
        out["flop_per_s"] = peaks.get(name) or peaks.get("bfloat16") or max(peaks.values())
    bw = _num(ceilings.get("copy_bytes_per_s"))
    if bw:
        out["bytes_per_s"] = bw
    for k, v in ceilings.items():
        x = _num(v)
        if x is None:
            continue
        lk = k.lower()
        if "flop" in lk and "flop_per_s" not in out:
            out["flop_per_s"] = x
        elif ("byte" in lk or "bandwidth" in lk) and "bytes_per_s" not in out:
            out["bytes_per_s"] = x
    return out


def fractions(rec: dict, ceilings: dict | None) -> dict[str, float]:
    """Achieved / measured ceiling, for each of FLOP/s and bytes/s the benchmark states."""
    a = achieved(rec)
    c = ceiling_values(ceilings, (rec.get("extra_info") or {}).get("dtype") or (rec.get("params") or {}).get("dtype"))
    return {f"{k}_fraction": a[k] / c[k] for k in ("flop_per_s", "bytes_per_s") if k in a and k in c}


def merge_passes(passes: list[list[dict]]) -> list[dict]:
    """The records of several passes of the same benchmarks (one run that repeated its benchmark
    process) as one record per benchmark, in the first pass's order: ``stats.median`` the
    geometric mean of the passes' medians (each process has its own memory layout and allocator
    state, which its rounds share, so the passes, not the rounds, are the independent samples),
    ``data`` every pass's rounds (thinned), ``passes`` the per-pass medians; other fields from the
    first pass. A benchmark missing from some pass is merged over the passes that have it."""
    by_name: dict[str, list[dict]] = {}
    order: list[str] = []
    for recs in passes:
        for r in recs:
            if (r.get("stats") or {}).get("median"):
                if r["fullname"] not in by_name:
                    order.append(r["fullname"])
                by_name.setdefault(r["fullname"], []).append(r)
    out = []
    for name in order:
        rs = by_name[name]
        meds = [float(r["stats"]["median"]) for r in rs]
        stats = dict(rs[0].get("stats") or {}, median=float(math.exp(sum(map(math.log, meds)) / len(meds))))
        data = [x for r in rs for x in (r.get("data") or [])]
        out.append(dict(rs[0], stats=stats, data=_thin(data), passes=meds))
    return out
