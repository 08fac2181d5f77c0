"""Showing that a claim's own check can fail: the helper every ``test_<claim>_rejects_<what>``
of ``properties/<technique>/test_*_rejections.py`` uses (``docs/claims.md`` lists those tests per claim).

A rejection test runs the claim's check (the same function the claim's verdict comes from) on the
suite's own formula, model or measurements, which must pass, and on a known-bad one, which must
fail with the check's own message: a check made vacuous (one that passes everything) or one that
rejects everything makes the test fail.
"""
from __future__ import annotations

import re
from typing import Callable

from inference_conformance.conformance import results


def rejects(claim: str, check: Callable, good: tuple, bad: tuple, *, match: str) -> str:
    """Run ``check(*good)`` (must return without AssertionError) and ``check(*bad)`` (must raise
    AssertionError whose message matches the regular expression ``match``); record the rejection
    as the test's result row for ``claim`` (what the good run recorded is dropped: it is not
    this test's measurement) and return the failure's first line.

    Raises AssertionError when the check rejects the good input, accepts the bad one, or rejects
    it for another reason than ``match`` names; TypeError when ``good``/``bad`` are not tuples."""
    if not isinstance(good, tuple) or not isinstance(bad, tuple):
        raise TypeError(f"good and bad must be tuples of arguments, got {type(good).__name__}, {type(bad).__name__}")
    try:
        check(*good)
    except AssertionError as exc:
        raise AssertionError(f"{claim}: the check rejects the suite's own input: {exc}") from exc
    try:
        check(*bad)
    except AssertionError as exc:
        text = str(exc) or type(exc).__name__
        if not re.search(match, text):
            raise AssertionError(f"{claim}: the check rejected the known-bad input, but not by {match!r}: {text}") from exc
        first = text.splitlines()[0]
        results.recorder().reset()
        results.record(claim, measured=f"rejected: {first[:200]}", unit="rejection")
        return first
    raise AssertionError(f"{claim}: the check {getattr(check, '__name__', check)!r} accepted the known-bad input {bad!r}")


def judges(claim: str, judge: Callable, cases: dict[str, tuple]) -> dict[str, str]:
    """Run a claim's verdict rule ``judge(*args)`` (returning "holds", "fails" or
    "inconclusive") on each entry of ``cases`` (expected verdict -> arguments); every verdict
    must be the expected one. Records one rejection row for ``claim`` and returns the verdicts.
    Raises AssertionError naming the first case judged otherwise; ValueError without a "holds"
    case and a "fails" case (the rule must be seen to pass and to fail)."""
    if "holds" not in cases or "fails" not in cases:
        raise ValueError(f"cases must hold a 'holds' and a 'fails' case, got {sorted(cases)}")
    got = {want: judge(*args) for want, args in cases.items()}
    wrong = {want: v for want, v in got.items() if v != want}
    assert not wrong, f"{claim}: the rule judged {wrong} (expected verdict -> verdict given)"
    results.recorder().reset()
    results.record(claim, measured="rejected: " + ", ".join(f"{k} where expected" for k in got), unit="rejection")
    return got
