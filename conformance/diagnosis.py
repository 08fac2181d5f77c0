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
implementation passed) is not the bug; the replays stop after :data:`SECONDS` seconds of CPU time (the line
then says how many were checked). Nothing a replay compares is recorded in the test's result
row.

An implementation with several bugs at once matches no single entry of the zoo on an example
where more than one of them changes the output (a top-left mask and a wrong scale on a causal
Tq < Tk call). So where no entry matches, the diagnosis also runs the law's body on the implementation over the
technique's *isolations* of the failing example (``isolations(drawn)`` in its zoo module: the
same example with every feature neutral but one, the causal mask alone, the scale alone, the
sinks alone, ...) and, where the implementation fails one, replays the zoo there; each known
bug found so is named after the first diagnosis::

    diagnosis: no known bug reproduces this output; with one feature left: top_left_causal (the
    causal mask alone), ignores_scale (the scale alone)

:attr:`LawFailure.bugs` holds every name found (the terminal's one line per law lists them).
"""
from __future__ import annotations

import importlib
import inspect
import time
from typing import Any

from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from inference_conformance.conformance import registry, results
from inference_conformance.conformance.failures import (
    CapturedComparison,
    LawFailure,
    capturing,
    case_line,
    comparison_line,
    crash_of,
    first_line,
)

#: Seconds of this process's CPU time the replays of one failure may take together (checked
#: between entries; CPU time, so that a loaded machine diagnoses as an idle one does).
SECONDS = 10.0
_NOTHING = object()


def _assertions(exc: BaseException) -> list[AssertionError]:
    """The AssertionErrors in ``exc``: itself, or those inside an exception group (Hypothesis'
    report of several distinct failures), in order."""
    if isinstance(exc, AssertionError):
        return [exc]
    return [a for sub in getattr(exc, "exceptions", ()) for a in _assertions(sub)]


def _failing_comparison(exc: AssertionError, comparisons: list[CapturedComparison]) -> CapturedComparison | None:
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
    bugs: list[str] = []
    if comparison is None:
        found = "not attempted: the law failed on a check that compares no output of the implementation"
    else:
        deadline = time.process_time() + SECONDS
        found = diagnose(law, run, args, drawn, comparisons.index(comparison), comparison, named=bugs)
        if not bugs:          # several bugs at once, or none the zoo knows: one feature at a time
            found += isolated(law, run, args, drawn, bugs, deadline)
    failure = LawFailure(case_line(drawn, params), text, run.implementation, found, bugs=tuple(bugs))
    failure.crash = crash_of(exc)      # a crash the law reports stays a crash (expectations, the matrix)
    return failure


def _comparisons(law, impl, run, args: tuple, drawn: dict) -> list[CapturedComparison]:
    """Run the law's body once on the implementation ``impl`` with the arguments ``drawn``: the
    comparisons of the tolerance policy it made (those before it raised, refused or failed)."""
    zrun = type(run)(law.name, impl.name, impl, run.interpreted, tuple(law.coverage))

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
        except BaseException:  # noqa: BLE001 - an entry that raises (or fails the law) is judged by its comparisons
            pass
    return comparisons


def _replay(law, bug, run, args: tuple, drawn: dict, index: int, what: str) -> Any:
    """Run the law's body once on the zoo entry ``bug`` with the failing example's arguments;
    the output its comparison number ``index`` judged, or _NOTHING (it raised before, refused,
    or that comparison judged something else)."""
    comparisons = _comparisons(law, bug, run, args, drawn)
    if len(comparisons) <= index or comparisons[index].verdict.what != what:
        return _NOTHING
    return comparisons[index].out


def _isolations(technique: str, drawn: dict) -> list[tuple[str, dict]]:
    """The technique's variants of a failing example with one feature left (its zoo module's
    ``isolations(drawn)``: (label, drawn) pairs); none where it declares none."""
    try:
        module = importlib.import_module(f"inference_conformance.properties.{technique}.zoo")
    except ImportError:
        return []
    declared = getattr(module, "isolations", None)
    return list(declared(dict(drawn))) if declared is not None else []


def isolated(law, run, args: tuple, drawn: dict, named: list[str], deadline: float) -> str:
    """The diagnosis's second part: the known bugs found on the isolations of the failing example
    ``drawn`` (module docstring) that ``named`` does not hold yet, each with the feature left
    ("; with one feature left: ignores_scale (the scale alone)"), appended to ``named``; "" where
    none (or the time allowed is spent)."""
    found = []
    try:
        variants = _isolations(law.technique, drawn)
    except Exception:  # noqa: BLE001 - isolations that cannot be made leave the first diagnosis alone
        return ""
    for label, variant in variants:
        if time.process_time() > deadline:
            break
        comparisons = _comparisons(law, run.impl, run, args, variant)
        failing = next((i for i, c in enumerate(comparisons) if not c.verdict.ok), None)
        if failing is None:
            continue
        same, _, _ = _matching(law, run, args, variant, failing, comparisons[failing], deadline)
        new = [b for b in same if b not in named]
        named.extend(new)
        found += [f"{b} ({label})" for b in new]
    return f"; with one feature left: {', '.join(found)}" if found else ""


def _matching(law, run, args: tuple, drawn: dict, index: int, comparison: CapturedComparison,
              deadline: float) -> tuple[list[str], int, int]:
    """The zoo entries of the law's technique whose output at comparison ``index`` of the
    example ``drawn`` is within that comparison's rule and bound of the implementation's, the
    entries replayed before ``deadline`` and the entries there are. Raises what loading the zoo
    raises."""
    bugs = [b for b in registry.zoo(law.technique) if b.unavailable is None]
    same, checked = [], 0
    for bug in bugs:
        if time.process_time() > deadline:
            break
        checked += 1
        out = _replay(law, bug, run, args, drawn, index, comparison.verdict.what)
        if out is not _NOTHING and comparison.same(comparison.out, out):
            same.append(bug.name)
    return same, checked, len(bugs)


def diagnose(law, run, args: tuple, drawn: dict, index: int, comparison: CapturedComparison,
             seconds: float | None = None, named: list[str] | None = None) -> str:
    """The diagnosis line of a failure of ``law`` on ``run``'s implementation: the known bugs of
    the law's technique whose output at the failing comparison (number ``index`` of the
    example, ``comparison``) is within that comparison's rule and bound of the
    implementation's, or that none is. ``seconds``: the time the replays may take (default
    :data:`SECONDS`); ``named``: a list the names found are appended to."""
    seconds = SECONDS if seconds is None else seconds
    try:
        regs, _ = registry.registrations(law.technique)
        same, checked, total = _matching(law, run, args, drawn, index, comparison, time.process_time() + seconds)
    except Exception as exc:  # noqa: BLE001 - a zoo that cannot load leaves the failure undiagnosed
        return f"not attempted: the zoo of {law.technique} cannot be loaded ({first_line(exc)})"
    if named is not None:
        named.extend(same)
    summaries = {r.name: r.summary for r in regs if r.origin == "zoo"}
    if same:
        summary = summaries.get(same[0], "")
        text = f"same output as known bug {same[0]}" + (f": {summary}" if summary else "")
        if len(same) > 1:
            text += (f" (and as {len(same) - 1} other known bug{'s' if len(same) > 2 else ''}, which this example "
                     f"cannot tell apart from it: {', '.join(same[1:])})")
        return text
    if not total:
        return f"no known bug of {law.technique} in the zoo"
    cut = f" ({checked} of {total} known bugs replayed in the {seconds:g} s allowed)" if checked < total else ""
    return "no known bug reproduces this output" + cut


__all__ = ["SECONDS", "compact", "diagnose", "isolated"]
