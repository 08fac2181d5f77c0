"""The result row: what every check emits, keyed by claim id, and how rows reach disk.

A test's row is built by the pytest plugin from (a) the test's ``claim`` marker, its
implementation and dtype parameters, its outcome, and (b) the worst :class:`Comparison` the tolerance
policy saw during the test, or a figure the test recorded with :func:`record`. Rows are written as
JSON lines (one file per pytest process, so pytest-xdist workers never share a file) and merged by
:func:`read_rows`. The report, the history and the gate read only these rows.
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from inference_conformance.conformance import fields, outcomes
from inference_conformance.conformance.outcomes import CRASH  # noqa: F401  (where readers found it)


@dataclass
class Row:
    """One check's outcome.

    ``measured`` / ``bound`` are numbers in ``unit`` (an error, a ratio, bytes, ...);
    ``lecture`` is the figure the lecture gives (text or number); ``verdict`` is the word of an
    :class:`inference_conformance.conformance.outcomes.Outcome` (its meanings, severity and
    words are there): "pass", "partial" (passed on what the implementation accepted; with
    ``evidence`` showing too little accepted, every reader judges it "not enough evidence"),
    "fail", "skip", "unsupported", "error", "crashed", and under an expectation "expected fail",
    "unexpected pass", "stale expectation"; :func:`inference_conformance.conformance.outcomes.read`
    is the outcome every reader judges a row by. ``failure``: a failed test's kind (exception, check, rule, error:
    :func:`inference_conformance.conformance.failures.failure_kind`), what an expectation's
    signature is written from; ``profile`` / ``max_examples``: the Hypothesis profile the test ran
    under and its example count (what the matrix compares runs by); ``evidence``: for a law
    that refused some of its examples ("partial"), ``{"accepted": k,
    "examples": n, "refused_classes": [...], "judged": [...]}`` (the boundary classes reached only
    by refused examples; the digests of the k inputs it judged and passed). A law's failure
    also names the digests of the inputs it failed on (``failure["inputs"]``): a newer run
    replaces that failure in the matrix only where it judged those inputs, or refused none.
    """

    claim: str
    check: str
    technique: str = ""
    implementation: str = ""
    dtype: str = ""
    device: str = ""
    measured: Any = None
    bound: Any = None
    lecture: Any = None
    unit: str = ""
    rule: str = ""
    verdict: str = ""
    message: str = ""
    examples: int = 0
    extra: dict = field(default_factory=dict)
    failure: dict = field(default_factory=dict)
    profile: str = ""
    max_examples: int = 0
    evidence: dict = field(default_factory=dict)


def crashed(row: Row) -> bool:
    """Whether ``row`` says its test's process died while running it ("crashed"; written as an
    "error" row with the :data:`CRASH` failure, or by older versions with its message alone)."""
    return outcomes.is_crash(row.verdict, row.failure, row.message)


class Recorder:
    """What one test has measured: ``worst`` (the worst :class:`Comparison` of the tolerance policy,
    by error / bound), ``count`` (comparisons made), ``figures`` (what :func:`record` recorded),
    ``text`` (a zoo test's rejection), ``zoo`` (the known-bad implementations it ran), ``partial`` (a law's "partial: refused ..." when the
    implementation refused some of its examples), ``evidence`` (that law's evidence, structured:
    :func:`inference_conformance.conformance.outcomes.evidence`), ``refused_classes`` (that law's boundary classes
    only refused examples reached, by name; None where no law said), ``judged`` / ``failed_inputs``
    (digests of the inputs a law judged and passed / failed on:
    :func:`inference_conformance.conformance.law_run.input_digest`). The plugin makes one per test item and keeps it on the
    item (its rows are built from it); :func:`recording` makes it the one :func:`record` and the
    tolerance policy write to while the test runs."""

    def __init__(self) -> None:
        self.reset()
        #: the known-bad implementations :func:`inference_conformance.conformance.zoo.expect_rejected`
        #: ran in this test (a zoo test outside the registry's ``bad_impl`` parameter): its rows are
        #: theirs ("zoo:<name>"), so the kill rate counts them
        self.zoo: list[str] = []

    def reset(self) -> None:
        """Forget what was recorded (a test whose failing comparisons are the point calls it
        before its real check)."""
        self.worst = None
        self.count = 0
        self.figures: list[dict] = []
        self.text = ""
        self.partial = ""
        self.evidence: dict = {}
        self.refused_classes: list[str] | None = None
        self.judged: list[str] = []
        self.failed_inputs: list[str] = []

    def note(self, verdict) -> None:
        self.count += 1
        if self.worst is None or _rank(verdict) > _rank(self.worst):
            self.worst = verdict


def _rank(v) -> float:
    r = v.ratio
    return r if not math.isnan(r) else math.inf


_ACTIVE: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar("conformance_recorder", default=None)


@contextlib.contextmanager
def recording(recorder: Recorder):
    """Within the block, :func:`record` and the tolerance policy write to ``recorder``
    (nested blocks restore the outer one). Raises TypeError for a non-Recorder."""
    if not isinstance(recorder, Recorder):
        raise TypeError(f"recorder must be a inference_conformance.conformance.results.Recorder, got {type(recorder).__name__}")
    token = _ACTIVE.set(recorder)
    try:
        yield recorder
    finally:
        _ACTIVE.reset(token)


def recorder() -> Recorder:
    """The recorder of the running test; outside any test (a script judging a kernel), a fresh
    one that nothing reads, so a comparison made there is never attributed to a test."""
    active = _ACTIVE.get()
    return active if active is not None else Recorder()


def note_verdict(verdict) -> None:
    """Called by :mod:`inference_conformance.conformance.tolerance` for every comparison."""
    recorder().note(verdict)


def record(claim: str, *, measured: Any, lecture: Any = None, bound: Any = None, unit: str = "",
           rule: str = "", **extra: Any) -> None:
    """Record a measured figure for ``claim`` in the running test's result row(s).

    Use it for figures and analytic answers (``measured`` vs ``lecture``); float comparisons
    are recorded automatically by the tolerance policy. ``extra`` keys the report reads are
    declared in :mod:`inference_conformance.conformance.fields`; a near-miss of one, or a declared one of the wrong
    type, raises ValueError.
    """
    fields.check(extra, where=f"record({claim!r})")
    recorder().figures.append(dict(claim=claim, measured=measured, lecture=lecture, bound=bound,
                                unit=unit, rule=rule, extra=extra))


def bench_info(benchmark, **info: Any) -> None:
    """Add ``info`` to a pytest-benchmark fixture's ``extra_info`` (what the report's benchmark
    tables and plots read), checked against :mod:`inference_conformance.conformance.fields` like :func:`record`."""
    fields.check(info, where=f"benchmark {getattr(benchmark, 'name', '')!r}")
    benchmark.extra_info.update(info)


def _clean(x: Any) -> Any:
    if isinstance(x, float) and (math.isinf(x) or math.isnan(x)):
        return str(x)
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "item") and callable(x.item):
        try:
            return _clean(x.item())
        except (ValueError, RuntimeError):
            return str(x)
    return x


def write_rows(rows: list[Row], path: str | os.PathLike) -> None:
    """Append rows as JSON lines to ``path`` (created with its folder)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("a") as f:
        for r in rows:
            f.write(json.dumps(_clean(asdict(r)), sort_keys=True) + "\n")


def read_rows(path: str | os.PathLike) -> list[Row]:
    """Rows from a JSON-lines file, or from every ``*.jsonl`` in a folder."""
    p = Path(path)
    files = sorted(p.glob("*.jsonl")) if p.is_dir() else [p]
    rows: list[Row] = []
    for f in files:
        for line in f.read_text().splitlines():
            if line.strip():
                rows.append(_evidence_kept(Row(**json.loads(line))))
    return rows


def _evidence_kept(row: Row) -> Row:
    """``row`` with its evidence as a field: a partial row written by an older version said it
    in its message only (:func:`inference_conformance.conformance.outcomes.evidence_from_text`)."""
    if not row.evidence and row.verdict == outcomes.Outcome.PARTIAL and row.message:
        row.evidence = outcomes.evidence_from_text(str(row.message))
    return row
