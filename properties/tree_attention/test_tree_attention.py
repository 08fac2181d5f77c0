"""Laws of tree attention (claim SD-10; SpecInfer, Miao et al. 2024; lecture 002 §6.6).

SD-10 at the attention level: a token tree given by parent pointers, scored in one call over each
sequence's cached prefix, gives every node the attention output of its root-to-node path alone.
The law (``properties/tree_attention/cases.py``) runs over every registered implementation of the
``tree_attention`` contract (``conformance/contracts/tree_attention.py``) in every dtype, on
drawn and pinned cases that reach the contract's boundary classes, and rejects every known-bad
implementation (``properties/tree_attention/zoo.py``: the mask from the flattened index, a node
that misses itself, a sibling leak, the prefix mask off by one, GQA heads interleaved, one prefix
length for the batch) by its own comparison. Through the model (every node's logits on the
shipped target): ``properties/speculative_tree/test_speculative_tree_engine.py``.
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.conformance.outcomes import Unsupported
from inference_conformance.conformance.tolerance import assert_exact
from inference_conformance.properties.tree_attention.cases import SD10_ATTENTION, call, case, check_against_paths, tree_inputs

#: tiny tensors: one intra-op thread is fastest and avoids OpenMP spin-waits between xdist workers
pytestmark = pytest.mark.usefixtures("one_torch_thread")

test_sd10_tree_attention_matches_paths = SD10_ATTENTION.conformance_test(
    "test_sd10_tree_attention_matches_paths",
    doc="""SD-10 for every implementation and dtype: each node's output over the prefix and the tree
    equals attention over the prefix and its root-to-node path alone (float64 reference).""")

test_sd10_tree_attention_zoo_rejected, test_sd10_tree_attention_zoo_rejected_bfloat16 = SD10_ATTENTION.make_zoo_tests(
    "test_sd10_tree_attention_zoo_rejected", "test_sd10_tree_attention_zoo_rejected_bfloat16")


@pytest.mark.claim("SD-10")
@pytest.mark.suite_own("the suite's pinned examples reach every boundary class")
def test_sd10_tree_attention_coverage_table():
    """The boundary classes each pinned example reaches (every profile runs them)."""
    SD10_ATTENTION.record_pinned_coverage("every class of the contract is reached in every Hypothesis profile")


@pytest.mark.technique("tree_attention")
@pytest.mark.claim("SD-10")
def test_sd10_tree_attention_strided_inputs(impl, device):
    """Any strides: q a slice of a wider projection, the caches every other slot of a wider pool."""
    c = case((-1, 0, -1, 2), (9, 4), 4, 2, 8)
    args = tree_inputs(c, 3, torch.float32, device)
    q, k, v, par, lens = args
    wide_q = torch.cat([q, q], -1)[..., :8]
    wide_k = torch.stack([k, torch.full_like(k, float("nan"))], 3).flatten(2, 3)[:, :, ::2]
    wide_v = torch.stack([v, torch.full_like(v, float("nan"))], 3).flatten(2, 3)[:, :, ::2]
    assert not wide_q.is_contiguous() and not wide_k.is_contiguous()
    strided = (wide_q, wide_k, wide_v, par, lens)
    check_against_paths(call(impl, strided, c), args, c, what="tree attention of strided inputs")


@pytest.mark.technique("tree_attention")
def test_outputs_do_not_alias_across_calls(impl, device):
    """A second call must not overwrite the first call's output (a reused workspace would)."""
    c = case((-1, 0, 0), (5, 2), 2, 1, 8)
    out1 = call(impl, tree_inputs(c, 1, torch.float32, device), c)
    kept = out1.clone()
    call(impl, tree_inputs(c, 2, torch.float32, device), c)
    assert_exact(out1, kept, what="the first output after a second call")


def test_an_implementation_refusing_everything_is_unsupported_not_passed(device):
    import types

    from inference_conformance.conformance.registry import Implementation

    def refuses(*args, **kw):
        raise NotImplementedError("nothing supported")

    impl = Implementation("tree_attention", "refuses", "tests:refuses", "outside",
                          types.SimpleNamespace(tree_attention=refuses), ("tree_attention",))
    with pytest.raises(Unsupported, match="unsupported"):
        SD10_ATTENTION.with_examples(SD10_ATTENTION.examples[:1])(impl, device, torch.float64)
