"""The law runner: a law is declared once, and its tests are made from the declaration.

A :class:`Law` names its claim and technique, its body, the strategies of its drawn arguments
(or pinned cases only), its pinned examples, the dtypes its conformance test runs in, the
known-bad implementations each of its zoo tests must reject (:class:`Kills`) and the contract's
boundary classes (:mod:`inference_conformance.conformance.coverage`) its examples must reach, and
the names of the tests made from it. Every law of a technique lives in
``properties/<technique>/laws.py`` (or its ``laws/`` package); the suite's pytest plugin collects
each :class:`Law` there as its tests
(:func:`inference_conformance.conformance.plugin_collect.law_items`), under the names the report
reads::

    FA3 = Law(claim="FA-3", technique="attention", body=law_matches_reference,
              given={"case": cases(), "seed": strategies.seeds}, examples=(dict(case=..., seed=7), ...),
              dtypes=DTYPES, kills=(Kills(ZOO_ALL, (torch.float64,)), Kills(ZOO_16BIT, (torch.bfloat16,))),
              test="test_fa3_matches_float64_reference",
              zoo_tests=("test_fa3_zoo_rejected", "test_fa3_zoo_rejected_bfloat16"))

The body is ``body(run, *params, **drawn)``: ``run`` is the :class:`Run` of this law on one
implementation (``run.impl``), ``params`` the law's parameters in order (fixtures such as
``device``, and ``dtype``), ``drawn`` the arguments Hypothesis draws. ``law(impl, *params)`` runs
it and returns the :class:`Run` (:mod:`inference_conformance.conformance.law_run`): the examples
that ran, the refusals with their reasons, the boundary classes reached, the parts of the law left
unchecked, the worst comparison. Nothing is kept between runs.

Refusals: inside :func:`refusal`, an implementation's ``NotImplementedError`` discards the
example (the run keeps the reason); when every example was refused the test ends as
"unsupported", never as a pass. A part of a law the implementation gives no means to check (an
engine that reports no counts) is ``run.uncheck(part, reason)`` in each example that could not
check it; when no example that ran checked it, the test is "partial" naming the part and the
reason (:meth:`Run.partial_text`), never a plain pass. Settings: a Triton kernel run under the interpreter
(:func:`runs_interpreted`, decided per implementation when the law runs) gets the law's
``interpreted_examples`` and the strategies ``given(interpreted=True)`` returns.
"""
from __future__ import annotations

import dataclasses
import inspect
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NoReturn

import pytest
from hypothesis import Phase, example, given, settings
from hypothesis.errors import Unsatisfiable, UnsatisfiedAssumption

from inference_conformance.conformance import results
from inference_conformance.conformance.coverage import CoverageClass, classes_reached, missing_classes
from inference_conformance.conformance.device import triton_interpreted
from inference_conformance.conformance.failures import LawFailure, capturing
from inference_conformance.conformance.law_run import Run, input_digest, refusal
from inference_conformance.conformance.outcomes import unsupported
from inference_conformance.conformance.zoo import expect_rejected


def runs_interpreted(impl) -> bool:
    """True for a Triton kernel run under the interpreter (its module imports triton; an
    implementation whose module is unknown counts as one): only those get fewer examples and
    bounded sizes. A PyTorch implementation is checked at full size."""
    if not triton_interpreted():
        return False
    if getattr(impl, "origin", "") == "builtin":   # a built-in declares the kernels it launches
        return bool(getattr(impl, "kernel_modules", ()))
    target = str(getattr(impl, "target", ""))
    module = sys.modules.get(target.split(":", 1)[0]) if ":" in target else None
    return module is None or getattr(module, "triton", None) is not None


def dtype_id(dtype) -> str:
    """The test id of a dtype parameter: ``torch.bfloat16`` -> "bfloat16"."""
    return str(dtype).replace("torch.", "")


#: Failed examples a run keeps for its compact failure (the reported one is among the last).
MAX_KEPT_FAILURES = 8


def _fail(failure: LawFailure) -> NoReturn:
    """Raise the compact failure, without the chain of Hypothesis' report it replaces."""
    raise failure from None


def _failed_inputs(run: Run, exc: BaseException) -> list[str]:
    """The :func:`input_digest` of the examples whose failures ``exc`` reports (the last failed
    example where it names none of them)."""
    raised, todo = set(), [exc]
    while todo:
        e = todo.pop()
        raised.add(id(e))
        todo += getattr(e, "exceptions", ())
    found = [input_digest(drawn) for e, drawn, _ in run._failures if id(e) in raised]
    return list(dict.fromkeys(found or [input_digest(drawn) for _, drawn, _ in run._failures[-1:]]))


@dataclass(frozen=True)
class Kills:
    """The known-bad implementations (zoo entry names) one zoo test of a law must reject, and
    the dtypes it runs the law in: one dtype is fixed (the test has no dtype parameter), several
    parametrize the test, none for a law without a dtype parameter."""

    names: tuple
    dtypes: tuple = ()
    doc: str = ""


def _parameters(names) -> inspect.Signature:
    return inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])


def _dtype_parameter(dtypes) -> Any:
    return pytest.mark.parametrize("dtype", [pytest.param(d, id=dtype_id(d)) for d in dtypes])


def _named(test: Callable, name: str, doc: str | None, module: str, marks: list) -> Callable:
    test.__name__ = test.__qualname__ = name
    test.__doc__ = doc
    test.__module__ = module
    for mark in reversed(marks):
        test = mark(test)
    return test


def _declaring_module() -> str:
    """The name of the module whose code is creating a :class:`Law` (the first frame outside this
    module and ``dataclasses``)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") in (__name__, "dataclasses"):
        frame = frame.f_back
    return frame.f_globals.get("__name__", "") if frame is not None else ""


GATING_PROFILES = ("ci", "compat")  #: where a mode of a built-in runs pinned examples only


def _pinned_only(impl) -> bool:
    """Pinned examples only: under ``compat`` (the oldest stack's check of the same kernels) for
    every implementation; under ``ci`` for a mode of another built-in."""
    profile = _profile_name().rsplit(".", 1)[-1]
    return profile == "compat" or (bool(getattr(impl, "mode_of", None)) and profile in GATING_PROFILES)


def _profile_name() -> str:  # the loaded Hypothesis profile's name
    return getattr(settings, "get_current_profile_name", lambda: "")()


@dataclass(frozen=True)
class Law:
    """One law, declared once (see the module's docstring).

    ``given``: the strategies of the drawn arguments, by name, or a function of ``interpreted``
    returning them; ``examples``: the pinned examples (dicts of the drawn arguments), run first
    and in every profile; ``params``: the law's parameters after ``run``, in order ("dtype" is
    the conformance test's parameter over ``dtypes``, the others are fixtures); ``kills``: one
    :class:`Kills` per zoo test; ``coverage``: the contract's coverage table (the classes naming
    this law are recorded per run); ``require_coverage``: the conformance test fails when a run
    that refused nothing misses one of them; ``max_examples`` / ``interpreted_examples``: the
    drawn examples (default: the profile's) for every implementation / for Triton kernels run
    under the interpreter (default: ``max_examples``), each a function of the profile's number; ``explicit_only``: run the
    pinned examples only; ``applies``: ``applies(impl)`` is None, or the reason the law does not
    apply to ``impl`` (the conformance test skips with it); ``claims``: the claim ids of its
    tests (default: ``claim``); ``test``: the name of its conformance test ("" for none);
    ``zoo_tests``: the names of its zoo tests, one per :class:`Kills`, in order; ``after``:
    ``after(run)`` once the conformance test's run passed (to record a figure from it); ``doc``:
    the conformance test's docstring (default: the body's); ``marks``: pytest marks its tests
    carry besides the technique and claim (a fixture they use, a warning they ignore). ``home``
    (set when it is made) names the module that declared it: the plugin collects its tests there
    only."""

    claim: str
    technique: str
    body: Callable
    given: Mapping[str, Any] | Callable[[bool], Mapping[str, Any]] = field(default_factory=dict)
    examples: tuple = ()
    params: tuple = ("device", "dtype")
    dtypes: tuple = ()
    kills: tuple = ()
    coverage: tuple = ()
    require_coverage: bool = False
    max_examples: Callable[[int], int] | None = None
    interpreted_examples: Callable[[int], int] | None = None
    explicit_only: bool = False
    applies: Callable[[Any], str | None] | None = None
    claims: tuple = ()
    test: str = ""
    zoo_tests: tuple = ()
    after: Callable[[Run], None] | None = None
    doc: str | None = None
    marks: tuple = ()

    def __post_init__(self):
        # the module that declared it (not this one, not dataclasses.replace): where it is collected
        object.__setattr__(self, "home", _declaring_module())
        if self.zoo_tests and len(self.zoo_tests) != len(self.kills):
            raise ValueError(f"{self.name}: zoo_tests names {len(self.zoo_tests)} tests, kills declares "
                             f"{len(self.kills)}")

    @property
    def name(self) -> str:
        """The law's name: its body's (the coverage tables name laws by it)."""
        return self.body.__name__

    def with_examples(self, examples: tuple, *, explicit_only: bool = True) -> Law:
        """The same law on other pinned examples (only those, by default), declaring no test of its
        own (a variant run by hand is not the declared law's test)."""
        return dataclasses.replace(self, examples=tuple(examples), explicit_only=explicit_only, test="", zoo_tests=())

    def hypothesis_test(self, interpreted: bool, pinned_only: bool = False) -> Callable:
        """The Hypothesis test of the law for an implementation that runs interpreted or not:
        ``test(run, *params)``; ``pinned_only``: the pinned examples alone (where the law has
        some; a law without pinned examples draws as usual)."""
        body = self.body

        def example_body(run, *args, **drawn):
            run._begin_example()
            try:
                with capturing() as comparisons:
                    body(run, *args, **drawn)
            except UnsatisfiedAssumption:
                run._end_example(refused=True)
                raise
            except BaseException as exc:
                run._end_example(refused=False)
                # what the compact failure and the diagnosis read (the last few: shrinking fails often)
                run._failures[:] = run._failures[-(MAX_KEPT_FAILURES - 1):] + [(exc, drawn_of(args, drawn), comparisons)]
                raise
            run._end_example(refused=False)
            run.judged.append(input_digest(drawn_of(args, drawn)))

        def drawn_of(args, drawn) -> dict:
            called = signature.bind(None, *args, **drawn).arguments      # drawn ones may come positionally
            return {k: v for k, v in list(called.items())[1 + len(self.params):]}

        signature = inspect.signature(body)
        example_body.__signature__ = signature          # what Hypothesis binds
        for attr in ("__name__", "__qualname__", "__module__", "__doc__"):
            setattr(example_body, attr, getattr(body, attr))
        # under ``derandomize`` the draws follow from the law's name (and this runner), not from the
        # text of its body: editing a body does not move its draws
        example_body._hypothesis_internal_add_digest = f"{self.technique}:{self.name}".encode()
        strategies = self.given(interpreted) if callable(self.given) else self.given
        test = given(**strategies)(example_body) if strategies else example_body
        for pinned in reversed(self.examples):
            test = example(**pinned)(test)
        fewer = self.interpreted_examples if interpreted and self.interpreted_examples else self.max_examples
        chosen: dict[str, Any] = {}
        if fewer is not None:
            chosen["max_examples"] = fewer(settings.default.max_examples)
        if self.explicit_only or (pinned_only and self.examples):
            chosen["phases"] = [Phase.explicit]
        return settings(**chosen)(test) if chosen else test

    def __call__(self, impl, *args) -> Run:
        """Run the law on ``impl`` with its parameters ``args``; return what it saw.

        Raises the law's failure: for an implementation that is not a zoo entry a
        :class:`inference_conformance.conformance.failures.LawFailure` (the case, the diagnosis,
        the failing comparison and the implementation, one line each), for a zoo entry the
        law's own AssertionError; and :class:`inference_conformance.conformance.outcomes.Unsupported`
        when ``impl`` refused every example."""
        interpreted = runs_interpreted(impl)
        run = Run(self.name, getattr(impl, "name", str(impl)), impl, interpreted, tuple(self.coverage))
        try:
            self.hypothesis_test(interpreted, _pinned_only(impl))(run, *args)
        except Unsatisfiable:
            pass
        except (AssertionError, BaseExceptionGroup) as exc:
            from inference_conformance.conformance import diagnosis

            results.recorder().failed_inputs = _failed_inputs(run, exc)

            failure = diagnosis.compact(self, run, args, exc)
            if failure is None:
                raise
            _fail(failure)
        if run.ran == 0 and run.refused:
            unsupported(f"{run.refused[0]} (and every other example)")
        rec = results.recorder()
        run.worst = rec.worst
        if run.partial_text():
            rec.partial = run.partial_text()
            rec.refused_classes, rec.judged = sorted(run.refused_only), list(run.judged)
            rec.evidence = run.evidence()
        return run

    def missing_classes(self, run: Run) -> list[str]:
        """The classes of the coverage table naming this law that ``run`` did not reach."""
        return missing_classes(self.coverage, run.reached, self.name)

    def pinned_coverage(self, argument: str = "case") -> dict[str, list[str]]:
        """Class name -> the pinned examples ("example i", in order) whose ``argument`` reaches
        it, over the coverage classes naming this law: what every profile reaches."""
        table: dict[str, list[str]] = {}
        for i, pinned in enumerate(self.examples):
            for name in sorted(classes_reached(self.coverage, self.name, pinned[argument])):
                table.setdefault(name, []).append(f"example {i}")
        return dict(sorted(table.items()))

    def record_pinned_coverage(self, rule: str) -> None:
        """Record the claim's row of :meth:`pinned_coverage` (classes reached of those naming the
        law, the table in ``coverage``) and fail (AssertionError naming them) on a missing one."""
        table = self.pinned_coverage()
        missing = missing_classes(self.coverage, table, self.name)
        required = len(missing_classes(self.coverage, (), self.name))
        results.record(self.claim, measured=required - len(missing), bound=required,
                       unit="boundary classes reached by the pinned examples", rule=rule, coverage=table)
        assert not missing, f"pinned examples miss {missing}"

    def check_coverage(self, run: Run) -> None:
        """Fail (AssertionError naming them) when the law requires its coverage and the run
        missed classes that no refused example explains (a class reached only by refused
        examples is the implementation's partial support, reported as such, never a miss the
        refusals hide)."""
        if not self.require_coverage:
            return
        missing = [c for c in self.missing_classes(run) if c not in run.refused_only]
        assert not missing, (f"the law's cases never reached these boundary classes: {missing} "
                             f"(reached: {sorted(run.reached)}; refused only: {sorted(run.refused_only)})")

    def _marks(self) -> list:
        return [pytest.mark.technique(self.technique), pytest.mark.claim(*(self.claims or (self.claim,))), *self.marks]

    def _args(self, fixtures: Mapping[str, Any], dtype: Any) -> list:
        return [dtype if p == "dtype" else fixtures[p] for p in self.params]

    def tests(self) -> list[tuple[str, Callable]]:
        """(name, test function) of each test the law declares: its conformance test
        (:meth:`conformance_test`), then one zoo test per :class:`Kills` (:meth:`zoo_test`)."""
        made = [(self.test, self.conformance_test())] if self.test else []
        return made + [(name, self.zoo_test(name, kills)) for name, kills in zip(self.zoo_tests, self.kills)]

    def conformance_test(self) -> Callable:
        """The test of the law over the registry: ``test(impl, <params>)`` named ``test``,
        parametrized over ``dtypes``; it skips where ``applies`` says the law does not apply, runs
        the law, checks its coverage and calls ``after(run)``."""
        law, after = self, self.after

        def test(impl, **fixtures):
            reason = law.applies(impl) if law.applies else None
            if reason:
                pytest.skip(reason)
            run = law(impl, *law._args(fixtures, fixtures.get("dtype")))
            law.check_coverage(run)
            if after is not None:
                after(run)

        test.__signature__ = _parameters(("impl", *self.params))
        marks = self._marks() + ([_dtype_parameter(self.dtypes)] if "dtype" in self.params else [])
        return _named(test, self.test, self.doc or self.body.__doc__, self.body.__module__, marks)

    def zoo_test(self, name: str, kills: Kills) -> Callable:
        """The zoo test ``name(bad_impl, <params but dtype>[, dtype])``: each known-bad
        implementation of ``kills`` rejected by the law
        (:func:`inference_conformance.conformance.zoo.expect_rejected`)."""
        law = self
        fixed = kills.dtypes[0] if len(kills.dtypes) == 1 else None
        parametrized = len(kills.dtypes) > 1

        def test(bad_impl, **fixtures):
            expect_rejected(law, bad_impl, *law._args(fixtures, fixtures.get("dtype", fixed)))

        own = [p for p in self.params if p != "dtype"] + (["dtype"] if parametrized else [])
        test.__signature__ = _parameters(("bad_impl", *own))
        marks = self._marks() + [pytest.mark.kills(*kills.names)]
        marks += [_dtype_parameter(kills.dtypes)] if parametrized else []
        return _named(test, name, kills.doc or None, self.body.__module__, marks)


__all__ = ["CoverageClass", "Kills", "Law", "Run", "dtype_id", "refusal", "runs_interpreted"]
