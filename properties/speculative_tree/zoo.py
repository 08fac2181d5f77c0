"""Known-bad token-tree verifiers (the bug zoo of the ``speculative_tree`` contract): each is a
realistic mistake in recursive rejection sampling or in typical acceptance presented as exact,
and an SD-11 law (``properties/speculative_tree/test_speculative_tree.py``) must reject every one
under the ``ci`` profile: the statistical law (in float32 for the entry whose float32 path alone
is wrong), or the check at the boundary values of the uniforms for the one accepting at u = 0.

All follow the contract's signature, validate like a correct verifier, compute in float64 and take
their randomness from ``generator``, so that only the bug makes them wrong. The known-bad tree
forwards and engines of SD-10 / SD-12 (outside this contract) are in :data:`TREE_MODEL_ZOO` and
:func:`engine_zoo`.
"""
from __future__ import annotations

import math

import torch

from inference_conformance.conformance.contracts.speculative_tree import validate
from inference_conformance.optimized.speculative_tree import TreeRules, walk_tree


class _Unrenormalised(TreeRules):
    def residual(self, r, q_u, p_u):
        res = (r - q_u).clamp_min(0.0)
        return torch.where(res.sum(-1, keepdim=True) > 0, res, r)            # the bug: no division by the mass


class _SiblingVsP(TreeRules):
    def test_row(self, r, p_u):
        return p_u                                                            # the bug: p, not the residual


class _CorrectionFromQ(TreeRules):
    def correction(self, r, q_u):
        return q_u                                                            # the bug: the draft's q


class _BonusDeepest(TreeRules):
    def accepted_row(self, p, i, leaf, dep):
        if not leaf:
            return super().accepted_row(p, i, leaf, dep)
        deepest = max(range(len(dep)), key=lambda j: (dep[j], j))
        return p[:, deepest + 1]                                              # the bug: another branch's row


class _ScaledAcceptance(TreeRules):
    def accept(self, u, q_x, r_x, p_u, x):
        return u * q_x < 0.97 * torch.minimum(q_x, r_x)                       # the bug: 0.97 min(1, r/q)


class _AcceptsAtBoundary(TreeRules):
    def accept(self, u, q_x, r_x, p_u, x):
        return u * q_x <= r_x                                                 # the bug: <=, so u = 0 accepts r(x) = 0


class _Typical(TreeRules):
    """Medusa: accept x when p(x) > min(eps, delta exp(-H(p))), deterministic; then sample from p."""

    def __init__(self, eps: float, delta: float):
        self.eps, self.delta = eps, delta

    def accept(self, u, q_x, r_x, p_u, x):
        h = -(p_u * torch.log(p_u.clamp_min(1e-300))).sum(-1)
        return p_u.gather(1, x[:, None])[:, 0] > torch.clamp(self.delta * torch.exp(-h), max=self.eps)

    def residual(self, r, q_u, p_u):
        return p_u


def _verify_tree(parents, draft_tokens, draft_probs, target_probs, generator, rules: TreeRules):
    """The batched verifier (``inference_conformance.optimized.speculative_tree``) under ``rules``: one bug each."""
    validate(parents, draft_tokens, draft_probs, target_probs, generator)
    return walk_tree(parents, draft_tokens, draft_probs, target_probs, generator, rules)


def unrenormalised_sibling_residual(parents, draft_tokens, draft_probs, target_probs, *, generator):
    """After a rejected sibling the residual max(0, r − q) is not renormalised: the next sibling's
    acceptance min(1, r(x)/q(x)) reads an unnormalised r."""
    return _verify_tree(parents, draft_tokens, draft_probs, target_probs, generator, _Unrenormalised())


def sibling_tested_against_p(parents, draft_tokens, draft_probs, target_probs, *, generator):
    """Every sibling is tested against the target's p, not the residual updated by the rejected
    siblings before it."""
    return _verify_tree(parents, draft_tokens, draft_probs, target_probs, generator, _SiblingVsP())


def correction_from_q(parents, draft_tokens, draft_probs, target_probs, *, generator):
    """When every sibling is rejected the token is drawn from the draft's q instead of the updated
    residual."""
    return _verify_tree(parents, draft_tokens, draft_probs, target_probs, generator, _CorrectionFromQ())


def bonus_from_deepest_node(parents, draft_tokens, draft_probs, target_probs, *, generator):
    """At an accepted leaf the bonus token is drawn from the target's row of the deepest node of the
    tree (the last one flattened), which belongs to another branch."""
    return _verify_tree(parents, draft_tokens, draft_probs, target_probs, generator, _BonusDeepest())


def acceptance_times_097(parents, draft_tokens, draft_probs, target_probs, *, generator):
    """Every acceptance probability is 0.97 min(1, r/q): a few percent of bias, for the law's power."""
    return _verify_tree(parents, draft_tokens, draft_probs, target_probs, generator, _ScaledAcceptance())


def float32_unrenormalised_residual(parents, draft_tokens, draft_probs, target_probs, *, generator):
    """A float32 path that forgets to renormalise the residual max(0, r − q) after a rejected
    sibling (the bug of :func:`unrenormalised_sibling_residual`); float64, float16 and bfloat16
    inputs take the exact path, so a law run in float64 alone never sees it."""
    rules = _Unrenormalised() if draft_probs.dtype == torch.float32 else TreeRules()
    return _verify_tree(parents, draft_tokens, draft_probs, target_probs, generator, rules)


def accepts_at_boundary(parents, draft_tokens, draft_probs, target_probs, *, generator):
    """Accepts when u · q(x) <= r(x) instead of <: a uniform of exactly 0 accepts a token whose
    residual is 0 (target probability 0), an event of probability 2^-53 that only a draw at the
    boundary shows."""
    return _verify_tree(parents, draft_tokens, draft_probs, target_probs, generator, _AcceptsAtBoundary())


#: Medusa's defaults for its typical acceptance (Cai et al. 2024: ε = 0.09, δ = sqrt(ε) = 0.3).
TYPICAL_EPSILON, TYPICAL_DELTA = 0.09, math.sqrt(0.09)


def typical_acceptance_as_exact(parents, draft_tokens, draft_probs, target_probs, *, generator):
    """Medusa's typical acceptance (accept x when p(x) > min(ε, δ·exp(−H(p))), then sample from p)
    presented as an exact tree verifier."""
    return _verify_tree(parents, draft_tokens, draft_probs, target_probs, generator,
                        _Typical(TYPICAL_EPSILON, TYPICAL_DELTA))


def implementations():
    """The known-bad tree verifiers."""
    from inference_conformance.conformance.registry import known_bad

    bugs = {
        "unrenormalised_sibling_residual": unrenormalised_sibling_residual,
        "sibling_tested_against_p": sibling_tested_against_p,
        "correction_from_q": correction_from_q,
        "bonus_from_deepest_node": bonus_from_deepest_node,
        "acceptance_times_097": acceptance_times_097,
        "typical_acceptance_as_exact": typical_acceptance_as_exact,
        "float32_unrenormalised_residual": float32_unrenormalised_residual,
        "accepts_at_boundary": accepts_at_boundary,
    }
    return tuple(known_bad("speculative_tree", name, fn) for name, fn in bugs.items())


# ------------------------------------------------ outside the contract: the engine's tree forward
def flattened_positions():
    """The engine's tree forward with the right tree mask but RoPE positions from each node's index
    in the flattened tree (L_b + i) instead of its depth (L_b − 1 + depth(i)); the class, built on
    demand (the engine imports the model code)."""
    from inference_conformance.optimized.speculative_tree.engine import TreeCachedModel

    class FlattenedPositions(TreeCachedModel):
        def node_positions(self, lengths, depth):
            return lengths[:, None] + torch.arange(depth.shape[0], device=depth.device)[None]

    return FlattenedPositions


#: Known-bad tree forwards of the engine (SD-10 through the model), by name: a function returning
#: the :class:`~inference_conformance.optimized.speculative_tree.engine.TreeCachedModel` subclass.
#: The known-bad tree attention implementations are the ``tree_attention`` contract's zoo
#: (``properties/tree_attention/zoo.py``).
TREE_MODEL_ZOO = {"flattened_positions": flattened_positions}


def _engine_zoo():
    from inference_conformance.optimized.speculative_tree.engine import TreeSpeculativeEngine

    class RejectedBranchKVKept(TreeSpeculativeEngine):
        """Drops the rejected branches by shrinking the length only: the slots after the pending
        token keep the first nodes in flattened order, not the accepted path's."""

        def _keep(self, start, nodes):
            self.target.rollback(torch.tensor([start + len(nodes)]))

    return {"rejected_branch_kv_kept": RejectedBranchKVKept}


def engine_zoo() -> dict:
    """Known-bad tree engines (SD-12 and the cache check), by name (classes built on demand: the
    engine imports the model code)."""
    return _engine_zoo()
