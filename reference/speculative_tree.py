"""Token-tree speculation, the naive float64 reference (SpecInfer, Miao et al. 2024; lecture 002 §6.6).

- :func:`verify_tree`: the ``speculative_tree`` contract's recursive rejection sampling, one row
  and one node at a time, in float64 on the host, all randomness from ``generator``.
- :func:`verify_tree_greedy`: the greedy variant (SD-12): follow the child whose token is the
  target's argmax, then emit the argmax.
- :func:`tree_outcomes`: the exact enumerator extended to trees: the probability of every
  emitted sequence of one round, summed over the draft's tokens (each node drawn from its
  parent's q) and every accept/reject path; the rule is a parameter (:class:`Rule`), so that the
  same walk gives SpecInfer's exact rule, the zoo's biased ones and Medusa's typical acceptance.
- :func:`completed_distribution`, :func:`target_distribution`: a round's emitted tokens completed
  to a fixed length by sampling the target, and the target's own distribution of that length
  (SD-11: they are equal; SD-13: typical acceptance's total-variation distance between them).
- :func:`path_logits`: SD-10's oracle through the model, each root-to-node path run alone (the
  tree's attention itself is the ``tree_attention`` technique: ``reference/tree_attention.py``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from inference_conformance.conformance.contracts.speculative_tree import PAD, children, depths, validate
from inference_conformance.reference.speculative import _sample


# ------------------------------------------------------------------------ the verifier
def verify_tree(parents, draft_tokens, draft_probs, target_probs, *, generator):
    """The ``speculative_tree`` contract (``conformance/contracts/speculative_tree.py``), naively.

    Per row b: at the current node u (the root first) with residual r = p(u), for each child c in
    index order take node c's uniform s (one U[0, 1) per node and one for the emitted token, drawn
    up front) and accept c's token x iff s < r(x) / q_u(x); on rejection
    r <- norm(max(0, r - q_u)). Every child rejected: emit from r; u a leaf: emit from p(u).
    Returns (tokens (B, depth+1), path (B, depth)) int64 on the inputs' device.
    """
    shape = validate(parents, draft_tokens, draft_probs, target_probs, generator)
    kids = children(parents.tolist())
    tok = draft_tokens.detach().cpu().tolist()
    q = draft_probs.detach().cpu().double().numpy()
    p = target_probs.detach().cpu().double().numpy()
    dev = draft_tokens.device
    tokens = torch.full((shape.B, shape.depth + 1), PAD, dtype=torch.int64)
    path = torch.full((shape.B, shape.depth), PAD, dtype=torch.int64)

    uniforms = torch.rand((shape.B, shape.n_nodes + 1), generator=generator, dtype=torch.float64,
                          device=dev).cpu().tolist()
    for b in range(shape.B):
        u, r, n = -1, p[b, 0].copy(), 0
        while True:
            moved = False
            for c in kids[u + 1]:
                x, qu = tok[b][c], q[b, u + 1]
                if uniforms[b][c] * qu[x] < r[x]:
                    tokens[b, n], path[b, n] = x, c
                    u, r, n, moved = c, p[b, c + 1].copy(), n + 1, True
                    break
                res = np.maximum(r - qu, 0.0)
                if res.sum() > 0:
                    r = res / res.sum()
            if not moved:
                break
        tokens[b, n] = _sample(list(r), uniforms[b][-1])
    return tokens.to(dev), path.to(dev)


def verify_tree_greedy(parents, draft_tokens, target_probs):
    """Greedy tree verification (SD-12): from the root, move to the first child whose token is the
    argmax of p at the current node, while there is one; then emit that argmax. ``parents``
    (n_nodes,), ``draft_tokens`` (B, n_nodes) int64, ``target_probs`` (B, n_nodes+1, V) (or logits:
    only the argmax is read). Returns (tokens (B, depth+1), path (B, depth)) int64, −1 padded."""
    kids = children(parents.tolist())
    depth = max(depths(parents.tolist()))
    B = draft_tokens.shape[0]
    best = target_probs.argmax(-1).cpu().tolist()                    # (B, n_nodes+1)
    tok = draft_tokens.cpu().tolist()
    tokens = torch.full((B, depth + 1), PAD, dtype=torch.int64)
    path = torch.full((B, depth), PAD, dtype=torch.int64)
    for b in range(B):
        u, n = -1, 0
        while True:
            nxt = next((c for c in kids[u + 1] if tok[b][c] == best[b][u + 1]), None)
            if nxt is None:
                break
            tokens[b, n], path[b, n] = tok[b][nxt], nxt
            u, n = nxt, n + 1
        tokens[b, n] = best[b][u + 1]
    return tokens.to(draft_tokens.device), path.to(draft_tokens.device)


# ------------------------------------------------------------------------ the enumerator
@dataclass(frozen=True)
class Rule:
    """An accept/reject rule for :func:`tree_outcomes`.

    ``accept(r, q, p, x)``: probability of accepting a child with token x, given the residual r,
    the parent's draft row q and the parent's target row p (float64 arrays (V,)). ``update(r, q,
    p)``: the residual after a rejected sibling (None: keep r). ``emit(r, q, p)``: the weights the
    correction is drawn from when every child is rejected (normalised by the walk). The default is
    SpecInfer's exact rule."""

    name: str
    accept: Callable
    update: Callable | None
    emit: Callable


def _norm_residual(r, q, p):
    res = np.maximum(r - q, 0.0)
    return res / res.sum() if res.sum() > 0 else r


#: SpecInfer's recursive rejection sampling (SD-11).
EXACT = Rule("recursive rejection (exact)",
             accept=lambda r, q, p, x: min(1.0, r[x] / q[x]),
             update=_norm_residual,
             emit=lambda r, q, p: r)


def scaled_acceptance(scale: float) -> Rule:
    """The exact rule with every acceptance probability multiplied by ``scale`` (a biased
    verifier, for the statistical law's power)."""
    return Rule(f"acceptance x {scale:g}", accept=lambda r, q, p, x: scale * min(1.0, r[x] / q[x]),
                update=_norm_residual, emit=lambda r, q, p: r)


def entropy(p) -> float:
    """H(p) in nats (0 log 0 = 0)."""
    p = np.asarray(p, np.float64)
    nz = p[p > 0]
    return float(-(nz * np.log(nz)).sum())


def typical_threshold(p, epsilon: float, delta: float) -> float:
    """Medusa's typical-acceptance threshold min(ε, δ·exp(−H(p))) (Cai et al. 2024, §2.3.1)."""
    return min(epsilon, delta * math.exp(-entropy(p)))


def typical_acceptance(epsilon: float, delta: float) -> Rule:
    """Medusa's typical acceptance: accept x when p(x) > min(ε, δ·exp(−H(p))) (deterministic);
    when every child is rejected the token is drawn from p itself. Not exact (SD-13)."""
    return Rule(f"typical acceptance (epsilon={epsilon:g}, delta={delta:g})",
                accept=lambda r, q, p, x: 1.0 if p[x] > typical_threshold(p, epsilon, delta) else 0.0,
                update=None, emit=lambda r, q, p: p)


def tree_outcomes(parents, q_fn, p_fn, V: int, rule: Rule = EXACT) -> dict[tuple, float]:
    """The exact distribution of one round's emitted tokens, {sequence: probability}, float64.

    ``parents``: the tree (the contract's parent pointers); ``q_fn(prefix)``, ``p_fn(prefix)``:
    the draft's and the target's distributions (V,) after the token tuple ``prefix`` (the tokens
    of the path from the root; () at the root). Each node's token is drawn from its parent's
    q_fn; a node is visited only when its parent was accepted and its earlier siblings rejected,
    so the walk sums over the visited nodes' tokens only (the others are independent draws).
    Exponential in depth; meant for V <= 4 and a handful of nodes.
    """
    kids = children(parents)
    out: dict[tuple, float] = {}

    def emit(prefix, w, prob):
        w = np.asarray(w, np.float64)
        w = w / w.sum()
        for y in range(V):
            if w[y] > 0:
                out[prefix + (y,)] = out.get(prefix + (y,), 0.0) + prob * w[y]

    def walk(u, prefix, prob):
        p = np.asarray(p_fn(prefix), np.float64)
        q = np.asarray(q_fn(prefix), np.float64)
        r = p.copy()
        for c in kids[u + 1]:
            rejected = 0.0
            for x in range(V):
                if q[x] > 0:
                    a = rule.accept(r, q, p, x)
                    if a > 0:
                        walk(c, prefix + (x,), prob * q[x] * a)
                    rejected += q[x] * (1.0 - a)
            prob *= rejected
            if prob <= 0:
                return
            if rule.update is not None:
                r = rule.update(r, q, p)
        emit(prefix, rule.emit(r, q, p) if kids[u + 1] else p, prob)

    walk(-1, (), 1.0)
    return out


def completed_distribution(outcomes: dict[tuple, float], p_fn, V: int, length: int) -> np.ndarray:
    """(V,)*length: the round's emitted tokens, completed to ``length`` tokens by sampling the
    target's p_fn (what the next rounds emit when they are exact), float64."""
    out = np.zeros((V,) * length)

    def extend(seq, prob):
        if len(seq) == length:
            out[seq] += prob
            return
        p = np.asarray(p_fn(seq), np.float64)
        for y in range(V):
            if p[y] > 0:
                extend(seq + (y,), prob * p[y])

    for seq, prob in outcomes.items():
        extend(seq[:length], prob)
    return out


def target_distribution(p_fn, V: int, length: int) -> np.ndarray:
    """(V,)*length: the target's own distribution of its next ``length`` tokens."""
    return completed_distribution({(): 1.0}, p_fn, V, length)


def tree_total_variation(parents, q_fn, p_fn, V: int, rule: Rule) -> float:
    """Total-variation distance between the round under ``rule`` (completed by the target) and
    the target's own distribution over depth + 1 tokens (SD-13's figure; 0 for an exact rule)."""
    L = max(depths(parents)) + 1
    got = completed_distribution(tree_outcomes(parents, q_fn, p_fn, V, rule), p_fn, V, L)
    return 0.5 * float(np.abs(got - target_distribution(p_fn, V, L)).sum())


# ----------------------------------------------------------------- tree attention (SD-10)
@torch.no_grad()
def path_logits(model, prefix: torch.Tensor, parents, tree_tokens: torch.Tensor) -> torch.Tensor:
    """SD-10's oracle: for each node, the logits of running its root-to-node path alone after the
    prefix (one causal forward per node, no cache). Returns (B, n_nodes, V)."""
    par = [int(x) for x in parents]
    out = []
    for i in range(len(par)):
        chain, j = [], i
        while j >= 0:
            chain.append(j)
            j = par[j]
        seq = torch.cat([prefix, tree_tokens[:, chain[::-1]]], 1)
        out.append(model(seq)[:, -1])
    return torch.stack(out, 1)


def implementations():
    """The tree verifier reference (one row and one node at a time)."""
    from inference_conformance.conformance.registry import builtin

    return (builtin("speculative_tree", "reference", verify_tree),)
