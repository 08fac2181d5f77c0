"""The public API: what an outside implementation, its tests and its CI use of the suite.

Everything here is defined elsewhere in the package and re-exported under one stable name, so that
a project writes ``from inference_conformance.api import attention, check_close`` instead of
reaching into the suite's layout (``inference_conformance.conformance.contracts.attention``).

Contracts, one module per technique (each holds its call contract in its docstring, its
``validate`` functions, raising TypeError / ValueError naming the argument, and its ``CONTRACT``):
:mod:`attention`, :mod:`kv_cache`, :mod:`paged_attention`, :mod:`mla_decode`,
:mod:`tree_attention`, :mod:`kv_transfer`, :mod:`kv_format`, :mod:`fp8_cast`,
:mod:`quantization`, :mod:`speculative`, :mod:`speculative_tree`, :mod:`drafter`,
:mod:`inference_engine`. ``contracts()`` maps each technique's name to its :class:`Contract`.

Registering an implementation: ``builtin(technique, name, impl)`` returns a :class:`Registration`;
a package lists them in a function ``implementations()`` named by the entry-point group
:data:`ENTRY_POINT_GROUP`, or a run names one with ``--impl TECHNIQUE=module:attr``.
``known_bad(...)`` declares a one-bug implementation a law must reject.

Checks, the tolerance policy's (every failure states the measured error, the bound and the rule):
``check_close(out, out_ref, out_pt=..., rule=...)``, ``check_within(out, out_ref, bound)``,
``check_exact(actual, expected)``, ``check_scalar(measured, expected, rel=...)``, each returning a
comparison whose ``.check()`` raises AssertionError on failure; ``assert_close`` /
``assert_exact`` / ``assert_scalar`` check at once.

Laws: :class:`Law` (declared once, run over every registered implementation), :class:`Kills`
(the zoo entries a law must reject) and ``refusal(run, what)`` (an implementation's
NotImplementedError inside it is "unsupported", never a pass).
"""
from __future__ import annotations

from inference_conformance.conformance.contracts import (
    attention,
    drafter,
    fp8_cast,
    inference_engine,
    kv_cache,
    kv_format,
    kv_transfer,
    mla_decode,
    paged_attention,
    quantization,
    speculative,
    speculative_tree,
    tree_attention,
)
from inference_conformance.conformance.law_run import refusal
from inference_conformance.conformance.laws import Kills, Law
from inference_conformance.conformance.registry import ENTRY_POINT_GROUP, contracts
from inference_conformance.conformance.registry_declarations import Contract, InvalidCall, Registration, builtin, known_bad
from inference_conformance.conformance.tolerance import (
    assert_close,
    assert_exact,
    assert_scalar,
    check_close,
    check_exact,
    check_scalar,
    check_within,
)

#: The contract modules by technique name (the registry's techniques, each once).
CONTRACT_MODULES = {m.CONTRACT.technique: m for m in (
    attention, kv_cache, paged_attention, mla_decode, tree_attention, kv_transfer, kv_format, fp8_cast,
    quantization, speculative, speculative_tree, drafter, inference_engine)}

__all__ = [
    "CONTRACT_MODULES", "ENTRY_POINT_GROUP", "Contract", "InvalidCall", "Kills", "Law", "Registration",
    "assert_close", "assert_exact", "assert_scalar", "attention", "builtin", "check_close", "check_exact",
    "check_scalar", "check_within", "contracts", "drafter", "fp8_cast", "inference_engine", "known_bad",
    "kv_cache", "kv_format", "kv_transfer", "mla_decode", "paged_attention", "quantization", "refusal",
    "speculative", "speculative_tree", "tree_attention",
]
