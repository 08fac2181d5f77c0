"""Laws of tree attention (claim SD-10; SpecInfer, Miao et al. 2024; lecture 002 §6.6).

SD-10 at the attention level: a token tree given by parent pointers, scored in one call over each
sequence's cached prefix, gives every node the attention output of its root-to-node path alone.
The law runs over every registered implementation of the
``tree_attention`` contract (``conformance/contracts/tree_attention.py``) in every dtype, on
drawn and pinned cases that reach the contract's boundary classes, and rejects every known-bad
implementation (``properties/tree_attention/zoo.py``: the mask from the flattened index, a node
that misses itself, a sibling leak, the prefix mask off by one, GQA heads interleaved, one prefix
length for the batch) by its own comparison. Through the model (every node's logits on the
shipped target's tree forward, the speculative_tree engine's): ``SD10_MODEL`` in
``properties/speculative_tree/laws.py``.
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.conformance.contracts.tree_attention import COVERAGE
from inference_conformance.conformance.laws import Kills, Law
from inference_conformance.properties import strategies
from inference_conformance.properties.kernel_law import kernel_law
from inference_conformance.properties.tree_attention.cases import (
    EXAMPLES,
    call,
    check_against_paths,
    fit_interpreter,
    tree_cases,
    tree_inputs,
)

#: tiny tensors: one intra-op thread is fastest and avoids OpenMP spin-waits between xdist workers
pytestmark = pytest.mark.usefixtures("one_torch_thread")

law_tree_attention_matches_paths = kernel_law(
    "law_tree_attention_matches_paths",
    """SD-10 at the attention level: every node's output equals the attention of its query over the
    cached prefix and its own root-to-node path alone (float64 reference), by the tolerance policy.""",
    fit=fit_interpreter, inputs=tree_inputs, call=call, check=check_against_paths)

#: The conformance test's docstring.
TEST_DOC = """SD-10 for every implementation and dtype: each node's output over the prefix and the tree
    equals attention over the prefix and its root-to-node path alone (float64 reference)."""

#: The known-bad implementations the law rejects in float64 (properties/tree_attention/zoo.py).
ZOO = ("flattened_index_mask", "node_misses_itself", "sibling_leak", "prefix_mask_off_by_one",
       "kv_head_modulo_not_grouped", "one_prefix_len_for_the_batch", "ancestor_walk_depth_5",
       "ancestors_within_tile_of_16")

#: The entries the law also rejects in bfloat16 by the dtype rule (the mask bugs).
ZOO_16BIT = ("flattened_index_mask", "sibling_leak")

#: SD-10's attention-level law over every implementation and dtype; a Triton kernel under the
#: interpreter gets a fifth of the drawn examples (the pinned ones always run).
SD10_ATTENTION = Law(
    claim="SD-10", technique="tree_attention", body=law_tree_attention_matches_paths,
    given={"case": tree_cases(), "seed": strategies.seeds},
    examples=tuple(dict(case=c, seed=i + 1) for i, c in enumerate(EXAMPLES)),
    dtypes=strategies.FLOAT_DTYPES,
    kills=(Kills(ZOO, (torch.float64,)),
           Kills(ZOO_16BIT, (torch.bfloat16,), doc="The dtype rule sees the mask bugs in bfloat16 too.")),
    coverage=COVERAGE,
    interpreted_examples=lambda n: max(2, n // 5),
    test="test_sd10_tree_attention_matches_paths", doc=TEST_DOC,
    zoo_tests=("test_sd10_tree_attention_zoo_rejected", "test_sd10_tree_attention_zoo_rejected_bfloat16"))
