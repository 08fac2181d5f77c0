"""The claims' verdicts of the report: each claim's verdict from its rows, the figures it shows and
the evidence that decided it (:func:`deciding`, :func:`decided_text`): a claim never reads "fails"
or "inconclusive" without the report showing the rows that made it so.
"""
from __future__ import annotations

import math

from inference_conformance.conformance.results import Row

#: Verdicts worst first; an "expected fail" (listed in an --expect file) is still a failure of the
#: law, ranked under a new one; an "unexpected pass" holds (the listed bug is fixed).
_ORDER = {"crashed": 9, "fail": 7, "error": 6, "stale expectation": 5.5, "expected fail": 5, "not enough evidence": 4.5,
          "unexpected pass": 4, "partial": 3, "pass": 2, "unsupported": 1, "skip": 0}
def _num(x) -> str:
    if x is None:
        return ""
    if isinstance(x, dict):
        return ", ".join(f"{k}: {_num(v)}" for k, v in x.items())
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(_num(v) for v in x) + "]"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, float):
        if not math.isfinite(x):
            return str(x)
        return f"{x:.4g}"
    if isinstance(x, int):
        return f"{x:,}" if abs(x) >= 10000 else str(x)
    return str(x)


def _fig_text(r: Row, value) -> str:
    what = r.extra.get("what") if isinstance(r.extra, dict) else None
    text = _num(value)
    if r.unit and value is not None and not isinstance(value, str):
        text += f" {r.unit}"
    if value is r.measured and isinstance(r.extra, dict) and "holds" in r.extra:
        lo, hi = r.extra.get("ci_low"), r.extra.get("ci_high")
        if "pairs" in r.extra and lo is not None and hi is not None:
            text += f" ({r.extra.get('pairs')} pairs, interval {_num(lo)}–{_num(hi)})"
        word = {True: "holds", False: "NOT reproduced", None: "inconclusive"}.get(r.extra["holds"], "NOT reproduced")
        text += f" [{word}: {r.extra.get('trend_rule', '')}]"
    return f"{what}: {text}" if what else text


_VERDICT_WORDS = {"pass": "holds", "partial": "holds (partial)", "fail": "fails", "error": "fails", "crashed": "fails",
                  "not enough evidence": "not enough evidence",
                  "expected fail": "fails (expected)", "unexpected pass": "holds (unexpected pass)"}


def _verdict_of(rs: list[Row], kind: str) -> str:
    """The verdict of a claim's rows (all of one implementation, or all of them): the worst
    judged row; "not measured" when every row was skipped; a trend or figure claim whose rows
    carry ``extra["holds"]`` (the claim's own figure compared with the lecture's) fails where
    one of them is false, is "inconclusive" where none is false and one is None (its interval
    straddles the claim's mark: the run cannot tell), and a trend without such rows is "not
    measured" (a passing test alone never shows a direction)."""
    judged = [r for r in rs if r.verdict in _VERDICT_WORDS]
    if not judged:
        return "not measured"
    verdict = _VERDICT_WORDS[max(judged, key=lambda r: _ORDER[r.verdict]).verdict]
    held = [r.extra.get("holds") for r in rs if isinstance(r.extra, dict) and "holds" in r.extra]
    if verdict.startswith("holds") and kind in ("trend", "figure"):
        if held:
            verdict = ("fails" if any(h is False for h in held) else "inconclusive" if any(h is None for h in held)
                       else verdict)
        elif kind == "trend":
            verdict = "not measured"
    return verdict


def _evidence_text(r: Row) -> str:
    """A partial row's "k of n examples" and the classes only its refused examples reached."""
    ev = r.evidence or {}
    thin = f"not enough evidence: {ev['thin']}" if ev.get("thin") else ""
    if "examples" not in ev:
        return thin
    refused = ev.get("refused_classes") or []
    return f"{ev.get('accepted')} of {ev.get('examples')} examples" + (
        f", refused classes: {'; '.join(refused)}" if refused else "") + (f"; {thin}" if thin else "")


def _worst_measured(rs: list[Row]) -> str:
    vals = [r for r in rs if isinstance(r.measured, (int, float)) and isinstance(r.bound, (int, float))
            and not isinstance(r.measured, bool)]
    if not vals:
        return ""

    def ratio(r):
        return r.measured / r.bound if r.bound else (0.0 if r.measured == 0 else math.inf)

    w = max(vals, key=ratio)
    return f"max error {_num(w.measured)} (bound {_num(w.bound)}{', ' + w.dtype if w.dtype else ''})"


def deciding(rs: list[Row], kind: str, verdict: str) -> list[Row]:
    """The rows of ``rs`` that decided ``verdict`` (:func:`_verdict_of`): for a trend or figure
    claim that fails or is inconclusive by its figures, the rows whose ``extra["holds"]`` is
    False (None); for "fails" the failed rows, worst first; for any other verdict none."""
    if verdict in ("fails", "inconclusive") and kind in ("trend", "figure"):
        want = False if verdict == "fails" else None
        held = [r for r in rs if isinstance(r.extra, dict) and "holds" in r.extra and r.extra["holds"] is want]
        if held:
            return held
    if verdict.startswith("fails"):
        return sorted((r for r in rs if r.verdict in ("fail", "error", "crashed", "expected fail")),
                      key=lambda r: -_ORDER.get(r.verdict, 0))
    return []


def decided_text(rows: list[Row], limit: int = 3) -> str:
    """What the deciding ``rows`` say, the first ``limit`` of them: the test, the implementation
    and dtype, and the figure against the claim's rule, or the failure's first line."""
    parts = []
    for r in rows[:limit]:
        who = "/".join(filter(None, (r.implementation, r.dtype)))
        what = _fig_text(r, r.measured) if isinstance(r.extra, dict) and "holds" in r.extra else \
            (r.message.splitlines()[0][:200] if r.message else r.verdict)
        parts.append(f"{r.check.split('::')[-1]} ({who}): {what}")
    more = f"; and {len(rows) - limit} more" if len(rows) > limit else ""
    return "decided by " + "; ".join(parts) + more if parts else ""
