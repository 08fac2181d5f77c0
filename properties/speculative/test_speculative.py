"""Tests of speculative decoding beside its laws (claims SD-1, SD-2, SD-4..SD-7; lecture 002 §2,
Leviathan et al. 2023; SD-1's laws, exact and on samples, in ``laws/verify.py``): SD-1's exact
enumeration and its rejection of wrong acceptance rules, the lecture's two-token example (SD-2),
randomness only from the generator, and the SD-4 / SD-6 formulas. The checks of SD-2 and
SD-4..SD-7 are functions of what they judge in ``claims_cases.py``, shown rejecting known-bad
inputs in ``test_speculative_rejections.py``; SD-1, SD-5 and SD-7 on the small world's checkpoints
in ``test_speculative_small_world.py``.
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.conformance import results
from inference_conformance.conformance.tolerance import assert_exact
from inference_conformance.properties.speculative.cases import (
    EXACT_BOUND,
    PINNED,
    STAT_CONFIGS,
)
from inference_conformance.properties.speculative.claims_cases import (
    check_sd2,
    check_sd4,
    check_sd6,
)
from inference_conformance.properties.speculative.laws.verify import SD1_EXACT, sd1_exact
from inference_conformance.reference import speculative as ref

TECH = "speculative"
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.claim("SD-1")
@pytest.mark.suite_own("the exact enumeration, the oracle SD-1's statistical law is calibrated on")
def test_sd1_exact_enumeration():
    """SD-1 exactly: for drawn and pinned (p, q), the distribution of the first emitted token and
    of the first two equals the target's to 1e-12 (float64 enumeration of every path)."""
    run = SD1_EXACT(ref)
    results.record("SD-1", measured=max(run.observations), bound=EXACT_BOUND, lecture="5e-7 on 200 documents",
                   unit="max |P(emitted) - p| over the enumerated distributions",
                   rule="exact enumeration of every accept/reject path, float64", what="exact error")


@pytest.mark.claim("SD-1")
@pytest.mark.parametrize("rule", ["min(1, q/p)", "0.97 min(1, p/q)", "1 (accept every draft)"])
def test_sd1_exact_check_rejects_wrong_acceptance(rule):
    """The exact check can fail: enumerating with a wrong acceptance rule moves the emitted
    distribution away from p by far more than the bound, on the pinned pairs where p != q."""
    accept = {"min(1, q/p)": lambda p, q: min(1.0, q / p) if p > 0 else 0.0,
              "0.97 min(1, p/q)": lambda p, q: 0.97 * min(1.0, p / q),
              "1 (accept every draft)": lambda p, q: 1.0}[rule]
    errors = [v.error for pq in (PINNED[0], PINNED[1], PINNED[3]) for v in sd1_exact(pq, accept)]
    assert max(errors) > 1e-3, f"acceptance {rule} passed the exact SD-1 check (errors {errors})"


@pytest.mark.claim("SD-2")
@pytest.mark.suite_own("the lecture's worked two-token example")
def test_sd2_two_token_example():
    """SD-2, the two-token proof of CS336 (its notation: q the target, p the draft): a draft
    that over-proposes A (p(A) > q(A)) is accepted on A with probability q(A)/p(A) and always
    on B, and a rejection always yields B: P[A] = q(A), P[B] = q(B), by exact enumeration
    (:func:`inference_conformance.properties.speculative.claims_cases.check_sd2`)."""
    check_sd2(ref.round_outcomes)


@pytest.mark.technique(TECH)
@pytest.mark.claim("SD-1")
def test_randomness_only_from_generator(impl, device):
    """Two calls with identically seeded generators return identical results whatever the global
    RNG's state; a differently seeded generator changes them; the inputs are left untouched."""
    from inference_conformance.properties.speculative.cases import tensors

    tok, qb, pb = tensors(STAT_CONFIGS["gamma3-V5"], 512, torch.float32, device, seed=11)
    saved = (tok.clone(), qb.clone(), pb.clone())
    torch.manual_seed(1)
    a = impl(tok, qb, pb, generator=torch.Generator(device=device).manual_seed(5))
    torch.manual_seed(2)
    torch.rand(1000)
    b = impl(tok, qb, pb, generator=torch.Generator(device=device).manual_seed(5))
    c = impl(tok, qb, pb, generator=torch.Generator(device=device).manual_seed(6))
    for x, y, what in zip(a, b, ("tokens", "num_accepted")):
        assert_exact(x, y, what=f"{what} of two calls with identically seeded generators")
    assert not torch.equal(a[0], c[0]), "a differently seeded generator gave identical tokens"
    for x, y, what in zip((tok, qb, pb), saved, ("draft_tokens", "draft_probs", "target_probs")):
        assert_exact(x, y, what=f"{what} after the call (inputs must not be mutated)")


# ------------------------------------------------------------------------ SD-4 / SD-6 formulas
@pytest.mark.claim("SD-4")
@pytest.mark.parametrize("alpha", [0.5, 0.69, 0.8, 0.92])
@pytest.mark.suite_own("the lecture's tokens-per-call formula against the enumeration")
def test_sd4_tokens_per_call_formula_matches_enumeration(alpha):
    """SD-4: when every position accepts with the same α (p, q built so that Σ min(p, q) = α),
    the enumerated expected tokens per round equals (1 − α^(γ+1)) / (1 − α), γ = 1..4, and the
    estimated speedup is that over 1 + γc (:func:`inference_conformance.properties.speculative.claims_cases.check_sd4`)."""
    check_sd4(alpha, ref.tokens_per_call, ref.speedup)


@pytest.mark.claim("SD-6")
@pytest.mark.suite_own("the lecture's exercise 7 table")
def test_sd6_exercise_7_table():
    """SD-6: the speedup formula at α = 0.8, c = 0.05 gives the lecture's table to its printed
    precision, and the best γ is near 8 (:func:`inference_conformance.properties.speculative.claims_cases.check_sd6`)."""
    check_sd6(ref.speedup, ref.best_gamma)


def test_formula_errors():
    with pytest.raises(ValueError, match="alpha"):
        ref.tokens_per_call(1.5, 3)
    with pytest.raises(ValueError, match="gamma"):
        ref.tokens_per_call(0.5, -1)
    with pytest.raises(ValueError, match="c"):
        ref.speedup(0.5, 3, -0.1)

