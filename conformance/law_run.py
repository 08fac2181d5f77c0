"""What one run of a law on one implementation saw (:class:`Run`: the examples that ran, the
refusals with their reasons, the boundary classes reached, the parts of the law no example could
check, the worst comparison) and :func:`refusal`, the one way a law's call is refused. The runner
(:mod:`inference_conformance.conformance.laws`) makes a Run per test and judges it.
"""
from __future__ import annotations

import hashlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, NoReturn

from hypothesis import note, reject
from hypothesis.control import currently_in_test_context

from inference_conformance.conformance.coverage import classes_reached
from inference_conformance.conformance import outcomes
from inference_conformance.conformance.outcomes import unsupported


@dataclass
class Run:
    """What one run of a law on one implementation saw.

    ``ran``: examples that ran (passed or failed); ``refused``: the reasons of the examples the
    implementation refused; ``reached`` / ``refused_classes``: the boundary classes of the
    law's coverage table that examples which ran / were refused reached; ``observations``: what
    the examples that ran observed (:meth:`observe`); ``worst``: the worst comparison of the
    tolerance policy in the test (a :class:`inference_conformance.conformance.tolerance.Comparison`, or None);
    ``unchecked``: a part of the law -> [examples that ran without checking it, the first reason]
    (:meth:`uncheck`); ``judged``: the :func:`input_digest` of each example that ran and passed."""

    law: str
    implementation: str
    impl: Any = field(repr=False)
    interpreted: bool = False
    coverage: tuple = field(default=(), repr=False)
    ran: int = 0
    refused: list = field(default_factory=list)
    reached: set = field(default_factory=set)
    refused_classes: set = field(default_factory=set)
    observations: list = field(default_factory=list, repr=False)
    worst: Any = None
    unchecked: dict = field(default_factory=dict)
    judged: list = field(default_factory=list, repr=False)
    _example: list = field(default_factory=list, repr=False)
    _example_unchecked: dict = field(default_factory=dict, repr=False)
    #: (exception, drawn arguments, comparisons) of the examples that failed, latest last
    _failures: list = field(default_factory=list, repr=False)

    def __repr__(self) -> str:
        # short: Hypothesis prints it in every falsifying example, before the case that matters
        return f"Run({self.law!r}, {self.implementation!r})"

    def _repr_pretty_(self, printer, cycle) -> None:
        # Hypothesis' printer spells a dataclass out field by field unless it finds this
        printer.text(repr(self))

    def observe(self, observation: Any) -> None:
        """Record what the running example hands the implementation; its boundary classes
        count as reached once the example has run (as refused if it is refused)."""
        self._example.append(observation)

    def refuse(self, reason: str) -> NoReturn:
        """Discard the running example: the implementation refused it (``reason`` is kept)."""
        self.refused.append(reason)
        note(reason)
        reject()

    def uncheck(self, part: str, reason: str, *, thin: bool = False) -> None:
        """The running example could not check ``part`` of the law (``reason``: why): a run in
        which no example that ran checked it is partial (:meth:`never_checked`), never a plain pass.
        ``thin``: it could not for want of evidence (a statistical test under its power floor),
        and a run with such a part reads "not enough evidence"; a ``reason`` that begins "not
        enough evidence: " says so too (:func:`inference_conformance.conformance.outcomes.thin_reason`)."""
        if thin and not outcomes.thin_reason(reason):
            reason = f"{outcomes.Outcome.THIN}: {reason}"
        self._example_unchecked.setdefault(part, reason)

    def never_checked(self) -> dict:
        """The parts of the law no example that ran checked -> the first reason (none ran: {})."""
        return {part: why for part, (n, why) in self.unchecked.items() if self.ran and n == self.ran}

    @property
    def refused_only(self) -> set:
        """Boundary classes reached only by examples the implementation refused."""
        return self.refused_classes - self.reached

    def partial_text(self) -> str:
        """"partial: ..." for a run with a part of the law no example checked (the part, the
        reason) or that refused some of its examples (how many, the first reason, then the
        boundary classes only refused examples reached); "" for neither."""
        parts = [f"{part} not checked in any of the {self.ran} examples ({why})"
                 for part, why in self.never_checked().items()]
        if self.refused:
            classes = f"; classes only refused: {', '.join(sorted(self.refused_only))}" if self.refused_only else ""
            parts.append(f"refused {len(self.refused)} of {len(self.refused) + self.ran} examples "
                         f"({self.refused[0]}){classes}")
        return "partial: " + "; ".join(parts) if parts else ""

    def evidence(self) -> dict:
        """The run's evidence as a row keeps it (:func:`inference_conformance.conformance.outcomes.evidence`):
        k of n examples accepted, the boundary classes only refused examples reached, the inputs
        judged, and why a part of the law has not enough evidence; {} for a full run."""
        thin = "; ".join(filter(None, map(outcomes.thin_reason, self.never_checked().values())))
        return outcomes.evidence(self.ran, self.ran + len(self.refused), sorted(self.refused_only),
                                 list(self.judged), thin)

    def _begin_example(self) -> None:
        self._example, self._example_unchecked = [], {}

    def _end_example(self, refused: bool) -> None:
        classes = set().union(*(classes_reached(self.coverage, self.law, o) for o in self._example))
        if refused:
            self.refused_classes |= classes
        else:
            self.ran += 1
            self.reached |= classes
            self.observations.extend(self._example)
            for part, why in self._example_unchecked.items():
                self.unchecked.setdefault(part, [0, why])[0] += 1
        self._example, self._example_unchecked = [], {}


def input_digest(drawn: dict) -> str:
    """A short digest of one example's drawn arguments (by their reprs, in name order): the same
    input in another run of the law has the same digest (what the matrix matches a failure's
    input with); an argument whose repr varies between processes never matches."""
    text = repr(sorted((name, repr(value)) for name, value in drawn.items()))
    return hashlib.sha1(text.encode("utf-8", "backslashreplace")).hexdigest()[:12]


@contextmanager
def refusal(run: Run | None, what: str) -> Iterator[None]:
    """Inside the block, a ``NotImplementedError`` is the implementation refusing the input
    (``what`` says who refused what): inside a law's example (``run`` given) the example is
    discarded and the reason kept (:meth:`Run.refuse`); elsewhere the test ends as
    "unsupported" (:func:`inference_conformance.conformance.outcomes.unsupported`). Never a pass."""
    try:
        yield
    except NotImplementedError as exc:
        reason = f"{what}: {exc}"
        if run is not None and currently_in_test_context():
            run.refuse(reason)
        unsupported(reason)


__all__ = ["Run", "input_digest", "refusal"]
