"""Build the report (index.html, report.md, results.json, plots/) from result rows, benchmark
records, the device's measured ceilings, the benchmark history and the claims ledger.

Everything the report shows is computed here once, as one JSON-able context dict
(:func:`context`); the HTML and Markdown are two Jinja2 templates over it
(``reports/templates/``) and ``results.json`` is the context itself plus every row.
"""
from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from dataclasses import asdict
from importlib import resources
from pathlib import Path

from inference_conformance.conformance import atomic
from inference_conformance.conformance.outcomes import ClaimVerdict, Outcome, read
from inference_conformance.conformance.results import Row, read_rows
from inference_conformance.perf import env
from inference_conformance.perf import history as hist
from inference_conformance.reports import serving
from inference_conformance.perf import records as benchmark_records
from inference_conformance.reports import plots, publish, templating
from inference_conformance.reports.build_claims import (_evidence_text, _fig_text, _num, _verdict_of,  # noqa: F401
                                                         _worst_measured, decided_text, deciding)
from inference_conformance.reports.cells import batch_invariance_text, declared_text
from inference_conformance.reports.killrate import kill_rates
from inference_conformance.reports.ledger import claims

ROOT = Path(__file__).resolve().parent.parent
#: The gate's calibration as ``python -m inference_conformance.perf.calibrate analyse`` writes it
#: (package data of ``inference_conformance.perf``).
CALIBRATION = resources.files("inference_conformance.perf") / "calibration" / "gate_calibration.json"


def fingerprint(device: str | None = None) -> dict:
    """Where the rows were measured: CPU/GPU model, driver, library versions, commit."""
    return env.fingerprint(device)


def _is_zoo(r: Row) -> bool:
    return r.implementation.startswith("zoo:")


def claim_verdicts(rows: list[Row], records: list[dict] | None = None) -> list[dict]:
    """One entry per ledger claim: its verdict over every (non-zoo) row, the reference's
    included (a failing oracle fails the claim), and its verdict per implementation
    (``by_impl``: implementation -> verdict, so one adapter's failure reads as that adapter's);
    "not measured" when every row was skipped (e.g. GPU-only on a CPU run), "not checked"
    without rows."""
    by_claim: dict[str, list[Row]] = defaultdict(list)
    for r in _judged(rows):
        if r.claim and not _is_zoo(r):
            by_claim[r.claim].append(r)
    bench_by_claim: dict[str, list[dict]] = defaultdict(list)
    for rec in records or []:
        c = (rec.get("extra_info") or {}).get("claim")
        for cid in (c if isinstance(c, list) else [c] if c else []):
            bench_by_claim[cid].append(rec)
    out = []
    for c in claims():
        rs = by_claim.get(c.id, [])
        verdict = ClaimVerdict.NOT_CHECKED if not rs else _verdict_of(rs, c.kind)
        impls = sorted({r.implementation for r in rs if r.implementation})
        by_impl = {i: _verdict_of([r for r in rs if r.implementation == i], c.kind).value for i in impls}
        decided = deciding(rs, c.kind, verdict)
        figures = [r for r in rs if r.lecture is not None or (r.unit and r.unit not in ("max abs error", "rejection"))]
        figures.sort(key=lambda r: r not in decided)          # the figures that decided the verdict first
        seen, lect, meas = set(), [], []
        for r in figures:
            key = (json.dumps(r.lecture, default=str), json.dumps(r.measured, default=str), r.unit)
            if key in seen:
                continue
            seen.add(key)
            if len(lect) < 6:
                lect.append(_fig_text(r, r.lecture) if r.lecture is not None else "—")
                meas.append(_fig_text(r, r.measured))
        measured_text = "; ".join(m for m in meas if m) or _worst_measured(rs)
        brecs = bench_by_claim.get(c.id, [])
        if not measured_text and brecs:
            measured_text = "; ".join(f"{b['name']}: median {_secs(b['stats'].get('median'))}" for b in brecs[:3])
        checks = sorted({r.check.split("[")[0] for r in rs} | {b["fullname"].split("[")[0] for b in brecs})
        evidence = "; ".join([f"{_evidence_text(r)} ({'/'.join(filter(None, (r.implementation, r.dtype)))})"
                              for r in rs if r.evidence] + ([decided_text(decided)] if decided else []))
        out.append({"id": c.id, "kind": c.kind, "text": c.text, "section": c.section, "verdict": verdict.value,
                    "evidence_text": evidence,
                    "checks": checks, "lecture": figures[0].lecture if figures else None,
                    "measured": figures[0].measured if figures else None,
                    "unit": figures[0].unit if figures else (rs[0].unit if rs else ""),
                    "lecture_text": "; ".join(lect) if any(x != "—" for x in lect) else "", "measured_text": measured_text or "",
                    "devices": sorted({r.device for r in rs if r.device}),
                    "counts": {o.value: n for o in reversed(Outcome) if (n := sum(read(r) is o for r in rs))},
                    "by_impl": by_impl,
                    "by_impl_text": ", ".join(f"{i}: {v}" for i, v in by_impl.items()) if len(by_impl) > 1 else ""})
    return out


def _judged(rows: list[Row]) -> list[Row]:
    """The rows as every reader judges them (:func:`inference_conformance.conformance.outcomes.read`):
    a partial row with too little evidence reads "not enough evidence", a crash's row "crashed"."""
    return [r if read(r) == r.verdict else dataclasses.replace(r, verdict=read(r).value) for r in rows]


def _secs(s) -> str:
    if not isinstance(s, (int, float)):
        return ""
    for unit, f in (("s", 1), ("ms", 1e3), ("µs", 1e6), ("ns", 1e9)):
        if s * f >= 1:
            return f"{s * f:.4g} {unit}"
    return f"{s * 1e9:.3g} ns"


def summary(ledger: list[dict]) -> dict:
    """The claims counted by verdict (:class:`inference_conformance.conformance.outcomes.ClaimVerdict`):
    a claim without enough evidence counts with the failing ones (--strict fails it), never as
    holding."""
    n: dict[ClaimVerdict, int] = defaultdict(int)
    for c in ledger:
        n[ClaimVerdict(c["verdict"])] += 1
    holding = sum(k for v, k in n.items() if v.holding)
    failing = sum(k for v, k in n.items() if v.failing)
    V = ClaimVerdict
    return {"total": len(ledger), "checked": holding + failing + n[V.INCONCLUSIVE], "holding": holding,
            "partial": n[V.HOLDS_PARTIAL], "failing": failing, "not_enough_evidence": n[V.NOT_ENOUGH_EVIDENCE],
            "inconclusive": n[V.INCONCLUSIVE], "not_measured": n[V.NOT_MEASURED], "not_checked": n[V.NOT_CHECKED]}


#: The column of laws that are not parametrized over implementations (one fixed setup: an
#: exact enumeration, a formula, an experiment on the small world).
NOT_PER_IMPL = "not per implementation"


def property_tables(rows: list[Row]) -> dict[str, dict]:
    """technique -> {impls: [...], properties: [{law, claim, dtype, cells: {impl: cell}}]}: per
    law, claim, dtype and implementation the outcome of its rows combined
    (:meth:`inference_conformance.conformance.outcomes.Outcome.combine`, as the matrix combines
    them), the worst row's (then the largest error/bound's) figures and message."""
    tables: dict[str, dict] = {}
    outcomes_seen: dict[tuple, list[Outcome]] = defaultdict(list)     # (technique, key, impl) -> its rows' outcomes
    worst: dict[tuple, tuple] = {}                                    # -> (severity, ratio) of the row shown
    for r in _judged(rows):
        if not r.technique or _is_zoo(r):
            continue
        t = tables.setdefault(r.technique, {"impls": [], "props": {}})
        impl = r.implementation or NOT_PER_IMPL
        if impl not in t["impls"]:
            t["impls"].append(impl)
        law = r.check.split("::")[-1].split("[")[0]
        key = (law, r.claim, r.dtype)
        prop = t["props"].setdefault(key, {"law": law, "claim": r.claim, "dtype": r.dtype,
                                           "check": r.check.split("[")[0], "cells": {}})
        ratio = (r.measured / r.bound if isinstance(r.measured, (int, float)) and isinstance(r.bound, (int, float))
                 and r.bound else -1.0)
        cell = {"verdict": read(r).value, "measured": r.measured, "bound": r.bound, "ratio": ratio,
                "message": r.message[:300], "error_text": ""}
        if isinstance(r.measured, (int, float)) and isinstance(r.bound, (int, float)):
            cell["error_text"] = f"{_num(r.measured)} / {_num(r.bound)}"
            if read(r).fails_law and r.measured <= r.bound:      # its comparisons held; another check failed
                said = (r.message or "").strip().splitlines()
                cell["error_text"] += f" held; failed: {said[0][:80] if said else 'another check'}"
        elif r.unit == "rejection":
            cell["error_text"] = ""
        if r.evidence:
            cell["error_text"] = "; ".join(filter(None, (cell["error_text"], _evidence_text(r))))
        if (prop_text := batch_invariance_text([r.extra or {}])) is not None:   # properties/test_batch_invariance.py
            cell["error_text"] = prop_text
        if (said := declared_text([r.extra or {}])) is not None:   # properties/inference_engine/declarations.py
            cell["error_text"] = "; ".join(filter(None, (cell["error_text"], said)))
        seen = outcomes_seen[(r.technique, key, impl)]
        seen.append(read(r))
        if impl not in prop["cells"] or (read(r).severity, ratio) > worst[(r.technique, key, impl)]:
            prop["cells"][impl], worst[(r.technique, key, impl)] = cell, (read(r).severity, ratio)
        prop["cells"][impl]["verdict"] = Outcome.combine(seen).value    # a pass and a refusal: partial
    return {t: {"impls": v["impls"], "properties": sorted(v["props"].values(), key=lambda p: (p["law"], p["claim"], p["dtype"]))}
            for t, v in sorted(tables.items())}


def benchmark_entries(records: list[dict], ceilings: dict | None) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for rec in records:
        st, info = rec.get("stats") or {}, rec.get("extra_info") or {}
        fr = benchmark_records.fractions(rec, ceilings)
        ach = benchmark_records.achieved(rec)
        e = dict(rec)
        e.pop("data", None)
        e.update(median=st.get("median"), iqr=st.get("iqr"), rounds=st.get("rounds"),
                 median_text=_secs(st.get("median")), iqr_text=_secs(st.get("iqr")),
                 extra_text=", ".join(f"{k}={_num(v)}" for k, v in info.items() if not isinstance(v, (dict, list))),
                 achieved=ach, fractions=fr,
                 fraction_text=", ".join(f"{k.split('_')[0]} {v:.1%}" for k, v in fr.items()))
        out[rec["technique"]].append(e)
    return dict(out)


def world_cards() -> list[dict]:
    """The shipped small world's model cards (smallworld/checkpoints/*.json), the figures
    the quantization and speculative-decoding claims are measured on. Empty if none ship."""
    try:
        from inference_conformance.smallworld import checkpoints as ck
    except ImportError:
        return []
    cards = []
    for name in ck.NAMES:
        try:
            card = ck.load_card(name)
        except (FileNotFoundError, ValueError):
            continue
        cfg = card.get("config", {})
        cards.append({"name": name, "parameters": card.get("parameters"),
                      "config": f"d={cfg.get('d_model')}, {cfg.get('n_layers')} layers, {cfg.get('n_heads')} heads, "
                                f"d_ff={cfg.get('d_ff')}, V={cfg.get('vocab_size')}",
                      "steps": card.get("training_steps"), "seed": card.get("seed"),
                      "test_nll": card.get("test_nll"), "grammatical": card.get("grammatical_fraction"),
                      "samples": card.get("samples"), "wall_s": card.get("train_wall_s"),
                      "entropy": card.get("entropy_rate_estimate")})
    return cards


def tolerance_rules() -> list[dict]:
    """The tolerance policy's rules (inference_conformance.conformance.tolerance.all_rules()): key, what each sees and what
    it is blind to, for the report's section next to the verdicts."""
    from inference_conformance.conformance import tolerance

    return [{"key": str(k).replace("torch.", ""), "name": r.name, "sees": r.sees, "blind_to": r.blind_to}
            for k, r in tolerance.all_rules().items()]


def context(rows: list[Row], records: list[dict], *, fp: dict | None = None, ceilings: dict | None = None,
            history_entries: list[tuple] | None = None, plot_dir: Path | None = None,
            series_name: str | None = None, run: dict | None = None) -> dict:
    """Everything the report shows, as one JSON-able dict (plots drawn into ``plot_dir``);
    ``series_name``: the history series shown (default: this device's slug); ``run`` says which
    run it shows (id, kind, started, ``rows_of``, ``notes``)."""
    fp = fp or env.fingerprint(None)
    series_name = series_name or env.device_slug(fp)
    ledger = claim_verdicts(rows, records)
    rates = kill_rates(rows)
    for k in rates.values():
        k["rate_text"] = f"{k['rate']:.0%}" if k["rate"] is not None else "n/a"
    props = property_tables(rows)
    benches = benchmark_entries(records, ceilings)
    names = sorted(set(props) | set(benches) | set(rates))
    techniques = [{"name": t, "impls": props.get(t, {}).get("impls", []),
                   "properties": props.get(t, {}).get("properties", []),
                   "benchmarks": benches.get(t, []), "killrate": rates.get(t)} for t in names]
    series = history_entries or []
    plot_list = plots.all_plots(rows, records, ceilings, series, plot_dir) if plot_dir is not None else []
    cvals = benchmark_records.ceiling_values(ceilings)
    ceilings_text = {}
    for k, v in (ceilings or {}).items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            ceilings_text[k] = _num(float(v))
        elif k == "matmul_flops_per_s" and isinstance(v, dict):
            for d, x in v.items():
                ceilings_text[f"matmul FLOP/s ({d})"] = _num(float(x)) if isinstance(x, (int, float)) else str(x)
        elif k in ("device_name", "method"):
            ceilings_text[k] = str(v)
    return {"fingerprint": fp, "device_model": env.device_model(fp), "series": series_name,
            "summary": summary(ledger), "claims": ledger, "techniques": techniques, "killrates": rates,
            "unclaimed_failures": [{"check": r.check, "verdict": r.verdict, "message": r.message[:300]}
                                   for r in rows if not r.claim and read(r).new_failure],
            "benchmarks": [dict(r) for r in records], "ceilings": ceilings or {}, "ceiling_values": cvals,
            "ceilings_text": ceilings_text, "plots": plot_list,
            "history": [{"file": p.name, "date": e["fingerprint"].get("date"),
                         "commit": (e["fingerprint"].get("commit") or "")[:10], "n": len(e.get("benchmarks", []))}
                        for p, e in series],
            "world": world_cards(), "tolerance_rules": tolerance_rules(),
            "n_rows": len(rows), "n_bench": len(records), "run": run,
            "gate_calibration": gate_calibration()}


# ---- the regression gate's measured calibration (python -m inference_conformance.perf.calibrate writes it) ----
def gate_calibration(path: Path = CALIBRATION) -> dict | None:
    """The gate's committed A/A calibration (false alarms, power), read as data: the ``report``
    part of the JSON ``python -m inference_conformance.perf.calibrate analyse`` writes, with the file's path; None
    when the file is absent or unreadable or has no such part."""
    try:
        table = json.loads(Path(path).read_text()).get("report")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(table, dict):
        return None
    return dict(table, file=str(Path(path).relative_to(ROOT)) if Path(path).is_relative_to(ROOT) else str(path))
# ---- end of the gate's calibration ----


def render(ctx: dict, out: Path) -> list[Path]:
    """Write index.html and report.md from ``ctx``."""
    fp = ctx["fingerprint"]
    common = dict(ctx, fp=fp, series_name=ctx["series"], fp_json=json.dumps(fp, indent=1))
    html = templating.html_env().get_template("index.html.j2").render(**common)
    md = templating.md_env().get_template("report.md.j2").render(**common)
    return [atomic.write_text(out / "index.html", html), atomic.write_text(out / "report.md", md)]


def write_report(rows_dir: Path, out: Path, *, bench_json: Path | dict | None = None, ceilings: dict | None = None,
                 fp: dict | None = None, history_dir: Path | None = hist.HISTORY, run: dict | None = None,
                 matrix_runs: list | None = None) -> list[Path]:
    """Read rows (and benchmarks, ceilings, history) and write index.html, report.md,
    results.json and plots/ into ``out``, each file whole or not at all; earlier plots are
    removed only where the suite made ``out`` (:func:`inference_conformance.reports.publish.is_marked`). The
    conformance matrix (:mod:`inference_conformance.reports.merge`) shows this run's rows beside ``matrix_runs``
    (runs of other environments, :func:`inference_conformance.reports.merge.load`). Returns the written paths."""
    out = Path(out)
    rows = []
    if Path(rows_dir).is_dir():
        rows = read_rows(rows_dir) + [r for d in sorted(Path(rows_dir).iterdir()) if d.is_dir() for r in read_rows(d)]
    elif Path(rows_dir).exists():
        rows = read_rows(rows_dir)
    if bench_json is None and (out / "benchmarks.json").exists():
        bench_json = out / "benchmarks.json"
    records = benchmark_records.records(bench_json)
    fp = fp or env.fingerprint(next((r.device for r in rows if r.device), None))
    series_name = hist.newest_series(fp, history_dir) if history_dir is not None else env.device_slug(fp)
    series = hist.series(series_name, history_dir) if history_dir is not None else []
    plot_dir = out / "plots"
    if plot_dir.is_dir() and publish.is_marked(out):
        for p in plot_dir.glob("*.png"):
            p.unlink()
    ctx = context(rows, records, fp=fp, ceilings=ceilings, history_entries=series, plot_dir=plot_dir,
                  series_name=series_name, run=run)
    ctx["plots"].append(serving.plot_latency_throughput(history_dir, plot_dir))
    from inference_conformance.reports import merge

    ctx["matrix"] = merge.matrix([merge.run_of(rows_dir, rows, fp), *(matrix_runs or [])])
    ctx["matrix"].pop("rows")
    paths = render(ctx, out)
    doc = dict(ctx, rows=[asdict(r) for r in rows])
    return paths + [atomic.write_text(out / "results.json", json.dumps(doc, indent=1, default=str))]
