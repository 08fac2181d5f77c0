"""Batched token-tree verification on the device, in vectorized PyTorch (SpecInfer's recursive
rejection sampling; lecture 002 §6.6).

One pass over the nodes in index order, each step a fixed set of tensor operations over the whole
batch: a node is tried in row b when its parent is row b's current node and row b is still
walking; acceptance u · q(x) < r(x) moves the row to the node (r = p(node)), a rejection replaces
the residual by norm(max(0, r − q)); a row stops at a leaf it accepted or after its current
node's last child was rejected. Parent pointers are topologically ordered, so a node's children
come after it and its later siblings are skipped once a row has moved. One draw of (B, n_nodes)
uniforms, one ``torch.multinomial`` for the emitted tokens; float64 throughout, no host round
trip per node (the host reads the inputs only in the contract's ``validate``, and the tree shape).
"""
from __future__ import annotations

import torch

from inference_conformance.conformance.contracts.speculative_tree import PAD, children, depths, validate


class TreeRules:
    """The per-node rules of recursive rejection sampling, each on the whole batch at once (B rows,
    V tokens; float64): the row a node's token is tested against, the acceptance test, the
    residual after a rejection, the correction once every child of a node is rejected, and the
    row an accepted node continues from. :func:`walk_tree` applies them; a known-bad verifier
    overrides one."""

    def test_row(self, r: torch.Tensor, p_u: torch.Tensor) -> torch.Tensor:
        """The row (B, V) a node is tested against: the residual r (p_u: the parent's target row)."""
        return r

    def accept(self, u: torch.Tensor, q_x: torch.Tensor, r_x: torch.Tensor, p_u: torch.Tensor,
               x: torch.Tensor) -> torch.Tensor:
        """(B,) bool: accept token x (B,) when u · q(x) < r(x)."""
        return u * q_x < r_x

    def residual(self, r: torch.Tensor, q_u: torch.Tensor, p_u: torch.Tensor) -> torch.Tensor:
        """The residual (B, V) after a rejection: norm(max(0, r − q)); r itself where that is 0
        (r = q: unspecified)."""
        res = (r - q_u).clamp_min(0.0)
        mass = res.sum(-1, keepdim=True)
        return torch.where(mass > 0, res / mass.clamp_min(1e-300), r)

    def correction(self, r: torch.Tensor, q_u: torch.Tensor) -> torch.Tensor:
        """The row (B, V) the correction is drawn from once a node's last child is rejected: r."""
        return r

    def accepted_row(self, p: torch.Tensor, i: int, leaf: bool, dep: list) -> torch.Tensor:
        """The target row (B, V) a row continues from after accepting node i (a ``leaf`` or not;
        ``dep``: every node's depth): p[:, i + 1]."""
        return p[:, i + 1]


def walk_tree(parents, draft_tokens, draft_probs, target_probs, generator, rules: TreeRules):
    """One pass over the nodes in index order under ``rules`` (see the module docstring); inputs as
    the contract's, validated by the caller. Returns (tokens (B, depth+1), path (B, depth)) int64."""
    par = [int(x) for x in parents.tolist()]
    kids = children(par)
    dep = depths(par)
    depth = max(dep)
    B, n = draft_tokens.shape
    dev = draft_tokens.device
    q = draft_probs.to(torch.float64)
    p = target_probs.to(torch.float64)
    u = torch.rand((B, n), generator=generator, dtype=torch.float64, device=dev)
    cur = torch.full((B,), -1, dtype=torch.int64, device=dev)
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    r = p[:, 0].clone()                                                       # (B, V) residual
    path = torch.full((B, depth), PAD, dtype=torch.int64, device=dev)
    tokens = torch.full((B, depth + 1), PAD, dtype=torch.int64, device=dev)
    for i, pi in enumerate(par):
        tried = ~done & (cur == pi)
        q_u, p_u = q[:, pi + 1], p[:, pi + 1]                                 # (B, V)
        x = draft_tokens[:, i]
        q_x = q_u.gather(1, x[:, None])[:, 0]
        r_x = rules.test_row(r, p_u).gather(1, x[:, None])[:, 0]
        acc = tried & rules.accept(u[:, i], q_x, r_x, p_u, x)
        rej = tried & ~acc
        res = rules.residual(r, q_u, p_u)
        leaf = not kids[i + 1]
        last = kids[pi + 1][-1] == i
        r = torch.where(acc[:, None], rules.accepted_row(p, i, leaf, dep), torch.where(rej[:, None], res, r))
        if last:
            r = torch.where(rej[:, None], rules.correction(r, q_u), r)
        cur = torch.where(acc, torch.full_like(cur, i), cur)
        path[:, dep[i] - 1] = torch.where(acc, i, path[:, dep[i] - 1])
        tokens[:, dep[i] - 1] = torch.where(acc, x, tokens[:, dep[i] - 1])
        done = done | (acc & leaf) | (rej & last)
    n_acc = (path >= 0).sum(-1)
    emitted = torch.multinomial(r, 1, generator=generator)[:, 0]
    tokens.scatter_(1, n_acc[:, None], emitted[:, None])
    return tokens, path


#: The exact rules (SpecInfer's recursive rejection sampling).
EXACT = TreeRules()


def verify_tree(parents, draft_tokens, draft_probs, target_probs, *, generator, check: bool = True):
    """The ``speculative_tree`` contract (``conformance/contracts/speculative_tree.py``), batched.

    Returns (tokens (B, depth+1) int64, path (B, depth) int64) on the inputs' device. ``check``
    runs the contract's host-side validation first (default): TypeError/ValueError as its
    ``validate``.
    """
    if check:
        validate(parents, draft_tokens, draft_probs, target_probs, generator)
    return walk_tree(parents, draft_tokens, draft_probs, target_probs, generator, EXACT)


def implementations():
    """The batched PyTorch tree verifier."""
    from inference_conformance.conformance.registry import builtin

    return (builtin("speculative_tree", "torch", verify_tree),)
