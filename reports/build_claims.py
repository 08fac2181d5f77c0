"""The claims' verdicts of the report: each claim's verdict from its rows, the figures it shows and
the evidence that decided it (:func:`deciding`, :func:`decided_text`): a claim never reads "fails"
or "inconclusive" without the report showing the rows that made it so.
"""
from __future__ import annotations

import math

from inference_conformance.conformance.outcomes import ClaimVerdict, Outcome, read
from inference_conformance.conformance.results import Row


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


def _verdict_of(rs: list[Row], kind: str) -> ClaimVerdict:
    """The verdict of a claim's rows (all of one implementation, or all of them): the claim word
    (:attr:`inference_conformance.conformance.outcomes.Outcome.claim`) of the worst row that has one,
    in the one order of :class:`inference_conformance.conformance.outcomes.Outcome`; "not measured"
    when no row has one (every row skipped or refused); a trend or figure claim whose rows
    carry ``extra["holds"]`` (the claim's own figure compared with the lecture's) fails where
    one of them is false, is "inconclusive" where none is false and one is None (its interval
    straddles the claim's mark: the run cannot tell), and a trend without such rows is "not
    measured" (a passing test alone never shows a direction)."""
    worst = Outcome.worst(o for o in map(read, rs) if o.claim is not None)
    if worst is None:
        return ClaimVerdict.NOT_MEASURED
    verdict = worst.claim
    held = [r.extra.get("holds") for r in rs if isinstance(r.extra, dict) and "holds" in r.extra]
    if verdict.holding and kind in ("trend", "figure"):
        if held:
            verdict = (ClaimVerdict.FAILS if any(h is False for h in held)
                       else ClaimVerdict.INCONCLUSIVE if any(h is None for h in held) else verdict)
        elif kind == "trend":
            verdict = ClaimVerdict.NOT_MEASURED
    return verdict


def _evidence_text(r: Row) -> str:
    """A partial row's "k of n examples" and the classes only its refused examples reached."""
    ev = r.evidence or {}
    thin = f"{Outcome.THIN}: {ev['thin']}" if ev.get("thin") else ""
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
    False (None); for a failing claim the rows whose outcome fails the law, worst first; for
    any other verdict none."""
    verdict = ClaimVerdict(verdict)
    if verdict in (ClaimVerdict.FAILS, ClaimVerdict.INCONCLUSIVE) and kind in ("trend", "figure"):
        want = False if verdict is ClaimVerdict.FAILS else None
        held = [r for r in rs if isinstance(r.extra, dict) and "holds" in r.extra and r.extra["holds"] is want]
        if held:
            return held
    if verdict in (ClaimVerdict.FAILS, ClaimVerdict.FAILS_EXPECTED):
        return sorted((r for r in rs if read(r).fails_law), key=lambda r: -read(r).severity)
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
