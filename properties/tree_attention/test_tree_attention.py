"""Tests of tree attention beside its law (claim SD-10; ``laws.py``): the coverage table of the
law's pinned examples, and the calls a conforming implementation must also get right.
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.conformance.outcomes import Unsupported
from inference_conformance.conformance.tolerance import assert_exact
from inference_conformance.properties.tree_attention.laws import SD10_ATTENTION
from inference_conformance.properties.tree_attention.cases import call, case, check_against_paths, tree_inputs

#: tiny tensors: one intra-op thread is fastest and avoids OpenMP spin-waits between xdist workers
pytestmark = pytest.mark.usefixtures("one_torch_thread")



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
