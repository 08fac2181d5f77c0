"""What only the suite's own token-tree code promises about bad input: the tree engine refuses a
batch prompt and an unknown attention backend (the tree-attention built-ins' own promises:
``tests/test_tree_attention_errors.py``)."""
from __future__ import annotations

import pytest
import torch


def test_tree_engine_refuses_a_batch_and_an_unknown_backend():
    from inference_conformance.reference.drafter import PromptLookupDrafter
    from inference_conformance.optimized.speculative_tree.engine import TreeSpeculativeEngine
    from inference_conformance.smallworld.checkpoints import load_model

    target = load_model("target", torch.float32)
    with pytest.raises(ValueError, match="attention"):
        TreeSpeculativeEngine(target, PromptLookupDrafter(), max_seq_len=32, attention="cuda-graphs")
    engine = TreeSpeculativeEngine(target, PromptLookupDrafter(), max_seq_len=32, attention="torch")
    with pytest.raises(ValueError, match="prompt"):
        engine.generate(torch.ones(2, 3, dtype=torch.int64), 4)
