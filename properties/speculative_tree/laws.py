"""The laws of token-tree speculation (claims SD-11; SD-10 through the model; SpecInfer, Medusa;
lecture 002 §6.6), beside their tests in ``test_speculative_tree.py`` and
``test_speculative_tree_engine.py``.

SD-11 is checked two ways. Exactly (:data:`SD11_EXACT`, the reference's enumeration: no
implementation): the float64 tree enumerator sums every draft token and every accept/reject path of
one round over a tree; the round's emitted tokens, completed by the target to depth + 1 tokens,
must have the target's own distribution to 1e-12. On samples, for every registered ``verify_tree``
(:data:`SD11_STATISTICAL`): one batch of independent rounds per fixed tree configuration, the
result's structure checked exactly, then a G-test of the emitted sequences against the
enumeration, family-wise false-alarm rate 1e-3; at the ends of [0, 1) (:data:`SD11_BOUNDARY`). The
zoo (``zoo.py``) is each shown rejected.

SD-10 through the model (:data:`SD10_MODEL`, technique ``tree_attention``): a tree scored in one
forward gives every node the logits of its root-to-node path run alone, through the engine's cached
forward scored by every registered ``tree_attention`` implementation (``model_cases.py``).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import note
from hypothesis import strategies as st

from inference_conformance.conformance.contracts.speculative_tree import DTYPES
from inference_conformance.conformance.laws import Kills, Law, refusal
from inference_conformance.conformance.outcomes import unsupported
from inference_conformance.conformance.tolerance import Comparison, report_verdict
from inference_conformance.properties.speculative_tree.boundary_cases import boundary_verdicts
from inference_conformance.properties.speculative_tree.cases import PINNED_TREES, tree_cases, tree_law_verdicts
from inference_conformance.properties.speculative_tree.model_cases import (
    SD10_CASES,
    SD10_INTERPRETED,
    sd10_through_the_model,
)
from inference_conformance.reference import speculative_tree as ref

TECH = "speculative_tree"
ZOO_ALL = ("unrenormalised_sibling_residual", "sibling_tested_against_p", "correction_from_q",
           "bonus_from_deepest_node", "acceptance_times_097", "typical_acceptance_as_exact")
#: The exact rule of SD-11: the enumerated distribution equals the target's to this bound (float64).
EXACT_BOUND = 1e-12

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tree_exact_error(case, rule=ref.EXACT) -> float:
    """max |P(completed emitted tokens) − P(target)| over depth + 1 tokens, by enumeration."""
    L = case.depth + 1
    got = ref.completed_distribution(case.outcomes(rule), case.p, case.V, L)
    return float(np.abs(got - ref.target_distribution(case.p, case.V, L)).max())


def law_sd11_exact(run, case):
    """SD-11 exactly on one tree: the round's emitted tokens, completed by the target, follow the
    target's distribution over depth + 1 tokens; the error is observed."""
    note(repr(case))
    err = tree_exact_error(case)
    run.observe(err)
    report_verdict(Comparison(err <= EXACT_BOUND, f"exact enumeration in float64: max |P - p| <= {EXACT_BOUND:g}",
                           err, EXACT_BOUND, f"{case!r}: depth + 1 tokens")).check()


#: SD-11's exact law (no implementation: the reference's enumeration of every path).
SD11_EXACT = Law(claim="SD-11", technique=TECH, body=law_sd11_exact, params=(), given={"case": tree_cases()},
                 examples=tuple(dict(case=c) for c in PINNED_TREES))


# ------------------------------------------------------------ SD-11 on samples, every verifier
#: The statistical law's seed (the ``ci`` profile fixes every draw; so does this).
STAT_SEED = 7


def law_sd11_statistical(run, device, dtype):
    """SD-11 on samples: per tree configuration one ``verify_tree`` call over its independent
    rounds, probabilities in ``dtype``; structure exactly, then one G-test of the emitted
    sequences, ALPHA family-wise."""
    with refusal(run, f"{run.implementation} on {dtype} probabilities"):
        verdicts = tree_law_verdicts(run.impl, STAT_SEED, device, dtype=dtype)
    failed = [v for v in verdicts if not v.ok]
    assert not failed, f"{dtype}: " + "; ".join(f"{v.what}: {v.detail}" for v in failed[:3])


SD11_STATISTICAL = Law(claim="SD-11", technique=TECH, body=law_sd11_statistical, dtypes=DTYPES,
                       kills=(Kills(ZOO_ALL, (torch.float64,)),
                              Kills(("float32_unrenormalised_residual",), (torch.float32,))),
    test="test_sd11_statistical",
    doc="""SD-11 for every registered verify_tree, in every dtype of the contract (the probabilities
    multiples of 2^-8, exact in each): the emitted sequences of a binary tree, three independent
    drafts, a wide root and two boundary classes follow the exact enumeration (G-tests,
    family-wise false-alarm rate 1e-3, fixed seeds), after exact checks of the path.""",
    zoo_tests=("test_sd11_zoo_rejected", "test_sd11_zoo_rejected_float32"))


def law_sd11_boundary_uniforms(run, device, dtype):
    """SD-11 at the ends of [0, 1): with every uniform the verifier draws at 0, then at the largest
    value below 1, each tree of ``BOUNDARY_TREES`` (probabilities ``dtype``) accepts exactly the
    nodes of residual r(x) >= q(x), rejects those of r(x) = 0 and emits a token of positive
    probability in the row it is drawn from (``properties/speculative_tree/boundary_cases.py``)."""
    with refusal(run, f"{run.implementation} on {dtype} probabilities"):
        failures, draws = boundary_verdicts(run.impl, device, dtype)
    if draws == 0:
        unsupported(f"{run.implementation} draws no uniform through torch.rand, torch.rand_like or "
                    "Tensor.uniform_: the boundary values cannot be given to it")
    run.observe(draws)
    assert not failures, f"{len(failures)} boundary rounds wrong: " + "; ".join(failures[:2])


SD11_BOUNDARY = Law(claim="SD-11", technique=TECH, body=law_sd11_boundary_uniforms, dtypes=DTYPES,
                    kills=(Kills(("accepts_at_boundary",), (torch.float32,)),),
    test="test_sd11_boundary_uniforms",
    zoo_tests=("test_sd11_boundary_zoo_rejected",))


# ------------------------------------------------------------ SD-10 through the model
def law_sd10_tree_forward(run, device, cases):
    """SD-10 through the model, for every tree_attention implementation: the shipped target's
    tree forward over its cache, scored by the implementation, gives every node the logits of
    its root-to-node path alone (float64, the float64 rule); an interpreted kernel runs
    :data:`SD10_INTERPRETED`."""
    run.observe(cases)
    with refusal(run, f"{run.implementation} refuses the target's float64 tree forward"):
        sd10_through_the_model(run.impl, torch.float64, SD10_INTERPRETED if run.interpreted else cases, device=device)


#: SD-10 through the model over every registered tree_attention implementation (outside ones
#: included); the flattened-index mask and the sibling leak are rejected by it too.
SD10_MODEL = Law(claim="SD-10", technique="tree_attention", body=law_sd10_tree_forward,
                 given={"cases": st.just(SD10_CASES)}, examples=(dict(cases=SD10_CASES),), explicit_only=True,
                 params=("device",), kills=(Kills(("flattened_index_mask", "sibling_leak")),),
    test="test_sd10_tree_attention_equals_each_path_alone",
    zoo_tests=("test_sd10_zoo_rejected",))
