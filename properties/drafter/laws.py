"""The laws of drafters (claims SD-12, SD-14; lecture 002 §2 and §6.6), over every registered
``drafter`` implementation (``conformance/contracts/drafter.py``: prompt lookup the reference, the
draft chain and top-k draft tree, Medusa-style heads, self-speculation, and any
``--impl drafter=...``), on the small world's shipped target in float64.

- SD-12: greedy tree speculation with the drafter emits exactly greedy decoding of the target, the
  target's cache checked after every round; every call leaves its context unchanged and returns a
  well-formed tree. Rejects the zoo's self-speculation that deletes a block from the target, the
  chain whose parents count the pending token as node 0, and the lookup that extends the context
  in place.
- SD-12 on a padded vocabulary: on the shipped target with its output matrix padded past the
  tokenizer's 294 tokens to 320 rows (as real checkpoints pad to a multiple of 64 or 128), at
  contexts whose final hidden state makes a padded row the largest logit, every proposal holds
  ids below the tokenizer's vocabulary only (``check_proposal``). Rejects the heads whose argmax
  runs over the padded rows.
- SD-14: the drafter's α and tokens per target call on four copy prompts and in free generation,
  recorded beside the lecture's figure; the engine's counts equal their replay from the proposals
  alone against greedy decoding, and the drafter, asked again on every recorded round, proposes
  the same tree. Rejects the draft chain that samples with torch's global generator.

The suite's own SD-14 claims about prompt lookup and self-speculation (the sign test against the
output-only lookup, the separate drafts) are in ``properties/speculative_tree/``.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st

from inference_conformance.conformance import results
from inference_conformance.conformance.contracts.drafter import COVERAGE, check_proposal
from inference_conformance.conformance.laws import Kills, Law, refusal
from inference_conformance.conformance.tolerance import assert_exact
from inference_conformance.properties.drafter.cases import (
    ZOO_PADDED,
    ZOO_SD12,
    ZOO_SD14,
    Watched,
    greedy_tokens,
    padded_target,
    prompt_for,
    replay,
    speculate,
    totals,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: Nodes a replay looks ahead past the tokens asked for (a round may emit past the end).
AHEAD = 32


def law_greedy_drafts_emit_greedy_decoding(run, device, kind, seed, n_tokens, slack):
    """SD-12 for the drafter ``run.impl``: greedy tree speculation of the float64 target (cache of
    prompt + ``n_tokens`` + ``slack`` slots, so the last rounds have little room), ``n_tokens``
    after a ``kind`` prompt (``prompt_for``), emits greedy decoding token for token; the cache is
    checked after every round, each call's context and tree by :class:`Watched`."""
    prompt = prompt_for(kind, seed)
    with refusal(run, f"{run.implementation} refuses to draft for the float64 target"):
        out, _, watched = speculate(run.impl, prompt, n_tokens, max_seq_len=len(prompt) + n_tokens + slack,
                                    device=device)
    want = greedy_tokens(tuple(prompt), n_tokens)
    assert_exact(torch.tensor(out), torch.tensor(want),
                 what=f"SD-12: greedy tree speculation with the drafter vs greedy target decoding ({kind} prompt of "
                      f"{len(prompt)} tokens, {n_tokens} new)")
    for r in replay(watched.calls, greedy_tokens(tuple(prompt), n_tokens + AHEAD)):
        run.observe(r)


SD12_EXAMPLES = (dict(kind="bos", seed=0, n_tokens=12, slack=44), dict(kind="copy", seed=3, n_tokens=16, slack=0),
                 dict(kind="words", seed=11, n_tokens=12, slack=2))

SD12 = Law(claim="SD-12", technique="drafter", body=law_greedy_drafts_emit_greedy_decoding,
           given={"kind": st.sampled_from(["bos", "copy", "words"]), "seed": st.integers(0, 60),
                  "n_tokens": st.integers(1, 16), "slack": st.integers(0, 12)},
           examples=SD12_EXAMPLES, params=("device",), kills=(Kills(ZOO_SD12),), coverage=COVERAGE,
           require_coverage=True, max_examples=lambda n: max(1, n // 10),
    test="test_sd12_greedy_drafts_emit_greedy_decoding",
    zoo_tests=("test_sd12_zoo_drafter_rejected",))



def law_proposals_are_tokens_of_a_padded_vocabulary(run, device):
    """SD-12's proposals on a padded output matrix: the drafter ``run.impl``, asked on
    :func:`padded_target` (V = 294 tokens, 320 rows) for a copy prompt and a word prompt, each
    without and with the target's final hidden state at its last token, where a padded row has
    the largest logit (checked: the law's premise), proposes ids in [0, V) only
    (:class:`Watched`: ``check_proposal`` with the tokenizer's V; the context and the target
    unchanged)."""
    from inference_conformance.smallworld.heads import hidden_states

    target = padded_target(device)
    V = target.cfg.vocab_size
    for kind, seed in (("copy", 3), ("words", 11)):
        context = prompt_for(kind, seed)
        tokens = torch.tensor([context], device=device)
        hidden = hidden_states(target, tokens)[0, -1]
        with torch.no_grad():
            top = int(target(tokens)[0, -1].argmax())
        assert top >= V, f"the law's premise: a padded row wins at the {kind} prompt's hidden state (argmax {top})"
        for h in (None, hidden):
            with refusal(run, f"{run.implementation} refuses to draft for a target with a padded output matrix"):
                Watched(run.impl, target.cfg.max_seq_len, "SD-12").propose(list(context), h, target)


SD12_PADDED = Law(claim="SD-12", technique="drafter", body=law_proposals_are_tokens_of_a_padded_vocabulary,
                  params=("device",), kills=(Kills(ZOO_PADDED),),
    test="test_sd12_proposals_on_a_padded_vocabulary",
    zoo_tests=("test_sd12_padded_vocabulary_zoo_rejected",))



def law_figures_replay_from_the_proposals(run, device, task, seed, n_tokens):
    """SD-14 for the drafter ``run.impl``: a run of greedy tree speculation (``task`` "copy": copy
    prompt ``seed``; "free": from <bos>) whose counts (rounds, emitted, accepted, drafted) equal
    their replay from the recorded proposals against greedy decoding (:func:`replay`: no engine,
    no cache), and whose every proposal the drafter makes again when asked on the same context,
    hidden state and target, the rounds asked last to first, each right after another context of
    its length (a drafter whose proposals depend on what it was asked before is caught)."""
    prompt = prompt_for("copy" if task == "copy" else "bos", seed)
    with refusal(run, f"{run.implementation} refuses to draft for the float64 target"):
        _, stats, watched = speculate(run.impl, prompt, n_tokens, max_seq_len=len(prompt) + n_tokens + AHEAD,
                                      device=device, claim="SD-14", check_cache=False)
    rounds = replay(watched.calls, greedy_tokens(tuple(prompt), n_tokens + AHEAD), task)
    counts = {k: stats[k] for k in ("rounds", "emitted", "accepted", "drafted")}
    assert counts == totals(rounds), (f"SD-14: the engine's counts {counts} differ from their replay from the "
                                      f"drafter's proposals {totals(rounds)} ({task} prompt of {len(prompt)} tokens)")
    target = watched.target
    for r in reversed(range(len(watched.calls))):
        ctx, hidden, parents, tokens, _ = watched.calls[r]
        half = len(ctx) // 2
        run.impl.propose(ctx[half:] + ctx[:half], hidden, target)       # another context of the same length
        again = check_proposal(run.impl.propose(list(ctx), hidden, target), target.cfg.vocab_size)
        assert again == (parents, tokens), (
            f"SD-14: asked again on round {r} (context of {len(ctx)} tokens; the rounds asked again last to "
            f"first, each after the same context rotated by {half}) the drafter proposed {again[1][:8]} under "
            f"{again[0][:8]}, not {tokens[:8]} under {parents[:8]}: its α and tokens per call cannot be reproduced "
            "(rule: propose is a function of context, hidden and target, whatever was asked before)")
    for r in rounds:
        run.observe(r)


#: SD-14's runs, the same in every profile: the first four copy prompts, 16 tokens each, and free
#: generation from <bos>, 24 tokens.
SD14_EXAMPLES = tuple(dict(task="copy", seed=s, n_tokens=16) for s in range(4)) + (dict(task="free", seed=0,
                                                                                         n_tokens=24),)


def record_figures(run) -> None:
    """SD-14's rows of one drafter: α and tokens per target call per task, from the replayed rounds."""
    for task, lecture in (("copy", "many tokens per target call on a task that copies from the prompt"),
                          ("free", "about one token per target call in free generation")):
        t = totals(o for o in run.observations if o.task == task)
        if not t["rounds"]:
            continue
        tpc, alpha = t["emitted"] / t["rounds"], t["accepted"] / max(1, t["drafted"])
        results.record("SD-14", measured=round(tpc, 3), unit=f"tokens per target call, {task}",
                       lecture=f"prompt lookup: {lecture}", drafter=run.implementation, task=task,
                       tokens_per_call=round(tpc, 3), alpha=round(alpha, 3), rounds=t["rounds"],
                       rule="the engine's counts equal their replay from the proposals; each proposal made again "
                            "when asked")


SD14 = Law(claim="SD-14", technique="drafter", body=law_figures_replay_from_the_proposals,
           given={"task": st.just("copy"), "seed": st.just(0), "n_tokens": st.just(16)},
           examples=SD14_EXAMPLES, explicit_only=True, params=("device",), kills=(Kills(ZOO_SD14),),
    test="test_sd14_drafter_figures_replay", after=record_figures,
    zoo_tests=("test_sd14_zoo_drafter_rejected",))
