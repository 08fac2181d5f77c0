"""The float64 reference of the ``tree_attention`` contract (claim SD-10): every node attends over
its sequence's cached prefix followed by its own root-to-node path, gathered alone, as if that
path were the only continuation of the prefix. No tree mask is built.

For each sequence b and node i: the keys and values are the prefix's slots [0, prefix_lens[b])
and the slots prefix_lens[b] + j of the nodes j on the path from the root level to i (i last);
node i's query of every head attends over them through the one attention core,
:func:`inference_conformance.reference.attention.masked_attention` (GQA by head groups).
"""
from __future__ import annotations

import torch

from inference_conformance.conformance.contracts.tree_attention import ancestors, validate
from inference_conformance.reference.attention import masked_attention


def tree_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, parents: torch.Tensor,
                   prefix_lens: torch.Tensor, *, scale: float) -> torch.Tensor:
    """Each node over the prefix and its root-to-node path alone: q (B, Hq, n_nodes, D), k_cache,
    v_cache (B, Hkv, S_max, D), parents (n_nodes,), prefix_lens (B,) -> (B, Hq, n_nodes, D) in
    q's dtype, computed in float64. Raises as
    :func:`inference_conformance.conformance.contracts.tree_attention.validate`."""
    shape = validate(q, k_cache, v_cache, parents, prefix_lens, scale)
    par = parents.tolist()
    out = torch.empty(shape.B, shape.Hq, shape.n_nodes, shape.D, dtype=torch.float64, device=q.device)
    for b in range(shape.B):
        S = int(prefix_lens[b])
        for i in range(shape.n_nodes):
            slots = list(range(S)) + [S + j for j in ancestors(par, i)]
            idx = torch.tensor(slots, dtype=torch.int64, device=q.device)
            k = k_cache[b].index_select(1, idx).to(torch.float64)              # (Hkv, S + depth, D)
            v = v_cache[b].index_select(1, idx).to(torch.float64)
            out[b, :, i] = masked_attention(q[b, :, i:i + 1].to(torch.float64), k, v, scale=float(scale))[:, 0]
    return out.to(q.dtype)


def implementations():
    """The float64 reference of the tree_attention contract (each path alone)."""
    from inference_conformance.conformance.registry import builtin

    return (builtin("tree_attention", "reference", tree_attention, batch_invariant=True),)
