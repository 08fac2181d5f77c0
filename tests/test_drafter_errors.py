"""What the drafter contract's checks and the suite's own drafters promise about bad input (the
contract's documented bad calls run on every implementation in ``properties/test_contract_generic.py``):
``check_proposal`` names the drafter and the index of a malformed tree, the engine refuses such a
tree before any forward, and the built-ins refuse a bad γ or n-gram length."""
from __future__ import annotations

import pytest
import torch

from inference_conformance.conformance.contracts.drafter import check_proposal, validate
from inference_conformance.optimized.drafter import ChainDrafter
from inference_conformance.reference.drafter import PromptLookupDrafter


@pytest.mark.parametrize("proposal, match", [
    (([-1, 0],), r"must return \(parents, tokens\), got tuple"),
    (([-1, 0], [5]), r"returned 2 parents for 1 tokens"),
    (([-1, 1], [5, 6]), r"parents\[1\] = 1: .*-1 <= parents\[i\] < i"),
    (([-2], [5]), r"parents\[0\] = -2"),
    (([-1, 0], [5, 294]), r"tokens\[1\] = 294, outside the vocabulary \[0, 294\)"),
    (([-1], ["x"]), r"tokens\[0\] = 'x' of type str: the contract asks for int"),
    (([-1], [5.0]), r"tokens\[0\] = 5.0 of type float"),
    (([-1], [torch.tensor(5)]), r"tokens\[0\] = tensor\(5\) of type Tensor"),
    (([True], [5]), r"parents\[0\] = True of type bool"),
    ((torch.tensor([-1]), [5]), r"got parents as Tensor"),
    (None, r"must return \(parents, tokens\), got NoneType"),
])
def test_check_proposal_names_the_index(proposal, match):
    with pytest.raises(ValueError, match=match) as info:
        check_proposal(proposal, 294, who="my drafter")
    assert str(info.value).startswith("my drafter "), info.value


def test_check_proposal_accepts_trees_and_nothing():
    assert check_proposal(([], []), 294) == ([], [])
    assert check_proposal(((-1, -1, 0, 1), (3, 4, 5, 6)), 294) == ([-1, -1, 0, 1], [3, 4, 5, 6])
    import numpy as np

    assert check_proposal(([np.int64(-1)], [np.int32(7)]), 294) == ([-1], [7])


def test_validate_wording():
    from inference_conformance.smallworld.checkpoints import load_model

    target = load_model("target", torch.float64)
    validate([1, 2], torch.zeros(128, dtype=torch.float64), target)
    with pytest.raises(ValueError, match=r"context\[1\] = 294 is outside the vocabulary \[0, 294\)"):
        validate([1, 294], None, target)
    with pytest.raises(TypeError, match=r"context must hold token ids \(int\), got bool True"):
        validate([1, True], None, target)
    with pytest.raises(ValueError, match=r"hidden must be a floating tensor of shape \(128,\) \(d_model\), got "
                                         r"torch.int64 \(128,\)"):
        validate([1], torch.zeros(128, dtype=torch.int64), target)
    with pytest.raises(TypeError, match=r"target must be the target model .* got str"):
        validate([1], None, "target")


def test_engine_refuses_a_malformed_tree_before_any_forward():
    from inference_conformance.optimized.speculative_tree.engine import TreeSpeculativeEngine
    from inference_conformance.smallworld.checkpoints import load_model

    class SelfParent:
        def propose(self, context, hidden, target):
            return [0], [5]

    target = load_model("target", torch.float64)
    engine = TreeSpeculativeEngine(target, SelfParent(), max_seq_len=32, attention="torch")
    with pytest.raises(ValueError, match=r"the drafter SelfParent returned parents\[0\] = 0"):
        engine.generate(torch.tensor([[1, 5, 6]]), 4)
    assert engine.target.lengths()[0] == 2, "only the prompt was prefilled"


@pytest.mark.parametrize("make, match", [
    (lambda: ChainDrafter(None, 0), r"gamma must be an int >= 1, got 0"),
    (lambda: PromptLookupDrafter(0, 5), r"ngram must be an int >= 1, got 0"),
    (lambda: PromptLookupDrafter(3, 2.5), r"gamma must be an int >= 1, got 2.5"),
])
def test_builtins_refuse_bad_settings(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_a_refusal_after_the_first_round_fails_the_law():
    """NotImplementedError in the first round of a run is the drafter refusing the setting (the
    example is "unsupported"); later, after it drafted, it is the law's failure naming the round."""
    from inference_conformance.properties.drafter.cases import prompt_for, speculate

    class RefusesLater:
        def propose(self, context, hidden, target):
            if hidden is not None:
                raise NotImplementedError("no heads for this hidden state")
            return [], []

    class RefusesAtOnce:
        def propose(self, context, hidden, target):
            raise NotImplementedError("no drafts for this target")

    prompt = prompt_for("bos", 0)
    with pytest.raises(AssertionError, match=r"refused round 1 \(context of 2 tokens, hidden given\) after drafting "
                                             r"in the rounds before \(no heads for this hidden state\)"):
        speculate(RefusesLater(), prompt, 4, max_seq_len=16)
    with pytest.raises(NotImplementedError, match=r"round 0 \(context of 1 tokens, hidden None\): no drafts"):
        speculate(RefusesAtOnce(), prompt, 4, max_seq_len=16)
