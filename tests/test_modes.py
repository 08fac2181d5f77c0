"""Registration declarations. A mode of a built-in (``builtin(..., mode_of=...)``: the same kernels with one setting changed,
such as the batch-invariant split plan) runs each law's pinned examples only under the gating
profiles (``ci``, ``compat``), and every example elsewhere; under ``compat`` (the oldest stack's
check of the same kernels) every implementation does; a law without pinned examples draws as
usual (never zero examples)."""
from __future__ import annotations

import types

import pytest
from hypothesis import strategies as st

from inference_conformance.conformance import laws, registry
from inference_conformance.conformance.laws import Law
from inference_conformance.conformance.registry_declarations import builtin


def _impl(mode_of):
    return registry.Implementation("attention", "m", "tests:m", "builtin", types.SimpleNamespace(attention=None),
                                   ("attention",), mode_of=mode_of)


def _law(seen, pinned=True):
    def body(run, x):
        seen.append(x)
    return Law(claim="FA-3", technique="attention", body=body, given={"x": st.integers(0, 10**6)},
               examples=(dict(x=-1),) if pinned else (), params=(), max_examples=lambda n: 5)


@pytest.mark.parametrize("profile,mode_of,pinned,expected", [
    ("inference_conformance.ci", "triton", True, [-1]),
    ("compat", "triton", True, [-1]),
    ("inference_conformance.dev", "triton", True, None),
    ("inference_conformance.ci", None, True, None),
    ("inference_conformance.compat", None, True, [-1]),
    ("inference_conformance.ci", "triton", False, None),
])
def test_mode_runs_pinned_examples_under_gating_profiles(monkeypatch, profile, mode_of, pinned, expected):
    monkeypatch.setattr(laws, "_profile_name", lambda: profile)
    seen: list = []
    _law(seen, pinned)(_impl(mode_of))
    if expected is not None:
        assert seen == expected
    else:
        assert len([x for x in seen if x >= 0]) >= 1, seen        # drawn examples ran


def test_mode_of_must_name_a_builtin():
    with pytest.raises(TypeError, match="mode_of"):
        builtin("attention", "m", lambda: None, mode_of=3)
    assert builtin("attention", "m", lambda: None, mode_of="triton").mode_of == "triton"


def test_outside_target_declares_batch_invariance(monkeypatch):
    """``--impl module:attr``: an attribute ``batch_invariant = True`` on the target declares
    batch invariance (the law then enforces it); a non-bool is refused."""
    import sys

    mod = types.ModuleType("bi_target_module")

    def attention(q, k, v, *, causal, scale):
        return q

    attention.batch_invariant = True
    mod.attention = attention
    mod.plain = lambda q, k, v, *, causal, scale: q
    mod.wrong = lambda q, k, v, *, causal, scale: q
    mod.wrong.batch_invariant = "yes"
    monkeypatch.setitem(sys.modules, "bi_target_module", mod)
    assert registry.load("attention", "x", "bi_target_module:attention", "outside").batch_invariant is True
    assert registry.load("attention", "y", "bi_target_module:plain", "outside").batch_invariant is False
    with pytest.raises(TypeError, match="batch_invariant"):
        registry.load("attention", "z", "bi_target_module:wrong", "outside")
