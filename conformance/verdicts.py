"""A test's report as the verdict of its result rows: "pass", "partial", "fail", "error",
"skip", "unsupported" (the implementation refused: :class:`inference_conformance.conformance.outcomes.Unsupported`),
and with an expectation entry (:mod:`inference_conformance.conformance.expectations`) "expected fail" or "unexpected
pass"."""
from __future__ import annotations

from inference_conformance.conformance.outcomes import Unsupported


def expect_reason(entry) -> str:
    """The xfail reason of an expectation entry: outcome, file, reason, link."""
    return f"expected {entry.expected} ({entry.source}): {entry.reason}" + (f" [{entry.link}]" if entry.link else "")


def outcome(report, call, entry, partial: str, allow_unexpected_pass: bool) -> tuple[str, str]:
    """(verdict, message) of one test's ``report`` (its call phase, or a setup that did not pass);
    ``entry``: the test's expectation entry or None; ``partial``: the recorder's "partial: refused
    ..." text. A listed "unsupported"/"partial" test that passes in full is an unexpected pass, and
    fails ``report`` unless ``allow_unexpected_pass``. A test's own xfail marker (no entry) keeps
    its plain rows (skip / fail)."""
    # only an --expect entry's xfail: a test's own xfail marker keeps its old rows (skip / fail)
    xpass = entry is not None and isinstance(report.longrepr, str) and report.longrepr.startswith("[XPASS(strict)]")
    if entry is not None and hasattr(report, "wasxfail") and report.skipped:
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
    elif report.failed:
        outcome = "fail" if report.when == "call" else "error"
        message = report.longreprtext.strip().splitlines()[-1] if report.longreprtext else ""
        crash = getattr(report.longrepr, "reprcrash", None)
        if crash is not None:
            message = crash.message
    else:
        outcome, message = ("partial", partial) if partial else ("pass", "")
        if entry is not None and entry.expected in ("unsupported", "partial") and outcome == "pass":
            # listed as refused (in all or part): a full pass is a fix, said like wptrunner
            outcome = "unexpected pass"
            message = f"passed; {expect_reason(entry)}"
            if not allow_unexpected_pass:
                report.outcome = "failed"
                report.longrepr = f"[XPASS(strict)] {message}"
    return outcome, message
