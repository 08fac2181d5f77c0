"""Known-bad tree attention implementations (the bug zoo of the ``tree_attention`` contract): each is
a realistic mistake in a tree-attention kernel or its host code, and SD-10's attention-level law
(``properties/tree_attention/cases.py``) must reject every one under the ``ci`` profile; the mask
bugs are also rejected through the model (SD-10 on the shipped target,
``properties/speculative_tree/test_speculative_tree_engine.py``).

All follow the contract's signature, validate like a correct implementation and compute through
the torch built-in's pieces (its ancestor mask, the attention core) in float64 for float64 inputs
and float32 otherwise, so that only the bug makes them wrong.
"""
from __future__ import annotations

import torch

from inference_conformance.conformance.contracts.tree_attention import validate
from inference_conformance.optimized.tree_attention.vectorized import ancestor_mask
from inference_conformance.reference.attention import masked_attention


def _attend(q, k_cache, v_cache, parents, prefix_lens, scale, *, tree=None, prefix_cols: int = 0,
            lens=None, kv_heads=None):
    """The torch built-in's computation with one piece replaced: ``tree`` the (n, n) mask among the
    nodes; ``prefix_cols`` more slots counted as the prefix for every node; ``lens`` the prefix
    lengths used (a list); ``kv_heads`` the KV head each query head reads (a list)."""
    shape = validate(q, k_cache, v_cache, parents, prefix_lens, scale)
    n = shape.n_nodes
    tree = ancestor_mask(parents) if tree is None else tree
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    lens = prefix_lens.tolist() if lens is None else lens
    out = torch.empty_like(q)
    for b, S in enumerate(lens):
        S = min(int(S), shape.S_max - n)
        mask = torch.cat([torch.ones(n, S, dtype=torch.bool), tree.cpu()], 1).to(q.device)
        mask[:, :S + prefix_cols] = True
        k, v = k_cache[b, :, :S + n].to(acc), v_cache[b, :, :S + n].to(acc)
        if kv_heads is not None:
            k, v = k[kv_heads], v[kv_heads]
        out[b] = masked_attention(q[b].to(acc), k, v, scale=float(scale), mask=mask).to(q.dtype)
    return out


def flattened_index_mask(q, k_cache, v_cache, parents, prefix_lens, *, scale):
    """The tree mask built from the flattened node index: node i sees every node j <= i (a causal
    mask over the flattened tree), so siblings, cousins and their subtrees before it leak in (the
    public bug of tree-speculation kernels)."""
    n = q.shape[2] if isinstance(q, torch.Tensor) and q.dim() == 4 else 1
    return _attend(q, k_cache, v_cache, parents, prefix_lens, scale,
                   tree=torch.ones(n, n, dtype=torch.bool).tril())


def node_misses_itself(q, k_cache, v_cache, parents, prefix_lens, *, scale):
    """Each node sees its ancestors but not its own key (the ancestor walk starts at the parent)."""
    n = q.shape[2] if isinstance(q, torch.Tensor) and q.dim() == 4 else 1
    tree = ancestor_mask(parents) & ~torch.eye(n, dtype=torch.bool, device=parents.device)
    return _attend(q, k_cache, v_cache, parents, prefix_lens, scale, tree=tree)


def sibling_leak(q, k_cache, v_cache, parents, prefix_lens, *, scale):
    """Each node also sees its earlier siblings (the nodes before it with the same parent), as a
    mask built level by level instead of by ancestry would."""
    tree = ancestor_mask(parents)
    par = parents.tolist()
    for i, p in enumerate(par):
        for j in range(i):
            if par[j] == p:
                tree[i, j] = True
    return _attend(q, k_cache, v_cache, parents, prefix_lens, scale, tree=tree)


def prefix_mask_off_by_one(q, k_cache, v_cache, parents, prefix_lens, *, scale):
    """The prefix visible up to slot prefix_lens[b] included (<= for <): the first node's key counts
    as a cached token for every node."""
    return _attend(q, k_cache, v_cache, parents, prefix_lens, scale, prefix_cols=1)


def kv_head_modulo_not_grouped(q, k_cache, v_cache, parents, prefix_lens, *, scale):
    """GQA by query head h reading KV head h % Hkv (interleaved) instead of h // (Hq / Hkv)
    (grouped, the contract's layout)."""
    Hq, Hkv = q.shape[1], k_cache.shape[1]
    return _attend(q, k_cache, v_cache, parents, prefix_lens, scale, kv_heads=[h % Hkv for h in range(Hq)])


def one_prefix_len_for_the_batch(q, k_cache, v_cache, parents, prefix_lens, *, scale):
    """Every sequence's tree placed after sequence 0's prefix length (the lengths read without the
    batch index), clamped into the cache."""
    B = q.shape[0]
    return _attend(q, k_cache, v_cache, parents, prefix_lens, scale, lens=[int(prefix_lens[0])] * B)


def _walk_mask(parents, keep) -> torch.Tensor:
    """(n, n) ancestor mask of a walk up the parent chain from each node i (itself included)
    that stops where ``keep(i, step, node)`` is False."""
    par = parents.tolist()
    n = len(par)
    tree = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        cur, step = i, 0
        while cur >= 0 and keep(i, step, cur):
            tree[i, cur] = True
            cur, step = par[cur], step + 1
    return tree.to(parents.device)


def ancestor_walk_depth_5(q, k_cache, v_cache, parents, prefix_lens, *, scale):
    """The ancestor walk unrolled for a fixed depth of 5 steps (a kernel's loop count fixed at
    compile time): a node deeper than 5 misses its oldest ancestors."""
    return _attend(q, k_cache, v_cache, parents, prefix_lens, scale,
                   tree=_walk_mask(parents, lambda i, step, cur: step <= 5))


def ancestors_within_tile_of_16(q, k_cache, v_cache, parents, prefix_lens, *, scale):
    """The ancestor mask built per tile of 16 nodes (a kernel that loads one node tile's parents):
    an ancestor in an earlier tile is missed, as is everything above it."""
    return _attend(q, k_cache, v_cache, parents, prefix_lens, scale,
                   tree=_walk_mask(parents, lambda i, step, cur: cur // 16 == i // 16))


def implementations():
    """The known-bad tree attention implementations: SD-10's laws name each in their ``kills``."""
    from inference_conformance.conformance.registry import known_bad

    return (
        known_bad("tree_attention", "flattened_index_mask", flattened_index_mask),
        known_bad("tree_attention", "node_misses_itself", node_misses_itself),
        known_bad("tree_attention", "sibling_leak", sibling_leak),
        known_bad("tree_attention", "prefix_mask_off_by_one", prefix_mask_off_by_one),
        known_bad("tree_attention", "kv_head_modulo_not_grouped", kv_head_modulo_not_grouped),
        known_bad("tree_attention", "one_prefix_len_for_the_batch", one_prefix_len_for_the_batch),
        known_bad("tree_attention", "ancestor_walk_depth_5", ancestor_walk_depth_5),
        known_bad("tree_attention", "ancestors_within_tile_of_16", ancestors_within_tile_of_16),
    )
