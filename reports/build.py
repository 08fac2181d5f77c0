"""Build report.md and results.json from result rows and the claims ledger."""
from __future__ import annotations

import json
import platform
import subprocess
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

from conformance.results import Row, read_rows
from reports.ledger import claims

_ORDER = {"fail": 4, "error": 3, "pass": 2, "unsupported": 1, "skip": 0}


def fingerprint() -> dict:
    """Where the rows were measured: CPU/GPU model, driver, library versions, commit."""
    import torch
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    fp = {"python": platform.python_version(), "platform": platform.platform(),
          "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
          "triton": triton_version, "cuda": torch.version.cuda, "gpu": None, "driver": None}
    if torch.cuda.is_available():
        fp["gpu"] = torch.cuda.get_device_name(0)
        try:
            fp["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                          capture_output=True, text=True, timeout=10).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        fp["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                      cwd=Path(__file__).parent, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        fp["commit"] = None
    return fp


def claim_verdicts(rows: list[Row]) -> list[dict]:
    """One entry per ledger claim: its rows' worst verdict ("not checked" without rows)."""
    by_claim: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        if r.claim:
            by_claim[r.claim].append(r)
    out = []
    for c in claims():
        rs = by_claim.get(c.id, [])
        judged = [r for r in rs if r.verdict in ("pass", "fail", "error")]
        verdict = "not checked" if not rs else (
            max(judged, key=lambda r: _ORDER[r.verdict]).verdict if judged else "not measured")
        verdict = {"pass": "holds", "fail": "fails", "error": "fails"}.get(verdict, verdict)
        figures = [r for r in rs if r.lecture is not None]
        out.append({"id": c.id, "kind": c.kind, "text": c.text, "verdict": verdict,
                    "checks": sorted({r.check.split("[")[0] for r in rs}),
                    "lecture": figures[0].lecture if figures else None,
                    "measured": figures[0].measured if figures else _worst_measured(rs),
                    "unit": figures[0].unit if figures else (rs[0].unit if rs else ""),
                    "devices": sorted({r.device for r in rs if r.device})})
    return out


def _worst_measured(rs: list[Row]):
    vals = [r for r in rs if isinstance(r.measured, (int, float)) and isinstance(r.bound, (int, float)) and r.bound]
    if not vals:
        return None
    w = max(vals, key=lambda r: r.measured / r.bound)
    return f"{w.measured:.3g} (bound {w.bound:.3g})"


def _fmt(x) -> str:
    if x is None:
        return ""
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x).replace("|", "\\|").replace("\n", " ")


def write_report(rows_dir: Path, out: Path) -> list[Path]:
    rows = read_rows(rows_dir) if Path(rows_dir).exists() else []
    ledger = claim_verdicts(rows)
    fp = fingerprint()
    counts = defaultdict(int)
    for c in ledger:
        counts[c["verdict"]] += 1
    out.mkdir(parents=True, exist_ok=True)
    results = {"fingerprint": fp, "summary": dict(counts), "claims": ledger, "rows": [asdict(r) for r in rows]}
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    lines = ["# Conformance report", "",
             f"Device: {fp['gpu'] or fp['cpu']} · torch {fp['torch']} · triton {fp['triton']} · commit {fp.get('commit')}", "",
             "## Summary", "",
             f"{len(ledger)} claims: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())), "",
             "## Claims ledger", "", "| claim | kind | verdict | lecture | measured | checks |", "|---|---|---|---|---|---|"]
    for c in ledger:
        lines.append(f"| {c['id']} | {c['kind']} | {c['verdict']} | {_fmt(c['lecture'])} | "
                     f"{_fmt(c['measured'])} {c['unit'] if c['measured'] is not None else ''} | "
                     f"{'<br>'.join(c['checks'])} |")
    lines += ["", "## Property verdicts", "", "| claim | check | implementation | dtype | device | measured | bound | verdict |",
              "|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r.claim, r.check)):
        lines.append(f"| {r.claim} | `{r.check}` | {r.implementation} | {r.dtype} | {r.device} | "
                     f"{_fmt(r.measured)} | {_fmt(r.bound)} | {r.verdict} |")
    md = out / "report.md"
    md.write_text("\n".join(lines) + "\n")
    return [md, out / "results.json"]
