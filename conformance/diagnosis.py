"""Diagnosis by the zoo: which known bug reproduces a failing implementation's output.

When a law fails on an implementation, :func:`compact` turns the failure into a
:class:`inference_conformance.conformance.failures.LawFailure` (the case, the failing comparison,
the implementation) and :func:`diagnose` adds its last line: the technique's known-bad entries
(``properties/<technique>/zoo.py``, :func:`inference_conformance.conformance.registry.zoo`) are
replayed on the failing case, one run of the law's body each (the law's own inputs, calls and
comparisons), and the output each hands to the failing comparison is judged against the
implementation's by that comparison's own rule and bound::

    diagnosis: same output as known bug top_left_causal: Causal mask aligned top-left ...
    diagnosis: no known bug reproduces this output

A zoo entry that raises, refuses or fails an earlier comparison of the law (which the
implementation passed) is not the bug; the replays stop after :data:`SECONDS` seconds (the line
then says how many were checked). Nothing a replay compares is recorded in the test's result
row.
"""
from __future__ import annotations

import inspect
import time
from typing import Any

from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from inference_conformance.conformance import registry, results
from inference_conformance.conformance.failures import (
    Comparison,
    LawFailure,
    capturing,
    case_line,
    comparison_line,
    crash_of,
    first_line,
)

#: Wall-clock seconds the replays of one failure may take together (checked between entries).
SECONDS = 10.0
_NOTHING = object()


def _assertions(exc: BaseException) -> list[AssertionError]:
    """The AssertionErrors in ``exc``: itself, or those inside an exception group (Hypothesis'
    report of several distinct failures), in order."""
    if isinstance(exc, AssertionError):
        return [exc]
    return [a for sub in getattr(exc, "exceptions", ()) for a in _assertions(sub)]


def _failing_comparison(exc: AssertionError, comparisons: list[Comparison]) -> Comparison | None:
    """The comparison ``exc`` reports: the one whose verdict it carries, else the last one when
    that failed (a law asserting on a verdict itself)."""
    verdict = getattr(exc, "verdict", None)
    for c in comparisons:
        if verdict is not None and c.verdict is verdict:
            return c
    return comparisons[-1] if comparisons and not comparisons[-1].verdict.ok else None


def compact(law, run, args: tuple, exc: BaseException) -> LawFailure | None:
    """The compact failure of ``law`` on ``run``'s implementation (``args``: the law's
    parameters), from what Hypothesis raised (``exc``: an AssertionError, or a group of
    failures: the first is reported, the others counted); None where it is not a check's
    failure, or the implementation is a zoo entry (its rejection keeps the law's own text)."""
    checks = _assertions(exc)
    if not checks or getattr(run.impl, "origin", "") == "zoo":
        return None
    first = checks[0]
    record = next((r for r in reversed(run._failures) if r[0] is first), run._failures[-1] if run._failures else None)
    drawn, comparisons = (record[1], record[2]) if record is not None else ({}, [])
    params = {p: a for p, a in zip(law.params, args) if p != "device"}
    comparison = _failing_comparison(first, comparisons)
    text = comparison_line(comparison.verdict) if comparison is not None else first_line(first)
    if len(checks) > 1:
        text += f" (and {len(checks) - 1} other failing example{'s' if len(checks) > 2 else ''})"
    if comparison is None:
        found = "not attempted: the law failed on a check that compares no output of the implementation"
    else:
        found = diagnose(law, run, args, drawn, comparisons.index(comparison), comparison)
    failure = LawFailure(case_line(drawn, params), text, run.implementation, found)
    failure.crash = crash_of(exc)      # a crash the law reports stays a crash (expectations, the matrix)
    return failure


def _replay(law, bug, run, args: tuple, drawn: dict, index: int, what: str) -> Any:
    """Run the law's body once on the zoo entry ``bug`` with the failing example's arguments;
    the output its comparison number ``index`` judged, or _NOTHING (it raised before, refused,
    or that comparison judged something else)."""
    zrun = type(run)(law.name, bug.name, bug, run.interpreted, tuple(law.coverage))

    def once(**kw):
        zrun._begin_example()
        law.body(zrun, *args, **kw)

    once.__signature__ = inspect.Signature(
        [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY) for k in drawn])
    with capturing() as comparisons, results.recording(results.Recorder()):
        try:
            if drawn:         # inside a Hypothesis test, so that the body's note() and reject() work
                settings(database=None, deadline=None, phases=[Phase.explicit], report_multiple_bugs=False,
                         suppress_health_check=list(HealthCheck))(
                    example(**drawn)(given(**{k: st.just(v) for k, v in drawn.items()})(once)))()
            else:
                once()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # noqa: BLE001 - a zoo entry that raises (or fails the law) is judged below
            pass
    if len(comparisons) <= index or comparisons[index].verdict.what != what:
        return _NOTHING
    return comparisons[index].out


def diagnose(law, run, args: tuple, drawn: dict, index: int, comparison: Comparison,
             seconds: float | None = None) -> str:
    """The diagnosis line of a failure of ``law`` on ``run``'s implementation: the known bugs of
    the law's technique whose output at the failing comparison (number ``index`` of the
    example, ``comparison``) is within that comparison's rule and bound of the
    implementation's, or that none is. ``seconds``: the time the replays may take (default
    :data:`SECONDS`)."""
    seconds = SECONDS if seconds is None else seconds
    try:
        regs, _ = registry.registrations(law.technique)
        bugs = [b for b in registry.zoo(law.technique) if b.unavailable is None]
    except Exception as exc:  # noqa: BLE001 - a zoo that cannot load leaves the failure undiagnosed
        return f"not attempted: the zoo of {law.technique} cannot be loaded ({first_line(exc)})"
    summaries = {r.name: r.summary for r in regs if r.origin == "zoo"}
    deadline = time.monotonic() + seconds
    same, checked = [], 0
    for bug in bugs:
        if time.monotonic() > deadline:
            break
        checked += 1
        out = _replay(law, bug, run, args, drawn, index, comparison.verdict.what)
        if out is not _NOTHING and comparison.same(comparison.out, out):
            same.append(bug.name)
    if same:
        summary = summaries.get(same[0], "")
        text = f"same output as known bug {same[0]}" + (f": {summary}" if summary else "")
        if len(same) > 1:
            text += (f" (and as {len(same) - 1} other known bug{'s' if len(same) > 2 else ''}, which this example "
                     f"cannot tell apart from it: {', '.join(same[1:])})")
        return text
    if not bugs:
        return f"no known bug of {law.technique} in the zoo"
    cut = f" ({checked} of {len(bugs)} known bugs replayed in the {seconds:g} s allowed)" if checked < len(bugs) else ""
    return "no known bug reproduces this output" + cut


__all__ = ["SECONDS", "compact", "diagnose"]
