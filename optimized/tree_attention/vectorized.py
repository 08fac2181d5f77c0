"""The "torch" built-in of the ``tree_attention`` contract: one masked attention per sequence over
its prefix and tree (claim SD-10).

The ancestor relation of the whole tree is built once as an (n_nodes, n_nodes) bool matrix by
depth steps of ``cur = parents[cur]`` on a tensor (no loop over nodes); each sequence's mask is
the prefix's columns (all visible) beside it, and the sequence's queries attend over slots
[0, prefix_lens[b] + n_nodes) of its cache through the suite's attention core
(:func:`inference_conformance.reference.attention.masked_attention`, GQA by head groups), in
float64 for float64 inputs and float32 otherwise, rounded once to q's dtype.
"""
from __future__ import annotations

import torch

from inference_conformance.conformance.contracts.tree_attention import validate
from inference_conformance.reference.attention import masked_attention


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """(n_nodes, n_nodes) bool: [i, j] is True where node j is node i or one of its ancestors
    (``parents`` (n_nodes,) int, topological)."""
    n = parents.shape[0]
    par = parents.to(torch.int64)
    nodes = torch.arange(n, device=parents.device)
    seen = nodes[:, None] == nodes[None, :]
    cur = nodes.clone()
    for _ in range(n):
        live = cur >= 0
        if not bool(live.any()):
            break
        cur = torch.where(live, par[cur.clamp_min(0)], cur)
        seen |= (cur[:, None] == nodes[None, :]) & (cur[:, None] >= 0)
    return seen


def tree_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, parents: torch.Tensor,
                   prefix_lens: torch.Tensor, *, scale: float) -> torch.Tensor:
    """The ``tree_attention`` contract by a masked attention per sequence: shapes as the contract's;
    returns (B, Hq, n_nodes, D) in q's dtype. Raises as its ``validate``."""
    shape = validate(q, k_cache, v_cache, parents, prefix_lens, scale)
    n = shape.n_nodes
    tree = ancestor_mask(parents.to(q.device))
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = torch.empty_like(q)
    for b, S in enumerate(prefix_lens.tolist()):
        mask = torch.cat([torch.ones(n, S, dtype=torch.bool, device=q.device), tree], 1)
        k, v = k_cache[b, :, :S + n].to(acc), v_cache[b, :, :S + n].to(acc)
        out[b] = masked_attention(q[b].to(acc), k, v, scale=float(scale), mask=mask).to(q.dtype)
    return out
