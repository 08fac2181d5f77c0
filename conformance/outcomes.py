"""Every outcome a result row, a report cell, a claim and a run can have, in one place.

:class:`Outcome` is what one test ended with (a result row's ``verdict``, written as its word so
that rows on disk read as before): its severity, its word in the terminal's table, in the
matrix and in the report's claims (:class:`ClaimVerdict`), what it does to the run's exit
status (:class:`Exit`), whether it judged the law at all, and what an expectation file lists
for it. Every reader and writer (the plugin's rows and terminal summary, the report, the
claims, the matrix, the kill rate, the expectation files) takes these from here; adding an
outcome is one line in :class:`Outcome`.

The one severity order, least severe first, is the order :class:`Outcome` lists its members:

    skip < unsupported < pass < partial < unexpected pass < not enough evidence
         < expected fail < stale expectation < error < fail < crashed

Why this order: a row ranks by what it says about the law. Whatever says the law fails
outranks whatever says it holds, and whatever says it holds outranks whatever judged nothing,
so a cell or claim never reads better than its worst row. Within the failures, a crash (the
process running the test died: an implementation that corrupts memory, no outcome at all) is
the worst and is never replaced by a later run; a "fail" (the law's check found the
implementation wrong) outranks an "error" (the test could not run its check: its setup
failed); a "stale expectation" (a listed failure now refused or skipped: the run fails until
the list is fixed) outranks an "expected fail" (a known failure, listed). "not enough
evidence" (too few examples accepted) never reads as holding, so it outranks every outcome
that holds; "unexpected pass" (a listed failure now passes: the run fails until the list is
fixed) outranks "partial", which outranks "pass". "unsupported" (every example refused) and
"skip" judged nothing: they rank under a pass. A pass over some parameters and a refusal over
the others is read "partial" where outcomes are combined (:meth:`Outcome.combine`).

"Unsupported" is carried by its own exception type (:class:`Unsupported`, a kind of pytest
skip), so the plugin and the report recognise it by type, not by the words of a message.

A partial law's evidence is a structured field of its row (:func:`evidence`): examples
accepted and drawn, the boundary classes only refused examples reached, the digests of the
inputs it judged, and why it is not enough where a part of the law says so; rows written by
older versions, whose evidence was only their message's text, are read by
:func:`evidence_from_text` (reading only, never writing).
"""
from __future__ import annotations

import enum
import re
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, NoReturn

import pytest


class Unsupported(pytest.skip.Exception):
    """The implementation under test refused every input of this test (NotImplementedError).
    Reported as "unsupported" (a skip that names the refusal), never as a pass."""


def unsupported(reason: str) -> NoReturn:
    """End the running test as "unsupported" with ``reason`` (say who refused what)."""
    raise Unsupported(f"unsupported: {reason}", _use_item_location=True)


@contextmanager
def refusal_is_unsupported(who: str) -> Iterator[None]:
    """Inside the block, a ``NotImplementedError`` (``who`` refused the input) ends the running
    test as "unsupported" (:func:`unsupported`) instead of failing it."""
    try:
        yield
    except NotImplementedError as exc:
        unsupported(f"{who} refused: {exc}")


class Exit(enum.Enum):
    """What an outcome does to the exit status of the pytest run that produced it."""

    NONE = "leaves the exit status 0"
    FAILS = "exits 1"
    STRICT = "exits 1 unless --allow-unexpected-pass"


class ClaimVerdict(enum.StrEnum):
    """A claim's verdict in the report: from its worst judged row (:attr:`Outcome.claim`), or
    from its figures ("inconclusive"), or from no judged row ("not measured", "not checked").
    ``holding`` / ``failing``: what the report's summary counts it as (``--strict`` exits 1 on a
    failing one)."""

    def __new__(cls, word: str, holding: bool, failing: bool):
        obj = str.__new__(cls, word)
        obj._value_ = word
        obj.holding, obj.failing = holding, failing
        return obj

    HOLDS = ("holds", True, False)
    HOLDS_PARTIAL = ("holds (partial)", True, False)
    HOLDS_UNEXPECTED = ("holds (unexpected pass)", True, False)
    FAILS = ("fails", False, True)
    FAILS_EXPECTED = ("fails (expected)", False, True)
    NOT_ENOUGH_EVIDENCE = ("not enough evidence", False, True)
    INCONCLUSIVE = ("inconclusive", False, False)
    NOT_MEASURED = ("not measured", False, False)
    NOT_CHECKED = ("not checked", False, False)


#: a matrix cell no row of which ran (its rows skipped, or none)
NOT_RUN = "not run"


class Outcome(enum.StrEnum):
    """What one test ended with. Members are listed least severe first: that order is the
    severity (:attr:`severity`; see the module doc for why). Each member's fields: its word (in
    rows and reports), ``terminal`` (its short word in the terminal's table), ``matrix`` (the
    matrix's cell status), ``claim`` (the :class:`ClaimVerdict` it gives a claim; None: it
    judges no claim), ``exit`` (:class:`Exit`), ``judges`` (whether it judged the law: a run
    whose every cell of an implementation judged nothing exits 1) and ``listed`` (what an
    expectation file lists for it; None: never listed)."""

    def __new__(cls, word: str, terminal: str, matrix: str, claim: ClaimVerdict | None, exit: Exit,
                judges: bool, listed: str | None):
        obj = str.__new__(cls, word)
        obj._value_ = word
        obj.terminal, obj.matrix, obj.claim, obj.exit, obj.judges, obj.listed = (
            terminal, matrix, claim, exit, judges, listed)
        return obj

    # word, terminal, matrix, claim, exit, judges, listed: least severe first
    SKIP = ("skip", "skip", NOT_RUN, None, Exit.NONE, False, None)
    UNSUPPORTED = ("unsupported", "unsup", "unsupported", None, Exit.NONE, False, "unsupported")
    PASS = ("pass", "pass", "pass", ClaimVerdict.HOLDS, Exit.NONE, True, None)
    PARTIAL = ("partial", "partial", "partial", ClaimVerdict.HOLDS_PARTIAL, Exit.NONE, True, "partial")
    UNEXPECTED_PASS = ("unexpected pass", "xpass", "unexpected pass", ClaimVerdict.HOLDS_UNEXPECTED, Exit.STRICT,
                       True, None)
    THIN = ("not enough evidence", "thin", "not enough evidence", ClaimVerdict.NOT_ENOUGH_EVIDENCE, Exit.NONE,
            False, "partial")
    EXPECTED_FAIL = ("expected fail", "xfail", "expected fail", ClaimVerdict.FAILS_EXPECTED, Exit.NONE, True, "fail")
    STALE = ("stale expectation", "stale", "stale expectation", None, Exit.STRICT, False, "unsupported")
    ERROR = ("error", "error", "fail", ClaimVerdict.FAILS, Exit.FAILS, True, "fail")
    FAIL = ("fail", "fail", "fail", ClaimVerdict.FAILS, Exit.FAILS, True, "fail")
    CRASHED = ("crashed", "crashed", "crashed", ClaimVerdict.FAILS, Exit.FAILS, True, None)

    @property
    def severity(self) -> int:
        """The outcome's place in the one order, 0 least severe."""
        return _SEVERITY[self]

    @property
    def fails_law(self) -> bool:
        """Whether the outcome says the law fails (a new failure, a crash or a listed one)."""
        return self.claim is not None and self.claim.failing and self.judges

    @property
    def new_failure(self) -> bool:
        """Whether the outcome is a failure nothing lists (fail, error, crashed)."""
        return self.claim is ClaimVerdict.FAILS

    @property
    def needs_look(self) -> bool:
        """Whether a cell with this outcome names its tests and messages: a failure, listed or
        not, or an outcome that fails the run (the expectation list is out of date)."""
        return self.fails_law or self.exit is not Exit.NONE

    def fails_run(self, allow_unexpected_pass: bool = False) -> bool:
        """Whether a row with this outcome makes its pytest run exit 1."""
        return self.exit is Exit.FAILS or (self.exit is Exit.STRICT and not allow_unexpected_pass)

    @classmethod
    def of(cls, word: Any) -> Outcome:
        """The outcome a row's verdict ``word`` names; ValueError naming it for any other word."""
        if isinstance(word, cls):
            return word
        try:
            return cls(word)
        except ValueError:
            raise ValueError(f"word {word!r} is not an outcome; the outcomes: "
                             f"{', '.join(o.value for o in cls)}") from None

    @classmethod
    def worst(cls, outcomes: Iterable[Any]) -> Outcome | None:
        """The most severe of ``outcomes`` (words or members); None for none."""
        found = [cls.of(o) for o in outcomes]
        return max(found, key=_SEVERITY.__getitem__) if found else None

    @classmethod
    def combine(cls, outcomes: Iterable[Any]) -> Outcome | None:
        """The outcome of a cell over a law's parameters: the worst of ``outcomes``, except that
        a pass over some of them and a refusal over others is "partial" (it passed on part of
        its input); None for none."""
        found = {cls.of(o) for o in outcomes}
        worst = cls.worst(found)
        return cls.PARTIAL if worst is cls.PASS and cls.UNSUPPORTED in found else worst


_SEVERITY = {o: i for i, o in enumerate(Outcome)}
#: the matrix's cell statuses, worst first (its legend's order)
MATRIX_STATUSES = tuple(dict.fromkeys([o.matrix for o in reversed(Outcome)] + [NOT_RUN]))
#: what an expectation entry may list (its ``expected``)
LISTED = tuple(dict.fromkeys(o.listed for o in reversed(Outcome) if o.listed))


def matrix_status(outcomes: Iterable[Any]) -> str:
    """A matrix cell's status from the outcomes of its rows (:meth:`Outcome.combine`)."""
    o = Outcome.combine(outcomes)
    return o.matrix if o is not None else NOT_RUN


def run_fails(outcomes: Iterable[Any], allow_unexpected_pass: bool = False) -> bool:
    """Whether a run whose rows ended with ``outcomes`` exits 1 by its rows alone."""
    return any(Outcome.of(o).fails_run(allow_unexpected_pass) for o in outcomes)


# ---- the evidence of a partial result ----
#: below this fraction of its examples accepted, a partial law is "not enough evidence"
MIN_ACCEPTED = 0.25
#: ``failure["exception"]`` of the row of a test whose process died (a crashed pytest-xdist worker)
CRASH = "WorkerCrash"


def evidence(accepted: int, examples: int, refused_classes: Iterable[str] = (), judged: Iterable[str] | None = None,
             thin: str = "") -> dict:
    """A partial row's ``evidence``: ``{"accepted": k, "examples": n, "refused_classes": [...]}``
    (k of n examples accepted; the boundary classes only refused examples reached, by name),
    with ``"judged"`` (the digests of the inputs judged and passed) where given and ``"thin"``
    (why a part of the law has not enough evidence) where said; {} for a run that refused
    nothing and said nothing thin. Raises ValueError for counts out of order."""
    if not (isinstance(accepted, int) and isinstance(examples, int) and 0 <= accepted <= examples):
        raise ValueError(f"accepted, examples must be integers with 0 <= accepted <= examples, got {accepted}, {examples}")
    out: dict = {}
    if accepted < examples:
        out = {"accepted": accepted, "examples": examples, "refused_classes": list(refused_classes)}
        if judged is not None:
            out["judged"] = list(judged)
    return out | ({"thin": thin} if thin else {})


def evidence_from_text(text: str) -> dict:
    """The evidence a row written by an older version says in its message only ("partial:
    refused R of N examples (reason); classes only refused: a, b", "not enough evidence: why");
    {} for any other text. For reading old rows only: rows are written with :func:`evidence`."""
    thin = re.search(rf"{Outcome.THIN.value}: ([^;]*)", text)
    m = re.search(r"refused (\d+) of (\d+) examples", text)
    if m is None:
        return {"thin": thin[1]} if thin else {}
    _, sep, classes = text.rpartition("; classes only refused: ")
    refused = [c.strip() for c in classes.split(",") if c.strip()] if sep else []
    return {"accepted": int(m[2]) - int(m[1]), "examples": int(m[2]), "refused_classes": refused} | (
        {"thin": thin[1]} if thin else {})


def thin_reason(reason: str) -> str:
    """Why a part of a law has not enough evidence, where its unchecked ``reason`` begins
    "not enough evidence: " (how a law says so: :meth:`inference_conformance.conformance.law_run.Run.uncheck`); else ""."""
    head = f"{Outcome.THIN.value}: "
    return reason[len(head):] if str(reason).startswith(head) else ""


def insufficient(ev: dict | None) -> str:
    """Why a partial law's evidence ``ev`` (:func:`evidence`) is not enough to say it holds:
    what a part of the law said ("thin"), or fewer than :data:`MIN_ACCEPTED` of its examples
    accepted; "" when it is enough."""
    ev = ev or {}
    if ev.get("thin"):
        return ev["thin"]
    k, n = ev.get("accepted", 0), ev.get("examples", 0)
    if n and k < MIN_ACCEPTED * n:
        return f"{k} of {n} examples accepted, fewer than {MIN_ACCEPTED:g} of them"
    return ""


def effective(verdict: Any, ev: dict | None) -> Outcome:
    """The outcome every reader judges a row's ``verdict`` with ``evidence`` ``ev`` by:
    "not enough evidence" for a partial row whose evidence is :func:`insufficient`."""
    o = Outcome.of(verdict)
    return Outcome.THIN if o is Outcome.PARTIAL and insufficient(ev) else o


def is_crash(verdict: Any, failure: dict | None, message: str = "") -> bool:
    """Whether a row says its test's process died ("crashed"; written as an "error" row with
    the :data:`CRASH` failure, or by older versions with its message alone)."""
    o = Outcome.of(verdict)
    return o is Outcome.CRASHED or (o is Outcome.ERROR and (
        (failure or {}).get("exception") == CRASH or str(message).startswith("worker crashed")))


def read(row: Any) -> Outcome:
    """The outcome of a result ``row`` as every reader judges it: a crash's "error" row
    "crashed", a partial row with too little evidence "not enough evidence", else its verdict."""
    if is_crash(row.verdict, row.failure, row.message):
        return Outcome.CRASHED
    return effective(row.verdict, row.evidence)
