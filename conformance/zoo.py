"""The bug zoo's runner: a law must reject every known-bad implementation it names.

A law is a callable whose first argument is the implementation (``law(impl, ...)``): a
:class:`conformance.laws.Law`, whose tests call it with each good implementation and, through
:func:`expect_rejected`, with each known-bad one, or a plain (Hypothesis-decorated) function.
"""
from __future__ import annotations

from hypothesis.errors import HypothesisException

from conformance import results


class NotRejected(AssertionError):
    """A known-bad implementation passed a law: the law has lost its power."""


def expect_rejected(law, bad_impl, *args, **kwargs) -> str:
    """Run ``law(bad_impl, *args, **kwargs)``; return the failure it raised.

    Raises :class:`NotRejected` when the law passes, and re-raises Hypothesis's own usage
    errors (a broken law is not a rejection).
    """
    try:
        law(bad_impl, *args, **kwargs)
    except HypothesisException as exc:
        if type(exc).__name__ in ("Flaky", "FlakyFailure"):
            return f"rejected (flaky): {exc}"
        raise
    except Exception as exc:  # noqa: BLE001 - any falsifying failure is a rejection
        text = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        results.recorder().text = text
        return text
    name = getattr(law, "name", None) or getattr(law, "__name__", law)
    raise NotRejected(f"law {name!r} accepted the known-bad "
                      f"implementation {bad_impl.name!r} ({bad_impl.target})")
