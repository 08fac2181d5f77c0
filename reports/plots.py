"""The report's plots (matplotlib, Agg backend, PNG), drawn only from data that exists.

Every plot is data-driven: it gathers points from the result rows (``Row.extra`` plus
``measured``) and the benchmark records (``extra_info`` plus ``params`` and the median time),
and is skipped with a note when no points exist. Every field read is declared in
:mod:`inference_conformance.conformance.fields`. What a check must record to appear in a plot:

- roofline:      benchmark extra_info ``flops`` and ``bytes`` (per call); ceilings from
                 ``perf/ceilings.py`` when available.
- batch:         extra_info ``batch`` and ``tokens_per_s``, by ``implementation``; claim AI-9.
- nll_bits:      ``bits`` and ``nll`` (row extra or extra_info); grouped by ``granularity``.
- gamma:         ``gamma`` and ``tokens_per_call``; grouped by ``draft`` or ``alpha``.
- serving:       ``policy`` and ``utilisation`` (fraction of the KV budget holding live tokens).
- serving_steps: ``policy`` and ``utilisation_by_step`` (a list: utilisation of each step).
- history:       at least two history entries of the run's series.
"""
from __future__ import annotations

import io
import math
from collections import defaultdict
from pathlib import Path

from inference_conformance.conformance import atomic
from inference_conformance.conformance.fields import FIELDS
from inference_conformance.perf import records as benchmark_records

SPECS = {
    "batch": dict(title="Decode step latency and throughput vs batch size (AI-9)",
                  x=("batch",), y=("tokens_per_s",), group=("implementation",)),
    "nll_bits": dict(title="Test NLL vs weight bits (QT-3)", x=("bits",), y=("nll",),
                     group=("granularity", "implementation")),
    "gamma": dict(title="Tokens per target call vs γ (SD-4, SD-5)", x=("gamma",), y=("tokens_per_call",),
                  group=("draft", "alpha")),
    "serving": dict(title="KV budget utilisation by allocation policy (PA-2)", x=("policy",),
                    y=("utilisation",), group=("metric",)),
}
# every field a plot reads is a declared field (conformance/fields.py): one spelling, one type
assert all(name in FIELDS for spec in SPECS.values() for key in ("x", "y", "group") for name in spec[key])


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _sources(rows, records):
    """(dict of fields, label) for every row and benchmark record."""
    for r in rows:
        d = dict(r.extra or {})
        d.setdefault("measured", r.measured)
        d.setdefault("claim", r.claim)
        d.setdefault("implementation", r.implementation)
        yield d
    for rec in records:
        params = dict(rec.get("params") or {})
        d = dict(params)
        d.update(rec.get("extra_info") or {})
        d.setdefault("median_s", (rec.get("stats") or {}).get("median"))
        # the implementation's registry name, as the benchmark declared it (fields.py)
        d.setdefault("implementation", params.get("backend") or rec.get("name", "").split("[")[0])
        yield d


def _first(d, keys):
    for k in keys:
        if k in d and d[k] is not None:
            return d[k]
    return None


def points(spec: dict, rows, records) -> dict[str, list[tuple]]:
    """group label -> sorted [(x, y, source fields)] for one plot spec."""
    groups: dict[str, list[tuple]] = defaultdict(list)
    for d in _sources(rows, records):
        x, y = _first(d, spec["x"]), _first(d, spec["y"])
        if x is None or not isinstance(y, (int, float)) or isinstance(y, bool) or not math.isfinite(y):
            continue
        g = _first(d, spec["group"])
        groups[str(g) if g is not None else ""].append((x, float(y), d))
    for g in groups:
        try:
            groups[g].sort(key=lambda p: p[0])
        except TypeError:
            pass
    return dict(groups)


def _save(fig, out: Path, name: str) -> str:
    """Draw ``fig`` to ``out/<name>.png``, whole or not at all (:mod:`inference_conformance.conformance.atomic`)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    _plt().close(fig)
    return atomic.write_bytes(out / f"{name}.png", buf.getvalue()).name


def plot_roofline(records, ceilings, out: Path) -> dict:
    entry = {"id": "roofline", "title": "Roofline: achieved FLOP/s vs arithmetic intensity", "file": None, "note": ""}
    pts = [(r, benchmark_records.achieved(r)) for r in records]
    pts = [(r, a) for r, a in pts if "intensity" in a]
    if not pts:
        entry["note"] = "no benchmark states extra_info 'flops' and 'bytes' per call"
        return entry
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    c = benchmark_records.ceiling_values(ceilings)
    xs = [a["intensity"] for _, a in pts]
    lo, hi = min(xs) / 4, max(xs) * 4
    peaks = benchmark_records.matmul_peaks(ceilings) or ({"": c["flop_per_s"]} if "flop_per_s" in c else {})
    if peaks and "bytes_per_s" in c:
        bw = c["bytes_per_s"]
        ridges = [p / bw for p in peaks.values()]
        lo, hi = min(lo, min(ridges) / 8), max(hi, max(ridges) * 8)
        grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
        for (name, peak), style in zip(sorted(peaks.items(), key=lambda kv: -kv[1])[:3], ("k-", "k--", "k:")):
            ax.plot(grid, [min(peak, bw * g) for g in grid], style, lw=1.2,
                    label=f"measured ceiling {name} (ridge {peak / bw:.3g} FLOP/B)".replace("  ", " "))
    else:
        entry["note"] = "device ceilings not measured: points only"
    for r, a in pts:
        ax.loglog(a["intensity"], a["flop_per_s"], "o", label=r["name"][:48])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved FLOP/s")
    ax.legend(fontsize=6, loc="lower right")
    ax.grid(True, which="both", alpha=0.3)
    entry["file"] = _save(fig, out, "roofline")
    return entry


def plot_spec(pid: str, rows, records, out: Path) -> dict:
    spec = SPECS[pid]
    entry = {"id": pid, "title": spec["title"], "file": None, "note": ""}
    groups = points(spec, rows, records)
    if not groups:
        entry["note"] = f"no rows with {spec['x'][0]!r} and {spec['y'][0]!r} in this run"
        return entry
    plt = _plt()
    numeric = all(isinstance(p[0], (int, float)) for g in groups.values() for p in g)
    if pid == "batch":
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
        for g, ps in groups.items():
            ax1.plot([p[0] for p in ps], [p[1] for p in ps], "o-", label=g or "throughput")
            lat = [(p[0], _first(p[2], ("latency_s", "step_s", "median_s"))) for p in ps]
            lat = [(x, y) for x, y in lat if isinstance(y, (int, float))]
            if lat:
                ax2.plot([x for x, _ in lat], [y * 1e3 for _, y in lat], "s-", label=g or "latency")
        ax1.set_xscale("log", base=2)
        ax2.set_xscale("log", base=2)
        ax1.set_xlabel("batch size")
        ax2.set_xlabel("batch size")
        ax1.set_ylabel("tokens/s")
        ax2.set_ylabel("step latency (ms)")
        ax1.legend(fontsize=7)
        ax1.grid(alpha=0.3)
        ax2.grid(alpha=0.3)
    else:
        fig, ax = plt.subplots(figsize=(7, 4))
        if numeric:
            for g, ps in groups.items():
                ax.plot([p[0] for p in ps], [p[1] for p in ps], "o-", label=g or None)
        else:
            labels = [f"{p[0]}" + (f" ({g})" if g else "") for g, ps in groups.items() for p in ps]
            ax.bar(range(len(labels)), [p[1] for ps in groups.values() for p in ps])
            ax.set_xticks(range(len(labels)), labels, rotation=20, fontsize=7)
        ax.set_xlabel(spec["x"][0])
        ax.set_ylabel(spec["y"][0])
        if numeric and any(groups):
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(spec["title"], fontsize=10)
    entry["file"] = _save(fig, out, pid)
    return entry


def plot_history(series: list[tuple], out: Path, name: str = "history", max_lines: int = 12) -> dict:
    entry = {"id": name, "title": "Benchmark history: median relative to the first run of this device's series",
             "file": None, "note": ""}
    if len(series) < 2:
        entry["note"] = f"{len(series)} history entr{'y' if len(series) == 1 else 'ies'} for this device: no trend yet"
        return entry
    trends: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for i, (_, e) in enumerate(series):
        for rec in e.get("benchmarks", []):
            med = (rec.get("stats") or {}).get("median")
            if med:
                trends[rec["fullname"]].append((i, med))
    trends = {k: v for k, v in trends.items() if len(v) >= 2}
    if not trends:
        entry["note"] = "no benchmark appears in two entries of this series"
        return entry
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 4))
    for k in sorted(trends)[:max_lines]:
        v = trends[k]
        ax.plot([i for i, _ in v], [m / v[0][1] for _, m in v], "o-", label=k.split("::")[-1][:40])
    labels = [(e["fingerprint"].get("date") or "")[:16] + " " + (e["fingerprint"].get("commit") or "")[:7]
              for _, e in series]
    ax.set_xticks(range(len(series)), labels, rotation=30, fontsize=6)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylabel("median / first run's median")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    if len(trends) > max_lines:
        entry["note"] = f"first {max_lines} of {len(trends)} benchmarks shown"
    entry["file"] = _save(fig, out, name)
    return entry


def plot_serving_steps(rows, out: Path) -> dict:
    """Utilisation of the KV budget over the steps of the serving simulation, one line per
    policy (PA-2): rows whose extra holds ``policy`` and ``utilisation_by_step``."""
    entry = {"id": "serving_steps", "title": "KV budget utilisation over the steps, per policy (PA-2)",
             "file": None, "note": ""}
    assert {"policy", "utilisation_by_step", "total_steps"} <= set(FIELDS)  # declared in fields.py
    lines = {}
    for r in rows:
        d = r.extra or {}
        ys = d.get("utilisation_by_step")
        if d.get("policy") is not None and isinstance(ys, list) and ys:
            lines[str(d["policy"])] = (ys, d.get("total_steps") or len(ys))
    if not lines:
        entry["note"] = "no rows with 'policy' and 'utilisation_by_step' in this run"
        return entry
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for policy, (ys, total) in sorted(lines.items()):
        xs = [i * (total - 1) / max(1, len(ys) - 1) for i in range(len(ys))]
        ax.plot(xs, ys, "-", lw=1.2, label=f"{policy} ({total} steps)")
    ax.set_xlabel("step")
    ax.set_ylabel("utilisation (tokens held / budget)")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.suptitle(entry["title"], fontsize=10)
    entry["file"] = _save(fig, out, "serving_steps")
    return entry


def all_plots(rows, records, ceilings, series, out: Path) -> list[dict]:
    """Every plot the data allows, in report order (skipped ones carry a note)."""
    plots = [plot_roofline(records, ceilings, out)]
    plots += [plot_spec(pid, rows, records, out) for pid in SPECS]
    plots.append(plot_serving_steps(rows, out))
    plots.append(plot_history(series, out))
    return plots
