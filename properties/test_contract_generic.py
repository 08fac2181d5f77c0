"""Checks every contract gets, for every implementation, from the contract's own ``cases``.

A contract that sets ``Contract.cases`` ("module:attr" of ``cases(seed, device) -> [(args,
kwargs)]``, small valid calls of its main function with inputs of real magnitude) gets, for every
registered implementation (or the ``--impl`` ones):

- ``test_inputs_not_mutated``: every tensor argument is bit-for-bit unchanged by the call (an
  ``out`` buffer excepted);
- ``test_output_fully_written``: with an ``out`` buffer, pre-filled with NaN, every element is
  written; otherwise the output is finite wherever the oracle's is (the oracle is the built-in
  named ``reference``, else the first available built-in);
- ``test_repeatable``: two calls on the same inputs give bit-identical results.

A contract that sets ``Contract.invalid`` (``invalid(device) -> [InvalidCall]``, the calls it
documents as invalid) gets ``test_invalid_call_raises`` for every implementation and every one of
those calls: it raises a documented type (TypeError / ValueError, or what the call names), before
an ``out`` buffer is written, and the message names the argument; no exception, another type (a
NotImplementedError too) or a message not naming the argument fails, saying which.

An implementation that raises ``NotImplementedError`` for a case is "unsupported" for it, never a
pass; a crash or hang of an outside implementation fails its own test (``--impl-timeout``,
pytest-xdist), never the whole run. The checks are plain functions (``check_*``, in
``properties/generic_cases.py``) so the suite's tests show each one rejects a known-bad function.
"""
from __future__ import annotations

import importlib
from typing import Any

import pytest

from inference_conformance.conformance import registry
from inference_conformance.conformance.plugin_state import state
from inference_conformance.conformance.outcomes import unsupported
from inference_conformance.properties.generic_cases import (
    Refused,
    check_inputs_not_mutated,
    check_invalid_call,
    check_output_fully_written,
    check_repeatable,
)


def _each_case(impl, device, check) -> None:
    """Run ``check(args, kwargs)`` on every case; a refused case is skipped, not the others;
    when every case is refused the test is "unsupported" (a skip), never a pass."""
    refused = []
    calls = _cases(impl, device)
    for args, kwargs in calls:
        try:
            check(args, kwargs)
        except Refused as exc:
            refused.append(str(exc))
    if len(refused) == len(calls):
        unsupported(f"every case refused ({refused[0]})")


def _contracts_with_cases() -> list[str]:
    return sorted(t for t, c in registry.contracts().items() if c.cases)


def _impls(config, technique: str, device: str) -> list:
    """The ``--impl`` implementations of ``technique``, else the registry's, each with its marks
    (the technique, so ``--impl`` keeps it; a skip with the reason where it is unavailable)."""
    outside = state(config).outside.get(technique)
    out = []
    for i in outside if outside else registry.builtins(technique, device):
        marks = [pytest.mark.technique(technique)]
        if i.unavailable:
            marks.append(pytest.mark.skip(reason=i.unavailable))
        out.append((i, marks))
    return out


def _invalid_calls(technique: str, device: str) -> list:
    """The contract's invalid calls; for a contract whose bad calls need objects of a layer above
    conformance/ (the kv_cache engines need a reference model), ``invalid_calls(device)`` of
    ``properties/<technique>/cases.py``."""
    calls = registry.invalid_calls(technique, device)
    if not calls and registry.importable(f"inference_conformance.properties.{technique}.cases"):
        module = importlib.import_module(f"inference_conformance.properties.{technique}.cases")
        calls = list(getattr(module, "invalid_calls", lambda device: [])(device))
    return calls


def pytest_generate_tests(metafunc):
    if "impl" not in metafunc.fixturenames or metafunc.definition.get_closest_marker("technique"):
        return
    device = state(metafunc.config).device
    if "call" in metafunc.fixturenames:
        params = [pytest.param(i, call, id=f"{t}-{i.name}-{call.what}", marks=marks)
                  for t in sorted(registry.contracts())
                  for call in _invalid_calls(t, device) for i, marks in _impls(metafunc.config, t, device)]
        if not params:
            params = [pytest.param(None, None, id="none", marks=pytest.mark.skip(reason="no contract sets `invalid`"))]
        metafunc.parametrize("impl,call", params)
        return
    params = [pytest.param(i, id=f"{t}-{i.name}", marks=marks)
              for t in _contracts_with_cases() for i, marks in _impls(metafunc.config, t, device)]
    if not params:
        params = [pytest.param(None, id="none", marks=pytest.mark.skip(reason="no contract sets `cases` yet"))]
    metafunc.parametrize("impl", params)


_ORACLES: dict[str, Any] = {}


def _oracle(technique: str, device: str):
    if technique not in _ORACLES:
        impls = [i for i in registry.builtins(technique, device) if not i.unavailable]
        ref = next((i for i in impls if i.name == "reference"), impls[0] if impls else None)
        _ORACLES[technique] = ref
    return _ORACLES[technique]


def _cases(impl, device):
    calls = registry.cases(impl.technique, 0, device)
    assert calls, f"{impl.technique}: Contract.cases returned no calls"
    return calls


def test_inputs_not_mutated(impl, device):
    _each_case(impl, device, lambda args, kwargs: check_inputs_not_mutated(impl, args, kwargs))


def test_output_fully_written(impl, device):
    oracle = _oracle(impl.technique, device)
    if oracle is not None and (oracle.name, oracle.origin) == (impl.name, impl.origin):
        oracle = None
    _each_case(impl, device, lambda args, kwargs: check_output_fully_written(impl, args, kwargs, oracle=oracle))


def test_repeatable(impl, device):
    _each_case(impl, device, lambda args, kwargs: check_repeatable(impl, args, kwargs))


def test_invalid_call_raises(impl, call):
    """An invalid call raises a documented type naming the argument, before anything is written
    (:func:`inference_conformance.properties.generic_cases.check_invalid_call`); an implementation that refuses the
    valid parts the call needs is "unsupported" for it."""
    try:
        check_invalid_call(impl, call)
    except Refused as exc:
        unsupported(str(exc))
