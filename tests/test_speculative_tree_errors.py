"""What only the suite's own token-tree code promises about bad input: the tree-attention kernel's
host wrapper (and its reference-core twin) raises TypeError / ValueError naming the argument
before any launch; the tree engine refuses a batch prompt and an unknown attention backend."""
from __future__ import annotations

import pytest
import torch

from inference_conformance.optimized.speculative_tree.tree_attention import tree_attention, tree_attention_torch


def _args():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 3, 8, generator=g)
    k = torch.randn(2, 2, 10, 8, generator=g)
    v = torch.randn(2, 2, 10, 8, generator=g)
    return q, k, v, torch.tensor([-1, 0, 0]), torch.tensor([4, 7])


BAD = {  # what -> (argument index, replacement, exception, name in the message)
    "q-not-a-tensor": (0, [[0.0]], TypeError, "q"),
    "k-cache-3-d": (1, torch.zeros(2, 10, 8), ValueError, "k_cache"),
    "v-cache-dtype": (2, torch.zeros(2, 2, 10, 8, dtype=torch.float64), TypeError, "v_cache"),
    "heads-not-divisible": (1, torch.zeros(2, 3, 10, 8), ValueError, "k_cache"),
    "parent-after-child": (3, torch.tensor([-1, 2, 0]), ValueError, "parents"),
    "parents-float": (3, torch.tensor([-1.0, 0.0, 0.0]), ValueError, "parents"),
    "tree-past-the-cache": (4, torch.tensor([4, 8]), ValueError, "prefix_lens"),
    "prefix-lens-shape": (4, torch.tensor([4]), ValueError, "prefix_lens"),
}


@pytest.mark.parametrize("fn", [tree_attention, tree_attention_torch], ids=["triton", "torch"])
@pytest.mark.parametrize("what", sorted(BAD))
def test_tree_attention_rejects_bad_input_naming_the_argument(fn, what):
    i, value, exc, name = BAD[what]
    args = list(_args())
    args[i] = value
    with pytest.raises(exc, match=name):
        fn(*args)


def test_tree_engine_refuses_a_batch_and_an_unknown_backend():
    from inference_conformance.optimized.speculative.drafters import PromptLookupDrafter
    from inference_conformance.optimized.speculative_tree.engine import TreeSpeculativeEngine
    from inference_conformance.smallworld.checkpoints import load_model

    target = load_model("target", torch.float32)
    with pytest.raises(ValueError, match="attention"):
        TreeSpeculativeEngine(target, PromptLookupDrafter(), max_seq_len=32, attention="cuda-graphs")
    engine = TreeSpeculativeEngine(target, PromptLookupDrafter(), max_seq_len=32, attention="torch")
    with pytest.raises(ValueError, match="prompt"):
        engine.generate(torch.ones(2, 3, dtype=torch.int64), 4)
