"""Boundary classes: the inputs a technique's kernels get wrong, declared by its contract.

A contract's ``COVERAGE`` is a tuple of :class:`CoverageClass`; the law runner
(:mod:`inference_conformance.conformance.laws`) hands each class the observations a law's examples make (what the
implementation was handed: a case, a call's sizes) and records, per implementation, which
classes were reached. This module imports nothing (the contracts and the kernels import it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable


@dataclass(frozen=True)
class CoverageClass:
    """One boundary class: ``laws`` (the names of the laws, or of the pinned-shape tests, that
    must reach it) must hand an implementation at least one observation for which ``test`` is
    true. What an observation is (a dict of a call's sizes, a case object) is the contract's
    choice, stated beside its table."""

    name: str
    laws: tuple
    test: Callable[[Any], bool]

    def __repr__(self) -> str:
        # short: a run's coverage table holds dozens, each with a lambda
        return f"CoverageClass({self.name!r})"

    def _repr_pretty_(self, printer, cycle) -> None:
        # Hypothesis' printer spells a dataclass out field by field unless it finds this
        printer.text(repr(self))


def classes_reached(table: Iterable[CoverageClass], law: str, observation: Any) -> set[str]:
    """Names of the classes of ``table`` that ``law`` must reach and ``observation`` reaches."""
    return {c.name for c in table if law in c.laws and c.test(observation)}


def class_names(table: Iterable[CoverageClass], law: str | None = None) -> frozenset[str]:
    """Names of the classes of ``table`` (only those ``law`` must reach, when given)."""
    return frozenset(c.name for c in table if law is None or law in c.laws)


def missing_classes(table: Iterable[CoverageClass], reached: Iterable[str], law: str | None = None) -> list[str]:
    """Sorted names of the classes of ``table`` (those ``law`` must reach, when given) not in
    ``reached``."""
    return sorted(class_names(table, law) - set(reached))
