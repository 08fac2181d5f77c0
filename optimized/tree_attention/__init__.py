"""The optimized built-ins of the ``tree_attention`` contract (claim SD-10): "triton", the tree
kernel (one program per sequence and query head: the prefix's tiles by the online softmax, then
the tree's own tile under the ancestor mask built in registers from the parent pointers,
:mod:`inference_conformance.optimized.tree_attention.fused`), and "torch", one masked attention per
sequence (:mod:`inference_conformance.optimized.tree_attention.vectorized`). Both declare batch
invariance: neither splits a sequence's keys by what is batched with it (a program, or a masked
attention, per sequence). The tree engine
(``optimized/speculative_tree/engine.py``) scores its trees with either, or with any registered
implementation.
"""
from __future__ import annotations


def implementations():
    """The torch and Triton implementations of the tree_attention contract."""
    from inference_conformance.conformance.registry import builtin
    from inference_conformance.optimized.tree_attention import fused, vectorized

    return (
        builtin("tree_attention", "torch", vectorized.tree_attention, batch_invariant=True),
        builtin("tree_attention", "triton", fused.tree_attention, kernel_modules=(fused,), batch_invariant=True),
    )
