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

import re

import pytest

from inference_conformance.conformance.failures import failure_kind
from inference_conformance.conformance.outcomes import Unsupported

#: the verdict of a listed failure that was refused or skipped instead
STALE = "stale expectation"
#: the verdict of a law that passed on too little of its input to say it holds
THIN = "not enough evidence"
#: below this fraction of its examples accepted, a partial law is "not enough evidence"
MIN_ACCEPTED = 0.25


def evidence_of(partial: str, refused_classes: list[str] | None = None, judged: list[str] | None = None) -> dict:
    """What a law's "partial: refused R of N examples (reason); classes only refused: a, b" text
    (:meth:`inference_conformance.conformance.laws.Run.partial_text`) says: ``{"accepted": N - R,
    "examples": N, "refused_classes": [a, b]}``; {} for any other text. ``refused_classes``: the
    classes by name where the law gave them (a name may hold a comma: the text's list is then
    not split), ``judged``: the digests of the inputs it judged and passed (kept as given)."""
    thin = re.search(rf"{THIN}: ([^;]*)", partial)
    m = re.search(r"refused (\d+) of (\d+) examples", partial)
    if m is None:
        return {"thin": thin[1]} if thin else {}
    _, sep, classes = partial.rpartition("; classes only refused: ")
    if refused_classes is None:
        refused_classes = [c.strip() for c in classes.split(",") if c.strip()] if sep else []
    return {"accepted": int(m[2]) - int(m[1]), "examples": int(m[2]), "refused_classes": list(refused_classes)} | (
        {"judged": list(judged)} if judged is not None else {}) | ({"thin": thin[1]} if thin else {})


def insufficient(evidence: dict) -> str:
    """Why a partial law's ``evidence`` (:func:`evidence_of`) is not enough to say it holds:
    fewer than :data:`MIN_ACCEPTED` of its examples accepted; "" when it is enough. (The
    boundary classes only refused examples reached are shown beside every partial verdict.)
    A part of a law that says itself "not enough evidence: why" (a statistical test under its
    power floor, :meth:`inference_conformance.conformance.law_run.Run.uncheck`) is that "why"."""
    if evidence.get("thin"):
        return evidence["thin"]
    k, n = evidence.get("accepted", 0), evidence.get("examples", 0)
    if n and k < MIN_ACCEPTED * n:
        return f"{k} of {n} examples accepted, fewer than {MIN_ACCEPTED:g} of them"
    return ""


def effective(verdict: str, evidence: dict | None) -> str:
    """The verdict a report shows for a row's ``verdict`` and ``evidence``: :data:`THIN` for a
    partial row whose evidence is :func:`insufficient`, else ``verdict``."""
    return THIN if verdict == "partial" and evidence and insufficient(evidence) else verdict


def partial_message(partial: str) -> str:
    """A partial law's message, led by "k of n examples" and its refused classes."""
    ev = evidence_of(partial)
    if "examples" not in ev:
        return partial
    refused = ev["refused_classes"]
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


def outcome(report, call, entry, partial: str, allow_unexpected_pass: bool, worst=None) -> tuple[str, str]:
    """(verdict, message) of one test's ``report`` (its call phase, or a setup that did not pass);
    ``entry``: the test's expectation entry or None; ``partial``: the recorder's "partial: refused
    ..." text; ``worst``: the test's worst verdict of the tolerance policy (what a plain assert's
    failure is judged by). A listed "unsupported"/"partial" test that passes in full is an
    unexpected pass, and a listed failure refused or skipped in its test a stale expectation:
    both fail ``report`` unless ``allow_unexpected_pass``. A listed failure outside the entry's
    signature fails ``report`` (verdict "fail" or "error"). A test's own xfail marker (no entry)
    keeps its plain rows (skip / fail)."""
    # only an --expect entry's xfail: a test's own xfail marker keeps its old rows (skip / fail)
    xpass = entry is not None and isinstance(report.longrepr, str) and report.longrepr.startswith("[XPASS(strict)]")
    if entry is not None and hasattr(report, "wasxfail") and report.skipped:
        kind = failure_of(call, worst)
        differs = entry.admits(kind) if kind else ""
        if differs:
            return ("fail" if report.when == "call" else "error"), _new_failure(report, entry, differs)
        outcome = "expected fail"
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else str(report.wasxfail)
    elif (entry is not None and hasattr(report, "wasxfail") and report.passed) or xpass:
        outcome, message = "unexpected pass", f"passed; expected to fail: {report.wasxfail if not xpass else report.longrepr}"
    elif report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        refused = call.excinfo is not None and isinstance(call.excinfo.value, Unsupported)
        outcome = "unsupported" if refused else "skip"
        message = reason
        if entry is not None and entry.expected == "fail" and (refused or report.when == "call"):
            # the listed failure is no longer reached: refused or skipped where it used to fail
            outcome = STALE
            message = f"{STALE}: listed as failing, now {'unsupported' if refused else 'skipped'}: {reason}; " \
                      f"{expect_reason(entry)}"
            if not allow_unexpected_pass:
                report.outcome = "failed"
                report.longrepr = f"[STALE(strict)] {message}"
    elif report.failed:
        outcome = "fail" if report.when == "call" else "error"
        message = _crash_message(report)
    else:
        outcome, message = ("partial", partial_message(partial)) if partial else ("pass", "")
        thin = insufficient(evidence_of(partial)) if partial else ""
        if thin:
            message = f"{THIN}: {thin}; {message}"
        if entry is not None and entry.expected in ("unsupported", "partial") and outcome == "pass":
            # listed as refused (in all or part): a full pass is a fix, said like wptrunner
            outcome = "unexpected pass"
            message = f"passed; {expect_reason(entry)}"
            if not allow_unexpected_pass:
                report.outcome = "failed"
                report.longrepr = f"[XPASS(strict)] {message}"
    return outcome, message
