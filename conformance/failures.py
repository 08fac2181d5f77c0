"""Compact law failures: what a failing law says, in a few lines.

A law that fails on an implementation raises :class:`LawFailure` (an AssertionError), whose
message is::

    case: B=1 Hq=2 Hkv=1 Tq=3 Tk=5 D=16 causal=True scale=0.25 seed=7 dtype=float16
    diagnosis: same output as known bug top_left_causal: Causal mask aligned top-left (j <= i) ...
    attention output: measured error 3.1e-01 EXCEEDS bound 9.8e-04 (rule float16); worst element (0, 1, 2, 3): ...
    implementation: my_attention:attention

the drawn case by its fields (never the objects that drew it), the diagnosis
(:mod:`inference_conformance.conformance.diagnosis`; second, so that a report showing a
message's first 300 characters shows it), the failing comparison (the measured error, the
bound, the tolerance rule's name and the worst element) and the implementation. Hypothesis' own report
(the falsifying example with every argument's repr) is left out: the case line says it.

The tolerance policy notes each comparison it makes (:func:`note_comparison`) while a law's
example runs under :func:`capturing`: the verdict, the output judged, and how to judge another
output against it by the same rule and bound (what the diagnosis replays the zoo with). This
module imports nothing of the suite.

An exception the contract does not document, raised by the implementation in a call the law
made (an IndexError in its ``receive``), is the law's failure too (:func:`crash_fails`,
:class:`ImplementationCrash`): the comparison's line then names the call and the exception.

These failures print as their message alone (:class:`PlainFailure`): no traceback of the
suite's frames (``--full-trace`` shows them).
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import pytest


class PlainFailure(AssertionError, pytest.fail.Exception):
    """An AssertionError that pytest prints as its message alone, without the traceback (as
    ``pytest.fail(..., pytrace=False)``; ``--full-trace`` shows it): a failure whose message
    says everything. Code that catches AssertionError catches it. With notes (Hypothesis'
    falsifying example), it prints as any AssertionError, notes included."""

    def __init__(self, message: str) -> None:
        AssertionError.__init__(self, message)
        pytest.fail.Exception.__init__(self, message, pytrace=False)

    @property
    def pytrace(self) -> bool:
        """Whether pytest prints the traceback: only once notes were added to the failure
        (Hypothesis' falsifying example of a test that is not a law), which pytest prints with
        the traceback alone."""
        return bool(getattr(self, "__notes__", None))

    @pytrace.setter
    def pytrace(self, value: bool) -> None:
        pass                                     # pytest's constructor sets it; the notes decide


class ToleranceFailure(PlainFailure):
    """A comparison of the tolerance policy failed: the message is the verdict's (what was
    judged, the measured error, the bound, the rule, the worst element); ``verdict`` is the
    :class:`inference_conformance.conformance.tolerance.Comparison` itself."""

    def __init__(self, message: str, verdict: Any = None) -> None:
        super().__init__(message)
        self.verdict = verdict


class LawFailure(PlainFailure):
    """A law rejected an implementation: the message is the case, the diagnosis, the failing
    comparison and the implementation, one line each (see the module's docstring). ``case``,
    ``comparison``, ``implementation``, ``diagnosis``: those lines' text; ``bugs``: the names of
    the known bugs the diagnosis found."""

    def __init__(self, case: str, comparison: str, implementation: str, diagnosis: str = "",
                 bugs: tuple = ()) -> None:
        self.case, self.comparison, self.implementation, self.diagnosis = case, comparison, implementation, diagnosis
        self.bugs = tuple(bugs)
        # the diagnosis second: a report that shows the first 300 characters of a message shows it
        lines = [f"case: {case}"] + ([f"diagnosis: {diagnosis}"] if diagnosis else [])
        super().__init__("\n".join(lines + [comparison, f"implementation: {implementation}"]))


class ImplementationCrash(PlainFailure):
    """An implementation raised, in a call a law made, an exception its contract does not
    document (an IndexError, a KeyError, ...): the law fails (its message: who, which call, the
    exception; :func:`crash_fails`), in the compact format. ``error``: the exception. Never a
    kill of the zoo (:func:`inference_conformance.conformance.zoo.expect_rejected`): a crash is
    not the law's check seeing the bug."""

    def __init__(self, message: str, error: BaseException) -> None:
        super().__init__(message)
        self.error = error


@contextlib.contextmanager
def crash_fails(call: str, documented: tuple = ()) -> Iterator[None]:
    """Inside the block (an implementation's call, ``call`` naming who was called how), any
    exception but a refusal (NotImplementedError), a failed check (AssertionError) and the
    contract's ``documented`` types raises :class:`ImplementationCrash`: "``call`` crashed:
    IndexError: ..."; those pass through as they are."""
    try:
        yield
    except (NotImplementedError, AssertionError, *documented):
        raise
    except Exception as exc:  # noqa: BLE001 - an undocumented exception of the implementation: the law's failure
        raise ImplementationCrash(f"{call} crashed: {type(exc).__name__}: {exc}", exc) from exc


# pytest and the traceback module print a builtin exception's name without its module: a
# failure's first line reads "LawFailure: case: ..." in the terminal and in result rows
for _cls in (PlainFailure, ToleranceFailure, LawFailure, ImplementationCrash):
    _cls.__module__ = "builtins"


@dataclass(frozen=True)
class CapturedComparison:
    """One comparison of the tolerance policy inside a law's example: its ``verdict``, the
    output ``out`` it judged and ``same(out, other) -> bool``, whether ``other`` (a tensor or
    number of ``out``'s shape) is within the comparison's own rule and bound of ``out``."""

    verdict: Any
    out: Any
    same: Callable[[Any, Any], bool]


_COMPARISONS: contextvars.ContextVar[list | None] = contextvars.ContextVar("law_comparisons", default=None)


@contextlib.contextmanager
def capturing() -> Iterator[list]:
    """Within the block, every comparison of the tolerance policy is appended to the list
    yielded (a fresh one; nested blocks restore the outer list)."""
    found: list[CapturedComparison] = []
    token = _COMPARISONS.set(found)
    try:
        yield found
    finally:
        _COMPARISONS.reset(token)


def note_comparison(verdict: Any, out: Any, same: Callable[[Any, Any], bool]) -> None:
    """Called by the tolerance policy for each comparison: kept only inside :func:`capturing`."""
    found = _COMPARISONS.get()
    if found is not None:
        found.append(CapturedComparison(verdict, out, same))


def _value(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}" if math.isfinite(x) else str(x)
    if hasattr(x, "shape") and hasattr(x, "dtype"):           # a tensor or an array: its shape
        return f"{type(x).__name__}{tuple(x.shape)}:{str(x.dtype).replace('torch.', '')}"
    if type(x).__module__ == "torch" and type(x).__name__ == "dtype":
        return str(x).replace("torch.", "")
    text = repr(x) if not isinstance(x, str) else x
    return text if len(text) <= 60 else text[:57] + "..."


def _fields(name: str, x: Any) -> list[str]:
    """``name=value``, or for a dataclass its fields that differ from their defaults."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        out = []
        for f in dataclasses.fields(x):
            v = getattr(x, f.name)
            if f.repr and (f.default is dataclasses.MISSING or v != f.default):
                out.append(f"{f.name}={_value(v)}")
        return out
    return [f"{name}={_value(x)}"]


def case_line(drawn: Mapping[str, Any], params: Mapping[str, Any] = {}) -> str:
    """The failing case by its fields: each drawn argument (a dataclass by its fields that are
    not at their defaults, a tensor by its shape and dtype, a long repr cut at 60 characters),
    then the law's parameters ``params`` (dtype, ...)."""
    parts = [p for name, x in drawn.items() for p in _fields(name, x)]
    parts += [f"{name}={_value(x)}" for name, x in params.items()]
    return " ".join(parts) if parts else "(no drawn arguments)"


def comparison_line(verdict: Any) -> str:
    """The failing comparison: what was judged, the measured error against the bound, the
    tolerance rule's name (its formula is in the documentation and the report) and the worst
    element."""
    rule = str(verdict.rule).split(":", 1)[0]
    text = f"{verdict.what}: measured error {verdict.error:.3e} EXCEEDS bound {verdict.bound:.3e} (rule {rule})"
    return text + (f"; {verdict.detail}" if verdict.detail else "")


def first_line(exc: BaseException) -> str:
    """An exception's own message, first line (its type where it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


_COMPARISON = re.compile(r"^(?P<what>.+?): measured error (?P<error>\S+) EXCEEDS bound (?P<bound>\S+) "
                         r"\(rule (?P<rule>[^)]*)\)")


_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w.])")


#: a measured error a failed assert's message states ("... error 0.598 > the format's bound ...")
_ERROR = re.compile(r"\berror (inf|nan|[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(?![\w.])")


def _leading_text(line: str) -> str:
    """A failure's line as the kind of check it reports: up to its first ": " or "; " (what
    follows names the example), each number written N ("3 certain case(s) wrong: ..." ->
    "N certain case(s) wrong"; "max abs error 0.5 > 0.05" -> "max abs error N > N")."""
    head = re.split(r": |; ", line, maxsplit=1)[0]
    return " ".join(_NUMBER.sub("N", head).split())


def _check_name(what: str) -> str:
    """A comparison's ``what`` without the drawn case it names ("the NaN elements of the output
    (NanCase(causal=True, ...))" -> "the NaN elements of the output"): the check, not its example."""
    head, sep, rest = what.partition(" (")
    return head if sep and "=" in rest else what


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def crash_of(exc: BaseException) -> BaseException | None:
    """The implementation's own exception behind a failure, or None for a failed check: ``exc``
    when it is no AssertionError, the error an :class:`ImplementationCrash` (or a failure built
    from one, its ``crash``) carries, the first crash in an exception group. A crash stays a
    crash whatever the law reports it as."""
    if isinstance(exc, BaseExceptionGroup):
        return next((c for c in map(crash_of, exc.exceptions) if c is not None), None)
    if isinstance(exc, ImplementationCrash):
        return exc.error
    if isinstance(getattr(exc, "crash", None), BaseException):
        return exc.crash
    return None if isinstance(exc, AssertionError) else exc


def failure_kind(exc: BaseException, worst: Any = None) -> dict:
    """What kind of failure ``exc`` is, as an expectation's signature names it:
    ``{"exception", "check", "rule", "error"}``.

    ``exception``: "AssertionError" for any failed check (a :class:`LawFailure`, a
    :class:`ToleranceFailure`, a plain ``assert``), else the exception's type name (a crash:
    RuntimeError, ValueError, ...). For a failed comparison of the tolerance policy, ``check`` is
    what it judged (the verdict's ``what``), ``rule`` the tolerance rule's name and ``error`` the
    measured error (a float in the output's units; inf for a NaN), the drawn case it may name
    left out (:func:`_check_name`); for any other failure ``check`` is its first line's kind
    (:func:`_leading_text`), ``error`` the figure it states as "error X" (absent where none) and
    ``rule`` is absent.
    ``worst``: the test's worst verdict of the tolerance policy, used for a plain AssertionError
    that names no comparison of its own. A crash (:func:`crash_of`: in a group, or reported by
    the law as its failure) is judged as itself; else a group of exceptions by its first."""
    crash = crash_of(exc)
    if crash is not None:
        return {"exception": type(crash).__name__, "check": _leading_text(first_line(crash)),
                "mro": [c.__name__ for c in type(crash).__mro__ if c is not object]}
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    verdict = getattr(exc, "verdict", None)
    if verdict is None and not isinstance(exc, LawFailure) and worst is not None and not worst.ok \
            and first_line(exc).startswith(f"{worst.what}: measured error"):
        verdict = worst
    if verdict is not None:
        error = float(verdict.error)
        return {"exception": "AssertionError", "check": _check_name(verdict.what), "rule": str(verdict.rule).split(":", 1)[0],
                "error": math.inf if math.isnan(error) else error}
    line = exc.comparison if isinstance(exc, LawFailure) else first_line(exc)
    m = _COMPARISON.match(line)
    if m is not None and _number(m["error"]) is not None:
        error = _number(m["error"])
        return {"exception": "AssertionError", "check": _check_name(m["what"]), "rule": m["rule"],
                "error": math.inf if math.isnan(error) else error}
    kind = {"exception": "AssertionError", "check": _leading_text(line)}
    figure = _ERROR.search(line)
    if figure is not None and _number(figure[1]) is not None:
        kind["error"] = math.inf if math.isnan(_number(figure[1])) else _number(figure[1])
    return kind


__all__ = ["CapturedComparison", "ImplementationCrash", "LawFailure", "PlainFailure", "ToleranceFailure", "capturing",
           "case_line", "crash_of", "comparison_line", "crash_fails", "failure_kind", "first_line", "note_comparison"]
