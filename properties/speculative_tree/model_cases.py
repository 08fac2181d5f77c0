"""SD-10 through the model (the law is in ``laws.py``): the shipped target, a tree forward over
its cache scored by a ``tree_attention`` implementation against each root-to-node path run alone,
and the trees and prefixes it runs on."""
from __future__ import annotations

from functools import lru_cache

import torch

from inference_conformance.conformance.contracts.speculative_tree import SHAPES
from inference_conformance.conformance.tolerance import assert_close
from inference_conformance.reference.speculative_tree import path_logits


@lru_cache(maxsize=None)
def shipped_model(name: str, dtype: torch.dtype):
    """The small world's shipped model ``name`` in ``dtype`` (loaded once)."""
    from inference_conformance.smallworld.checkpoints import load_model

    return load_model(name, dtype)


def sd10_through_the_model(attention, dtype, cases, model_cls=None, device: str = "cpu"):
    """SD-10 on the shipped target: each node's logits from the engine's one tree forward (prefill
    the prefix, then the tree over the cache on ``device``, scored by the tree_attention
    implementation ``attention``; ``model_cls``: the engine's cached model, a known-bad one in its
    zoo test) equal those of its root-to-node path run alone (float64 reference on the CPU, in
    the same dtype's rule)."""
    from inference_conformance.optimized.speculative_tree.engine import TreeCachedModel
    from inference_conformance.smallworld.checkpoints import load_model

    model = shipped_model("target", dtype) if device == "cpu" else load_model("target", dtype, device)
    oracle = shipped_model("target", torch.float64)
    for shape, S, seed in cases:
        prefix, parents, tokens = model_tree_inputs(shape, S, seed)
        m = (model_cls or TreeCachedModel)(model, prefix.shape[0], 64)
        m.attention = attention
        m.nan_fill = True
        m.start(prefix.shape[0])
        m.extend(prefix.to(device), torch.full((prefix.shape[0],), S, dtype=torch.int64))
        out = m.tree_forward(tokens.to(device), torch.tensor(parents, dtype=torch.int64))
        out_ref = path_logits(oracle, prefix, parents, tokens)
        assert_close(out.cpu(), out_ref, what=f"SD-10 {shape} tree after a {S}-token prefix: node logits vs each "
                                              f"root-to-node path alone")


def model_tree_inputs(shape: str, S: int, seed: int, B: int = 2):
    g = torch.Generator().manual_seed(seed)
    parents = list(SHAPES[shape])
    prefix = torch.randint(4, 294, (B, S), generator=g)
    tokens = torch.randint(4, 294, (B, len(parents)), generator=g)
    return prefix, parents, tokens


#: Trees and prefix lengths: every shape (siblings, chains, a wide root), a one-token prefix and
#: prefixes across the kernel's 16-key tiles; an interpreted kernel gets two of them.
SD10_CASES = (("binary", 5, 1), ("three-drafts", 17, 2), ("wide-root", 1, 3), ("chain", 32, 4))
SD10_INTERPRETED = (("wide-root", 17, 3), ("binary", 1, 1))
