"""A worked outside implementation of the ``tree_attention`` contract, written from its docs page
(docs/tree_attention.md) alone, in plain PyTorch: the contract's ``validate`` for the argument
checks, then per sequence one score matrix over the prefix and the tree, masked by each node's
ancestors found by walking ``parents``. ``tree_attention`` conforms; ``wrong_tree_attention``
builds the mask from the flattened node index (node i sees every node j <= i), the public bug of
tree-speculation kernels, which SD-10 rejects.

    CI=true PYTHONPATH=examples pytest -n 1 properties --impl tree_attention=my_tree_attention:tree_attention
"""
from __future__ import annotations

import torch

from inference_conformance.conformance.contracts.tree_attention import validate


def _sees(parents: list[int], flattened: bool) -> torch.Tensor:
    """(n, n) bool: [i, j] True where node i may attend node j."""
    n = len(parents)
    sees = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        if flattened:
            sees[i, :i + 1] = True            # the bug: every node before i in the flattened order
            continue
        j = i
        while j >= 0:                         # i itself, then its ancestors
            sees[i, j] = True
            j = parents[j]
    return sees


def _tree_attention(q, k_cache, v_cache, parents, prefix_lens, scale, flattened):
    validate(q, k_cache, v_cache, parents, prefix_lens, scale)
    B, Hq, n, D = q.shape
    group = Hq // k_cache.shape[1]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    sees = _sees([int(p) for p in parents.tolist()], flattened).to(q.device)
    out = torch.empty_like(q)
    for b, S in enumerate(int(s) for s in prefix_lens.tolist()):
        keys = k_cache[b, :, :S + n].to(acc).repeat_interleave(group, dim=0)       # (Hq, S + n, D)
        values = v_cache[b, :, :S + n].to(acc).repeat_interleave(group, dim=0)
        scores = (q[b].to(acc) @ keys.transpose(-1, -2)) * float(scale)           # (Hq, n, S + n)
        visible = torch.cat([torch.ones(n, S, dtype=torch.bool, device=q.device), sees], dim=1)
        scores = scores.masked_fill(~visible, float("-inf"))
        out[b] = (torch.softmax(scores, dim=-1) @ values).to(q.dtype)
    return out


def tree_attention(q, k_cache, v_cache, parents, prefix_lens, *, scale):
    """Each node over its sequence's prefix, its ancestors and itself."""
    return _tree_attention(q, k_cache, v_cache, parents, prefix_lens, scale, flattened=False)


def wrong_tree_attention(q, k_cache, v_cache, parents, prefix_lens, *, scale):
    """The same with the mask from the flattened index: node i also sees its earlier siblings,
    cousins and their subtrees."""
    return _tree_attention(q, k_cache, v_cache, parents, prefix_lens, scale, flattened=True)
