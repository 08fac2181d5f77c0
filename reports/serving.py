"""The serving benchmark in the report: latency against throughput for each server measured by
``python -m inference_conformance.benchmarks.inference_engine.serving`` (its history entries: ``settings.timer``
"vllm-bench-serve"), from the newest such entry of the history folder. One point per request
rate: x the output-token throughput (tokens/s), y the p50 and p99 of TTFT and TPOT (ms)."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from inference_conformance.reports.plots import _plt, _save

LOAD_GENERATOR = "vllm-bench-serve"


def newest_entry(history_dir: Path | None) -> tuple[Path, dict] | None:
    """The newest serving entry under ``history_dir`` (by file name: date then commit), or None."""
    if history_dir is None or not Path(history_dir).is_dir():
        return None
    best = None
    for path in sorted(Path(history_dir).glob("*/*.json"), key=lambda p: p.name):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and (doc.get("settings") or {}).get("timer") == LOAD_GENERATOR:
            best = (path, doc)
    return best


def points(entry: dict) -> dict[str, list[dict]]:
    """server label -> one point per rate: rate, throughput, p50/p99 of each metric (ms)."""
    by = defaultdict(dict)
    for rec in entry.get("benchmarks", []):
        x = rec.get("extra_info") or {}
        label = rec["name"].split("[", 1)[1].split("-rate", 1)[0]
        p = by[label].setdefault(str(x.get("rate")), {"rate": x.get("rate"), "throughput": x.get("output_throughput")})
        p[f"{x.get('metric')}_p50"], p[f"{x.get('metric')}_p99"] = x.get("p50", 0) * 1e3, x.get("p99", 0) * 1e3
    return {k: sorted(v.values(), key=lambda p: p["throughput"] or 0) for k, v in by.items()}


def plot_latency_throughput(history_dir: Path | None, out: Path) -> dict:
    entry = {"id": "serving_latency", "title": "Serving: latency against throughput (TTFT and TPOT, p50 and p99)",
             "file": None, "note": ""}
    found = newest_entry(history_dir)
    if found is None:
        entry["note"] = ("no serving benchmark in the history (python -m inference_conformance.benchmarks.inference_engine.serving "
                         "--vllm --history history)")
        return entry
    path, doc = found
    pts = points(doc)
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric in zip(axes, ("ttft", "tpot")):
        for label, ps in sorted(pts.items()):
            xs = [p["throughput"] for p in ps]
            for q, style in (("p50", "o-"), ("p99", "s--")):
                ax.plot(xs, [p.get(f"{metric}_{q}") for p in ps], style, label=f"{label} {q}")
            for p in ps:
                ax.annotate(f"{p['rate']}/s", (p["throughput"], p.get(f"{metric}_p99")), fontsize=6)
        ax.set_xlabel("output throughput (tokens/s)")
        ax.set_ylabel(f"{metric.upper()} (ms)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fp = doc.get("fingerprint") or {}
    fig.suptitle(f"{entry['title']}: {path.parent.name}/{path.name} ({fp.get('cpu') or fp.get('device') or ''})",
                 fontsize=9)
    entry["file"] = _save(fig, out, "serving_latency")
    entry["note"] = f"from {path.parent.name}/{path.name}; each label is a rate in requests/s (inf: all at once)"
    return entry
