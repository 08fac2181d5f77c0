"""Tests of token trees in the model (SD-10's law through the model: ``laws.py``) (claims SD-10, SD-12, SD-14; SpecInfer, Medusa, self-
speculation, prompt lookup; lecture 002 §6.6), on the small world's shipped target.

- SD-10: a tree scored in one forward (tree mask, depth positions) gives every node the logits of
  its root-to-node path run alone, through the engine's cached forward scored by every registered
  ``tree_attention`` implementation (the built-ins and any ``--impl tree_attention=...``); the
  mask bugs of that contract's zoo (``properties/tree_attention/zoo.py``: the flattened-index
  mask, a sibling leak) and the engine's positions from the flattened index
  (``properties/speculative_tree/zoo.py``) are each rejected by the same comparison. The
  attention-level law: ``properties/tree_attention/``.
- SD-12, the engine's side (every registered drafter: ``properties/drafter/``): greedy tree
  speculation through the Triton tree kernel emits exactly greedy target decoding, and after
  every round the target's cache holds exactly the committed tokens' keys and values (the
  rejected branches dropped); the engine that keeps a rejected branch's KV is rejected by both.
- SD-14: prompt lookup's tokens per target call on copy prompts built by a fixed rule, paired
  against the same lookup searching the output only (sign test, its verdict asserted), free
  generation recorded beside it, and self-speculation's α and tokens per call against the shipped
  drafts, each equal to an independent computation without the engine.
"""
from __future__ import annotations


import pytest
import torch

from inference_conformance.conformance import results
from inference_conformance.conformance.tolerance import assert_exact
from inference_conformance.conformance.zoo import expect_rejected
from inference_conformance.properties.speculative import sd14_cases
from inference_conformance.properties.drafter.cases import greedy_tokens, prompt_for, speculate
from inference_conformance.properties.speculative.sd14_cases import check_sd14_figures, copy_prompts, free_prompts
from inference_conformance.properties.speculative_tree.zoo import TREE_MODEL_ZOO, engine_zoo
from inference_conformance.properties.speculative_tree.model_cases import SD10_CASES, sd10_through_the_model, shipped_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.claim("SD-10")
@pytest.mark.parametrize("bad", sorted(TREE_MODEL_ZOO))
def test_sd10_zoo_engine_rejected(bad):
    """Each known-bad tree forward of the engine (``TREE_MODEL_ZOO``: RoPE positions from the
    flattened index) is rejected by SD-10's comparison through the model, scored by the float64
    reference tree_attention."""
    from inference_conformance.reference.tree_attention import tree_attention

    cls = TREE_MODEL_ZOO[bad]()
    impl = type("Bad", (), {"name": bad, "target": f"inference_conformance.properties.speculative_tree.zoo:{bad}"})()
    text = expect_rejected(lambda _impl: sd10_through_the_model(tree_attention, torch.float64, SD10_CASES[:2], cls),
                           impl)
    results.record("SD-10", measured="rejected", unit="known-bad tree forward", rule="SD-10 comparison",
                   what=f"{bad}: {text[:120]}")


# ------------------------------------------------------------------------------------- SD-12
# SD-12 over every registered drafter: properties/drafter/. Here: the engine's side of it.
def law_sd12_greedy(engine_cls, drafter, attention: str = "torch", n_tokens: int = 20, prompts=None):
    """SD-12 on the engine ``engine_cls`` (its tree attention ``attention``) with ``drafter``: greedy
    tree speculation emits exactly greedy target decoding from each prompt (the <bos> prompt and a
    prompt with a repeated 3-gram by default), the cache checked after every round
    (``properties/drafter/cases.py``); returns the summed statistics."""
    total = {"rounds": 0, "emitted": 0, "accepted": 0, "drafted": 0}
    for kind, seed in prompts or (("bos", 0), ("words", 11)):
        prompt = prompt_for(kind, seed)
        out, stats, _ = speculate(drafter, prompt, n_tokens, max_seq_len=64, engine_cls=engine_cls,
                                  attention=attention)
        assert_exact(torch.tensor(out), torch.tensor(greedy_tokens(tuple(prompt), n_tokens)),
                     what=f"SD-12: greedy tree speculation ({engine_cls.__name__}) vs greedy target decoding")
        total = {k: total[k] + stats[k] for k in total}
    return total


@pytest.mark.claim("SD-12")
@pytest.mark.suite_own("the suite's tree engine run with its Triton tree-attention kernel (the drafters' law over the "
                       "registry: properties/drafter/)")
def test_sd12_greedy_tree_with_the_triton_kernel():
    """SD-12 with the Triton tree-attention kernel in the engine (interpreted on a CPU: one short
    run of the top-k draft tree, float64)."""
    from inference_conformance.optimized.drafter import TopKTreeDrafter
    from inference_conformance.optimized.speculative_tree.engine import TreeSpeculativeEngine

    law_sd12_greedy(TreeSpeculativeEngine, TopKTreeDrafter(shipped_model("draft_good", torch.float64), (2, 1)),
                    attention="triton", n_tokens=6, prompts=(("words", 11),))


@pytest.mark.claim("SD-12")
def test_sd12_zoo_engine_rejected():
    """The engine that keeps a rejected branch's keys and values is rejected by SD-12's law (its
    cache check, and its output)."""
    from inference_conformance.optimized.drafter import TopKTreeDrafter

    cls = engine_zoo()["rejected_branch_kv_kept"]
    impl = type("Bad", (), {"name": "rejected_branch_kv_kept",
                            "target": "inference_conformance.properties.speculative_tree.zoo:RejectedBranchKVKept"})()
    drafter = TopKTreeDrafter(shipped_model("draft_good", torch.float64), (2, 2, 1))
    text = expect_rejected(lambda _impl: law_sd12_greedy(cls, drafter), impl)
    results.record("SD-12", measured="rejected", unit="known-bad engine", rule="SD-12 output and cache checks",
                   what=f"rejected_branch_kv_kept: {text[:120]}")


# ------------------------------------------------------------------------------------- SD-14
def _run(drafter, prompts, n_tokens: int):
    from inference_conformance.optimized.speculative_tree.engine import TreeSpeculativeEngine

    target = shipped_model("target", torch.float64)
    total = {"rounds": 0, "emitted": 0, "accepted": 0, "drafted": 0}
    for prompt in prompts:
        engine = TreeSpeculativeEngine(target, drafter, max_seq_len=128, attention="torch")
        _, stats = engine.generate(prompt, n_tokens)
        total = {k: total[k] + stats[k] for k in total}
    return total


@pytest.mark.claim("SD-14")
@pytest.mark.suite_own("prompt lookup's own claim: the lookup against its output-only twin, both the suite's "
                       "(every registered drafter's figures: properties/drafter/)")
def test_sd14_prompt_lookup_copy_vs_free():
    """SD-14: prompt lookup (n-gram 3, γ = 5) on the 12 copy prompts
    (:func:`inference_conformance.properties.speculative.sd14_cases.sd14_copy_prompts`: the first 12 validation
    documents, each without its end and then its first 4 tokens again, a rule fixed before any
    output is seen), paired on each prompt with the same lookup restricted to the output
    (:class:`~inference_conformance.properties.speculative.sd14_cases.OutputOnlyLookup`), 16 tokens each, on the
    same engine and greedy target; the claim is judged, and asserted, by the one-sided sign test
    of :func:`~inference_conformance.properties.speculative.sd14_cases.check_sd14_lookup` at significance level
    0.05 (holds, or the test fails with the verdict). Free generation from <bos> (one row: greedy
    is deterministic) is recorded beside it, not judged."""
    prompts = sd14_cases.sd14_copy_prompts()
    lookup, base, free = (list(sd14_cases.sd14_arm(arm)) for arm in ("lookup", "output-only", "free"))
    verdict = sd14_cases.judge_sd14_lookup(lookup, base)
    wins, losses, ties, p = sd14_cases.sd14_sign_test(lookup, base)
    holds = {"holds": True, "fails": False}.get(verdict)
    rule = (f"one-sided sign test, lookup vs output-only lookup on {len(prompts)} copy prompts, p < {sd14_cases.SD14_LEVEL}; "
            "fails where wins <= losses")
    for task, arm, runs in (("copy", "prompt lookup", lookup), ("copy", "lookup restricted to the output", base),
                            ("free", "prompt lookup", free)):
        total = {k: sum(r[k] for r in runs) for k in ("rounds", "emitted", "accepted", "drafted")}
        tpc = sd14_cases.tokens_per_call(total)
        results.record("SD-14", measured=round(tpc, 3), lecture="shines on tasks that copy from the prompt",
                       unit=f"tokens per target call, {arm}, {task}", drafter="lookup", task=task,
                       tokens_per_call=round(tpc, 3), rounds=total["rounds"], pairs=len(prompts), trend=verdict,
                       alpha=round(total["accepted"] / max(1, total["drafted"]), 3), holds=holds,
                       trend_rule=rule, what=f"ahead on {wins}, behind on {losses}, tied on {ties}; p = {p:.3g}")
    sd14_cases.check_sd14_lookup(lookup, base)


@pytest.mark.claim("SD-14")
@pytest.mark.suite_own("self-speculation against the shipped drafts, each recomputed from its draft model without "
                       "the engine (every registered drafter's figures: properties/drafter/)")
def test_sd14_self_speculation_against_the_shipped_drafts():
    """SD-14: α (accepted / drafted) and tokens per target call of self-speculation (the target
    without block 1) against the good and the poor draft, γ = 4 greedy chains, free generation
    from <bos> and one copy prompt, 32 tokens each, recorded; each drafter's figures must equal
    those of an independent computation
    (:func:`~inference_conformance.properties.speculative.sd14_cases.greedy_chain_counts`: full forwards, no cache,
    no tree, no verifier; the self-speculative draft a deep copy of the target with block 1
    deleted), and the counts the recorded ones (``SD14_RECORDED``, the rejection tests' input)."""
    from inference_conformance.optimized.drafter import SelfSpeculativeDrafter
    from inference_conformance.optimized.drafter import ChainDrafter

    target = shipped_model("target", torch.float64)
    drafts = {"self (block 1 skipped)": sd14_cases.self_speculative_draft(target),
              "draft_good": shipped_model("draft_good", torch.float64), "draft_poor": shipped_model("draft_poor", torch.float64)}
    drafters = {"self (block 1 skipped)": SelfSpeculativeDrafter((1,), 4),
                "draft_good": ChainDrafter(drafts["draft_good"], 4), "draft_poor": ChainDrafter(drafts["draft_poor"], 4)}
    prompts = free_prompts(1) + copy_prompts(1)
    counts, independent = {}, {}
    for name, d in drafters.items():
        s = _run(d, prompts, 32)
        counts[name] = {k: s[k] for k in ("rounds", "emitted", "accepted", "drafted")}
        parts = [sd14_cases.greedy_chain_counts(target, drafts[name], pr[0].tolist(), 32, 4) for pr in prompts]
        independent[name] = {k: sum(c[k] for c in parts) for k in counts[name]}
        alpha, tpc = sd14_cases.sd14_figures(counts)[name]
        results.record("SD-14", measured=round(tpc, 3), unit=f"tokens per target call, {name}, gamma = 4",
                       drafter="self" if name.startswith("self") else "chain", draft=name, gamma=4,
                       alpha=round(alpha, 3), tokens_per_call=round(tpc, 3), rounds=s["rounds"],
                       rule="equal to the independent computation (full forwards, no cache)",
                       what=f"independent: {independent[name]}")
    check_sd14_figures(counts, independent)
    assert counts == sd14_cases.SD14_RECORDED, (f"sd14_cases.SD14_RECORDED (properties/speculative/sd14_cases.py), the "
                                        f"rejection tests' good input, is stale: live {counts}")
