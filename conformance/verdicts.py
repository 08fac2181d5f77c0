"""A test's report as the verdict of its result rows: "pass", "partial", "fail", "error",
"skip", "unsupported" (the implementation refused: :class:`inference_conformance.conformance.outcomes.Unsupported`),
and with an expectation entry (:mod:`inference_conformance.conformance.expectations`) "expected fail",
"unexpected pass" or "stale expectation".

A listed failure is expected only within its entry's signature (exception type, check, rule,
band of the measured error): any other failure of the test, a crash included, is a new failure
("fail"), and the report says how it differs. A listed failure that ends "unsupported", or
skipped by the test itself, is a "stale expectation": the implementation no longer reaches the
failure it was listed for (it may refuse the very input it failed); like an unexpected pass it
fails the test unless ``--allow-unexpected-pass``. A skip before the test ran (its
implementation's package missing, a skip marker) is only "skip".

A law that passed on part of its input ("partial") says "k of n examples" and the boundary
classes only refused examples reached (its rows' ``evidence``); with fewer than
:data:`MIN_ACCEPTED` of its examples accepted, or with a part it says is "not enough evidence" (a statistical test under
its power floor), its row stays "partial" (what happened) and every reader judges it "not
enough evidence" (:data:`THIN`, :func:`effective`), which never reads as holding."""
from __future__ import annotations

import pytest

from inference_conformance.conformance.failures import failure_kind
from inference_conformance.conformance.outcomes import (MIN_ACCEPTED, Outcome, Unsupported, effective,  # noqa: F401
                                                        evidence_from_text, insufficient)

#: the verdict of a listed failure that was refused or skipped instead
STALE = Outcome.STALE
#: the verdict of a law that passed on too little of its input to say it holds
THIN = Outcome.THIN


def evidence_of(partial: str, refused_classes: list[str] | None = None, judged: list[str] | None = None) -> dict:
    """What an older row's text "partial: refused R of N examples (reason); classes only refused:
    a, b" says (:func:`inference_conformance.conformance.outcomes.evidence_from_text`), for reading
    rows written before the evidence was a field of its own: ``{"accepted": N - R, "examples": N,
    "refused_classes": [a, b]}``; {} for any other text. ``refused_classes``: the classes by name
    where known (a name may hold a comma), ``judged``: the digests of the inputs judged."""
    ev = evidence_from_text(partial)
    if "examples" in ev and refused_classes is not None:
        ev["refused_classes"] = list(refused_classes)
    if "examples" in ev and judged is not None:
        ev["judged"] = list(judged)
    return ev


def partial_message(partial: str, evidence: dict | None = None) -> str:
    """A partial law's message, led by "k of n examples" and its refused classes (its
    ``evidence``), then its own text ``partial``."""
    ev = evidence or {}
    if "examples" not in ev:
        return partial
    refused = ev.get("refused_classes") or []
    return (f"partial: {ev['accepted']} of {ev['examples']} examples"
            + (f", refused classes: {', '.join(refused)}" if refused else "") + f" ({partial})")


def expect_reason(entry) -> str:
    """The xfail reason of an expectation entry: outcome, file, reason, link."""
    return f"expected {entry.expected} ({entry.source}): {entry.reason}" + (f" [{entry.link}]" if entry.link else "")


def failure_of(call, worst=None) -> dict:
    """The failure kind of a test phase's exception (:func:`inference_conformance.conformance.failures.failure_kind`),
    or {} where the phase raised nothing or was skipped; ``worst``: the test's worst verdict."""
    excinfo = getattr(call, "excinfo", None)
    if excinfo is None or isinstance(excinfo.value, (pytest.skip.Exception, pytest.xfail.Exception,
                                                     pytest.exit.Exception)):
        return {}
    return failure_kind(excinfo.value, worst)


def _crash_message(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message
    return report.longreprtext.strip().splitlines()[-1] if report.longreprtext else ""


def _new_failure(report, entry, differs: str) -> str:
    """Turn an expected failure outside ``entry``'s signature back into a failure; its message."""
    report.outcome = "failed"
    del report.wasxfail
    note = (f"new failure, not the expected one: {differs} (expected {entry.signature()}, "
            f"{entry.source}: {entry.key})")
    report.sections.append(("conformance: a failure outside its expectation's signature", note))
    return f"{note}\n{_crash_message(report)}"


def outcome(report, call, entry, partial: str, allow_unexpected_pass: bool, worst=None,
            evidence: dict | None = None) -> tuple[Outcome, str]:
    """(outcome, message) of one test's ``report`` (its call phase, or a setup that did not pass);
    ``entry``: the test's expectation entry or None; ``partial``: the recorder's "partial: ..."
    text and ``evidence`` its structured evidence (k of n, refused classes, why not enough:
    :func:`inference_conformance.conformance.outcomes.evidence`); ``worst``: the test's worst
    comparison of the tolerance policy (what a plain assert's failure is judged by). A listed
    "unsupported"/"partial" test that passes in full is an unexpected pass, and a listed failure
    refused or skipped in its test a stale expectation: both fail ``report`` unless
    ``allow_unexpected_pass`` (:attr:`Outcome.exit`). A listed failure outside the entry's
    signature fails ``report`` (outcome "fail" or "error"); a pass of an intermittent entry's test
    is a pass. A test's own xfail marker (no entry)
    keeps its plain rows (skip / fail)."""
    # only an --expect entry's xfail: a test's own xfail marker keeps its old rows (skip / fail)
    xpass = entry is not None and isinstance(report.longrepr, str) and report.longrepr.startswith("[XPASS(strict)]")
    failed_phase = Outcome.FAIL if report.when == "call" else Outcome.ERROR
    listed = Outcome.of(entry.expected) if entry is not None else None
    if entry is not None and hasattr(report, "wasxfail") and report.skipped:
        kind = failure_of(call, worst)
        differs = entry.admits(kind) if kind else ""
        if differs:
            return failed_phase, _new_failure(report, entry, differs)
        verdict = Outcome.EXPECTED_FAIL
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else str(report.wasxfail)
    elif entry is not None and entry.intermittent and hasattr(report, "wasxfail") and report.passed:
        verdict, message = Outcome.PASS, f"passed this run; listed as intermittent: {expect_reason(entry)}"
    elif (entry is not None and hasattr(report, "wasxfail") and report.passed) or xpass:
        verdict = Outcome.UNEXPECTED_PASS
        message = f"passed; expected to fail: {report.wasxfail if not xpass else report.longrepr}"
    elif report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        refused = call.excinfo is not None and isinstance(call.excinfo.value, Unsupported)
        verdict = Outcome.UNSUPPORTED if refused else Outcome.SKIP
        message = reason
        if listed is not None and listed.fails_law and (refused or report.when == "call"):
            # the listed failure is no longer reached: refused or skipped where it used to fail
            verdict = STALE
            message = f"{STALE}: listed as failing, now {'unsupported' if refused else 'skipped'}: {reason}; " \
                      f"{expect_reason(entry)}"
            if STALE.fails_run(allow_unexpected_pass):
                report.outcome = "failed"
                report.longrepr = f"[STALE(strict)] {message}"
    elif report.failed:
        verdict, message = failed_phase, _crash_message(report)
    else:
        verdict, message = (Outcome.PARTIAL, partial_message(partial, evidence)) if partial else (Outcome.PASS, "")
        thin = insufficient(evidence) if partial else ""
        if thin:
            message = f"{THIN}: {thin}; {message}"
        if listed is not None and not listed.fails_law and verdict is Outcome.PASS:
            # listed as refused (in all or part): a full pass is a fix, said like wptrunner
            verdict, message = Outcome.UNEXPECTED_PASS, f"passed; {expect_reason(entry)}"
            if verdict.fails_run(allow_unexpected_pass):
                report.outcome = "failed"
                report.longrepr = f"[XPASS(strict)] {message}"
    return verdict, message
