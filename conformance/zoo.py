"""The bug zoo's runner: a law must reject every known-bad implementation it names.

A law is a callable whose first argument is the implementation (``law(impl, ...)``): a
:class:`inference_conformance.conformance.laws.Law`, whose tests call it with each good implementation and, through
:func:`expect_rejected`, with each known-bad one, or a plain (Hypothesis-decorated) function.
"""
from __future__ import annotations

from hypothesis.errors import HypothesisException

from inference_conformance.conformance import results
from inference_conformance.conformance.failures import ImplementationCrash


class NotRejected(AssertionError):
    """A known-bad implementation passed a law, or crashed it instead of being rejected by the
    law's own check: the law has not shown its power on it."""


def _check_failures(exc: BaseException) -> list[BaseException]:
    """The AssertionErrors in ``exc`` (itself, or inside an exception group such as Hypothesis's
    report of several distinct failures), but an :class:`ImplementationCrash` (a crash the law
    reports as its failure is still a crash)."""
    if isinstance(exc, ImplementationCrash):
        return []
    if isinstance(exc, AssertionError):
        return [exc]
    inner = getattr(exc, "exceptions", None)
    return [e for sub in inner for e in _check_failures(sub)] if inner else []


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def expect_rejected(law, bad_impl, *args, **kwargs) -> str:
    """Run ``law(bad_impl, *args, **kwargs)``; return the rejection its check raised.

    A kill counts only when the law's own check rejects (an AssertionError: the tolerance
    policy's verdict, a statistical test, an exactness or shape assertion). Raises
    :class:`NotRejected` when the law passes, when the known-bad implementation crashes it
    with any other exception (an IndexError in an emulation is not the law seeing the bug, nor
    is the :class:`inference_conformance.conformance.failures.ImplementationCrash` a law reports
    it as), and
    when the failure does not reproduce (Hypothesis's Flaky); re-raises Hypothesis's own usage
    errors (a broken law is not a rejection).
    """
    name = getattr(law, "name", None) or getattr(law, "__name__", law)
    who = f"the known-bad implementation {bad_impl.name!r} ({bad_impl.target})"
    zoo = results.recorder().zoo
    if bad_impl.name not in zoo:
        zoo.append(bad_impl.name)          # the test's rows are this entry's (the kill rate counts it)
    try:
        law(bad_impl, *args, **kwargs)
    except HypothesisException as exc:
        if type(exc).__name__ in ("Flaky", "FlakyFailure"):
            raise NotRejected(f"law {name!r} rejected {who} only flakily (the failure did not reproduce): "
                              f"{_first_line(exc)}") from exc
        raise
    except Exception as exc:  # noqa: BLE001 - sorted below: the law's check, or a crash
        checks = _check_failures(exc)
        if not checks:
            raise NotRejected(f"{who} crashed law {name!r} instead of being rejected by its check: "
                              f"{_first_line(exc)}") from exc
        text = _first_line(checks[0])
        results.recorder().text = text
        return text
    raise NotRejected(f"law {name!r} accepted {who}")
