"""Known-bad token-tree verifiers (the bug zoo of the ``speculative_tree`` contract): each is a
realistic mistake in recursive rejection sampling or in typical acceptance presented as exact,
and the statistical SD-11 law (``properties/test_speculative_tree.py``) must reject every one
under the ``ci`` profile.

All follow the contract's signature, validate like a correct verifier, compute in float64 and take
their randomness from ``generator``, so that only the bug makes them wrong. The known-bad tree
scorers and engines of SD-10 / SD-12 (outside this contract) are in :data:`TREE_SCORER_ZOO`.
"""
from __future__ import annotations

import math

import torch

from inference_conformance.conformance.contracts.speculative_tree import PAD, children, depths, validate


def _verify_tree(parents, draft_tokens, draft_probs, target_probs, generator, *, accept_scale=1.0,
                 unnormalised=False, sibling_vs_p=False, correction_from_q=False, bonus_deepest=False,
                 typical=None):
    validate(parents, draft_tokens, draft_probs, target_probs, generator)
    par = [int(x) for x in parents.tolist()]
    kids, dep = children(par), depths(par)
    depth = max(dep)
    B, n = draft_tokens.shape
    dev = draft_tokens.device
    q = draft_probs.to(torch.float64)
    p = target_probs.to(torch.float64)
    u = torch.rand((B, n), generator=generator, dtype=torch.float64, device=dev)
    cur = torch.full((B,), -1, dtype=torch.int64, device=dev)
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    r = p[:, 0].clone()
    path = torch.full((B, depth), PAD, dtype=torch.int64, device=dev)
    tokens = torch.full((B, depth + 1), PAD, dtype=torch.int64, device=dev)
    deepest = max(range(n), key=lambda i: (dep[i], i))
    for i, pi in enumerate(par):
        tried = ~done & (cur == pi)
        q_u, p_u = q[:, pi + 1], p[:, pi + 1]
        x = draft_tokens[:, i]
        q_x = q_u.gather(1, x[:, None])[:, 0]
        test_row = p_u if sibling_vs_p else r
        r_x = test_row.gather(1, x[:, None])[:, 0]
        if typical is not None:          # Medusa: p(x) > min(eps, delta exp(-H(p))), deterministic
            eps, delta = typical
            h = -(p_u * torch.log(p_u.clamp_min(1e-300))).sum(-1)
            acc = tried & (p_u.gather(1, x[:, None])[:, 0] > torch.clamp(delta * torch.exp(-h), max=eps))
        else:
            acc = tried & (u[:, i] * q_x < accept_scale * torch.minimum(q_x, r_x))
        rej = tried & ~acc
        res = (r - q_u).clamp_min(0.0)
        mass = res.sum(-1, keepdim=True)
        res = torch.where(mass > 0, res if unnormalised else res / mass.clamp_min(1e-300), r)
        if typical is not None:
            res = p_u
        r = torch.where(acc[:, None], p[:, i + 1], torch.where(rej[:, None], res, r))
        if correction_from_q:
            r = torch.where(rej[:, None] & (kids[pi + 1][-1] == i), q_u, r)
        if bonus_deepest and not kids[i + 1]:
            r = torch.where(acc[:, None], p[:, deepest + 1], r)
        cur = torch.where(acc, torch.full_like(cur, i), cur)
        path[:, dep[i] - 1] = torch.where(acc, i, path[:, dep[i] - 1])
        tokens[:, dep[i] - 1] = torch.where(acc, x, tokens[:, dep[i] - 1])
        done = done | (acc & (not kids[i + 1])) | (rej & (kids[pi + 1][-1] == i))
    n_acc = (path >= 0).sum(-1)
    emitted = torch.multinomial(r, 1, generator=generator)[:, 0]
    tokens.scatter_(1, n_acc[:, None], emitted[:, None])
    return tokens, path


def unrenormalised_sibling_residual(parents, draft_tokens, draft_probs, target_probs, *, generator):
    """After a rejected sibling the residual max(0, r − q) is not renormalised: the next sibling's
    acceptance min(1, r(x)/q(x)) reads an unnormalised r."""
    return _verify_tree(parents, draft_tokens, draft_probs, target_probs, generator, unnormalised=True)


def sibling_tested_against_p(parents, draft_tokens, draft_probs, target_probs, *, generator):
    """Every sibling is tested against the target's p, not the residual updated by the rejected
    siblings before it."""
    return _verify_tree(parents, draft_tokens, draft_probs, target_probs, generator, sibling_vs_p=True)


def correction_from_q(parents, draft_tokens, draft_probs, target_probs, *, generator):
    """When every sibling is rejected the token is drawn from the draft's q instead of the updated
    residual."""
    return _verify_tree(parents, draft_tokens, draft_probs, target_probs, generator, correction_from_q=True)


def bonus_from_deepest_node(parents, draft_tokens, draft_probs, target_probs, *, generator):
    """At an accepted leaf the bonus token is drawn from the target's row of the deepest node of the
    tree (the last one flattened), which belongs to another branch."""
    return _verify_tree(parents, draft_tokens, draft_probs, target_probs, generator, bonus_deepest=True)


def acceptance_times_097(parents, draft_tokens, draft_probs, target_probs, *, generator):
    """Every acceptance probability is 0.97 min(1, r/q): a few percent of bias, for the law's power."""
    return _verify_tree(parents, draft_tokens, draft_probs, target_probs, generator, accept_scale=0.97)


#: Medusa's defaults for its typical acceptance (Cai et al. 2024: ε = 0.09, δ = sqrt(ε) = 0.3).
TYPICAL_EPSILON, TYPICAL_DELTA = 0.09, math.sqrt(0.09)


def typical_acceptance_as_exact(parents, draft_tokens, draft_probs, target_probs, *, generator):
    """Medusa's typical acceptance (accept x when p(x) > min(ε, δ·exp(−H(p))), then sample from p)
    presented as an exact tree verifier."""
    return _verify_tree(parents, draft_tokens, draft_probs, target_probs, generator,
                        typical=(TYPICAL_EPSILON, TYPICAL_DELTA))


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
    }
    return tuple(known_bad("speculative_tree", name, fn) for name, fn in bugs.items())


# ------------------------------------------------ outside the contract: tree scorers and engines
def siblings_see_each_other(model, prefix, parents, tree_tokens):
    """Tree attention with a causal mask over the flattened tree: every node also sees the nodes
    before it in index order, its siblings and their subtrees included."""
    from inference_conformance.reference.speculative_tree import TreeAttention, tree_positions

    B, S = prefix.shape
    n = len(parents)
    att = TreeAttention(parents, S)
    att.mask[S:, S:] = torch.ones(n, n, dtype=torch.bool).tril()
    positions = torch.cat([torch.arange(S), tree_positions(parents, S)]).expand(B, -1)
    with torch.no_grad():
        return model(torch.cat([prefix, tree_tokens], 1), positions, att)[:, S:]


def flattened_positions(model, prefix, parents, tree_tokens):
    """The right tree mask, but RoPE positions from the node's index in the flattened tree
    (S + i) instead of its depth (S − 1 + depth)."""
    from inference_conformance.reference.speculative_tree import TreeAttention

    B, S = prefix.shape
    n = len(parents)
    positions = torch.arange(S + n).expand(B, -1)
    with torch.no_grad():
        return model(torch.cat([prefix, tree_tokens], 1), positions, TreeAttention(parents, S))[:, S:]


#: Known-bad tree scorers (SD-10): ``scorer(model, prefix (B, S), parents, tree_tokens (B, n))``.
TREE_SCORER_ZOO = {"siblings_see_each_other": siblings_see_each_other, "flattened_positions": flattened_positions}


def _engine_zoo():
    from inference_conformance.optimized.speculative_engine import TreeSpeculativeEngine

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
