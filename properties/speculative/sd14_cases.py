"""The checks of the speculative-decoding claim SD-14 (prompt lookup, self-speculation and the
shipped drafts: tokens per target call), each a function of what it judges, so that the comparison
that gives the claim its verdict (``properties/speculative_tree/test_speculative_tree_engine.py``) can be fed a
known-bad input and shown to reject it (``properties/speculative/test_speculative_rejections.py``): the copy
and free prompts, the paired runs of the lookup against the same lookup restricted to the output,
the sign test and the recorded counts.
"""
from __future__ import annotations

from functools import lru_cache

def copy_prompts(n: int) -> list:
    """Copy-task prompts, (1, S) int64 each: a validation document without its end, then its
    first 4 tokens again (the continuation repeats the prompt when the target copies)."""
    import torch

    from inference_conformance.smallworld.data import encode, split

    docs = encode(split("val", n))
    return [torch.tensor([d[:-1] + d[:4]]) for d in docs]


def free_prompts(n: int) -> list:
    """Free-generation prompts: ``n`` times ``<bos>`` alone, (1, 1) int64."""
    import torch

    from inference_conformance.smallworld.tokenizer import tokenizer

    return [torch.tensor([[tokenizer().bos_id]])] * n


def sd14_copy_prompts() -> list:
    """SD-14's copy prompts, (1, S) int64 each: SD14_COPY_TEXTS encoded."""
    import torch

    from inference_conformance.smallworld.tokenizer import tokenizer

    return [torch.tensor([tokenizer().encode(t)]) for t in SD14_COPY_TEXTS]


#: SD-14's paired rule: one-sided sign test at significance level SD14_LEVEL; tokens generated per prompt; the
#: lookup's n-gram length and γ.
SD14_LEVEL, SD14_TOKENS, SD14_NGRAM, SD14_GAMMA = 0.05, 16, 3, 5
#: The validation documents of SD-14's copy prompts: the first 6 that :func:`find_sd14_copy_docs`
#: selects (scanning the split in order, ``find_sd14_copy_docs(6, target)`` on the shipped target),
#: and their prompts (:func:`sd14_copy_prompt`, written out so that a run does not rebuild them).
SD14_COPY_DOCS = (2, 3, 8, 18, 19, 20)
SD14_COPY_TEXTS = (
    "<bos> the uncle that the uncle sees is in the old gardeners . the gardeners know the artists .",
    "<bos> the oaks that the oaks see were in the oaks . the fern is very small .",
    "<bos> the oaks that the oaks see were in the oaks . a busy daisy moves .",
    "<bos> the uncle that the uncle sees is in the old gardeners . that child digs .",
    "<bos> the oaks that the oaks see were in the oaks . an iris wilted and sees this stone .",
    "<bos> the uncle that the uncle sees is in the old gardeners . each uncle sees the wall .")


def _first_sentence(ids: list) -> list:
    """The tokens of ``ids`` up to and including the first ".", or [] (no "." before <eos>)."""
    from inference_conformance.smallworld.tokenizer import tokenizer

    tok = tokenizer()
    dot = tok.stoi["."]
    if dot not in ids or tok.eos_id in ids[:ids.index(dot)]:
        return []
    return ids[:ids.index(dot) + 1]


@lru_cache(maxsize=None)
def sd14_copy_prompt(doc: int, target) -> tuple:
    """The copy prompt of validation document ``doc``: [<bos>] + s + the document's first
    sentence, where s is the sentence the greedy ``target`` writes after that first sentence
    (``<bos>`` + sentence). Returns the ids (a tuple; () when the target writes no sentence)."""
    import torch

    from inference_conformance.optimized.speculative_tree.engine import TreeSpeculativeEngine
    from inference_conformance.smallworld.data import encode, split

    first = _first_sentence(encode(split("val", doc + 1))[doc])
    out, _ = TreeSpeculativeEngine(target, _NoDraft(), max_seq_len=128, attention="torch").generate(
        torch.tensor([first]), SD14_TOKENS)
    s = _first_sentence(out[0, len(first):].tolist())
    return tuple([first[0]] + s + first[1:]) if len(s) >= 4 else ()


class _NoDraft:
    """A drafter that proposes nothing (each round one greedy decode step)."""

    def propose(self, context, hidden):
        return [], []


def find_sd14_copy_docs(n: int, target) -> tuple:
    """How SD-14's copy prompts were chosen (by the target's greedy continuation, never by a
    lookup's tokens per call): scan the validation documents in order and keep the first ``n``
    whose copy prompt (:func:`sd14_copy_prompt`) the greedy ``target`` continues, within
    SD14_TOKENS tokens, with the prompt's first sentence s verbatim (the output repeats a span of
    the prompt; the shipped target mostly writes <eos> first, then s). Returns their indices."""
    import torch

    from inference_conformance.optimized.speculative_tree.engine import TreeSpeculativeEngine
    from inference_conformance.smallworld.data import SPLITS

    found = []
    for doc in range(SPLITS["val"][1]):
        prompt = sd14_copy_prompt(doc, target)
        if prompt:
            out, _ = TreeSpeculativeEngine(target, _NoDraft(), max_seq_len=128, attention="torch").generate(
                torch.tensor([prompt]), SD14_TOKENS)
            if repeats_first_sentence(list(prompt), out[0, len(prompt):].tolist()):
                found.append(doc)
        if len(found) == n:
            break
    return tuple(found)


def repeats_first_sentence(prompt: list, continuation: list) -> bool:
    """Whether ``continuation`` holds the prompt's first sentence (after its <bos>) verbatim."""
    s = _first_sentence(prompt[1:])
    return bool(s) and any(continuation[i:i + len(s)] == s for i in range(len(continuation) - len(s) + 1))


class OutputOnlyLookup:
    """SD-14's paired baseline: ``lookup`` (a drafter) fed only the generated tokens, those after
    the prompt's ``prompt_len`` tokens: the same lookup without the prompt to search."""

    def __init__(self, lookup, prompt_len: int):
        self.lookup, self.prompt_len = lookup, prompt_len

    def propose(self, context, hidden):
        return self.lookup.propose(list(context)[self.prompt_len:], hidden)


def sd14_lookup_runs(target, make_drafter, prompts, n_tokens: int = SD14_TOKENS) -> list:
    """Greedy tree speculation of ``target`` with ``make_drafter(prompt_len)`` (a fresh drafter
    per prompt) on each prompt ((1, S) int64), ``n_tokens`` tokens each: one statistics dict
    (``rounds``, ``emitted``, ``accepted``, ``drafted``; ``output``: the generated ids) per prompt,
    in order."""
    from inference_conformance.optimized.speculative_tree.engine import TreeSpeculativeEngine

    runs = []
    for prompt in prompts:
        engine = TreeSpeculativeEngine(target, make_drafter(prompt.shape[1]), max_seq_len=128, attention="torch")
        out, stats = engine.generate(prompt, n_tokens)
        runs.append({**stats, "output": out[0, prompt.shape[1]:].tolist()})
    return runs


@lru_cache(maxsize=None)
def sd14_target():
    """The shipped target in float64 (loaded once per process for SD-14's arms)."""
    import torch

    from inference_conformance.smallworld.checkpoints import load_model

    return load_model("target", torch.float64)


@lru_cache(maxsize=None)
def sd14_arm(arm: str) -> tuple:
    """The runs of one arm of SD-14 on :func:`sd14_target` (:func:`sd14_lookup_runs`, cached per process):
    "lookup" (the shipped prompt lookup on the copy prompts), "output-only" (the same lookup
    restricted to the output, :class:`OutputOnlyLookup`) or "free" (the lookup from <bos>)."""
    from inference_conformance.optimized.speculative.drafters import PromptLookupDrafter

    def lookup(S):
        return PromptLookupDrafter(SD14_NGRAM, SD14_GAMMA)

    def output_only(S):
        return OutputOnlyLookup(PromptLookupDrafter(SD14_NGRAM, SD14_GAMMA), S)

    make, prompts = {"lookup": (lookup, sd14_copy_prompts()), "output-only": (output_only, sd14_copy_prompts()),
                     "free": (lookup, free_prompts(1))}[arm]
    return tuple(sd14_lookup_runs(sd14_target(), make, prompts))


def tokens_per_call(stats: dict) -> float:
    """Tokens emitted per target call of an engine run's statistics (``emitted`` / ``rounds``)."""
    return stats["emitted"] / stats["rounds"]


def sd14_sign_test(lookup: list, baseline: list) -> tuple:
    """SD-14's paired comparison of two lists of per-prompt statistics (the same prompts, in
    order): (wins, losses, ties, p) where a win is a prompt on which ``lookup`` emits more tokens
    per call than ``baseline``, and p the one-sided sign test's p-value of "ahead" (ties
    dropped; 1.0 without a win or a loss). Raises ValueError when the lists differ in length or
    are empty."""
    from scipy.stats import binomtest

    if len(lookup) != len(baseline) or not lookup:
        raise ValueError(f"lookup and baseline must hold the same prompts, got {len(lookup)} and {len(baseline)} runs")
    d = [tokens_per_call(a) - tokens_per_call(b) for a, b in zip(lookup, baseline)]
    wins, losses = sum(x > 0 for x in d), sum(x < 0 for x in d)
    p = binomtest(wins, wins + losses, 0.5, alternative="greater").pvalue if wins + losses else 1.0
    return wins, losses, len(d) - wins - losses, float(p)


def judge_sd14_lookup(lookup: list, baseline: list) -> str:
    """SD-14's prompt-lookup rule on paired per-prompt statistics of the copy prompts (``lookup``:
    the lookup searching prompt and output; ``baseline``: the same lookup restricted to the output,
    :class:`OutputOnlyLookup`): "holds" when the one-sided sign test finds ``lookup`` ahead at
    significance level SD14_LEVEL = 0.05, "fails" when it is not ahead (wins <= losses; a tie
    counts for neither), else "inconclusive" (ahead on more prompts than behind, too few prompts
    to decide). The level and the rule are fixed beforehand, not taken from the runs."""
    wins, losses, _, p = sd14_sign_test(lookup, baseline)
    return "holds" if p < SD14_LEVEL else "fails" if wins <= losses else "inconclusive"


def check_sd14_lookup(lookup: list, baseline: list) -> str:
    """:func:`judge_sd14_lookup` as a check: returns "holds"; raises AssertionError naming the
    verdict, the wins, losses and ties of the paired prompts and the p-value otherwise."""
    verdict = judge_sd14_lookup(lookup, baseline)
    wins, losses, ties, p = sd14_sign_test(lookup, baseline)
    assert verdict == "holds", (
        f"SD-14: prompt lookup {'not ahead of' if verdict == 'fails' else 'undecided against'} the same lookup "
        f"restricted to the output ({verdict}): tokens per call ahead on {wins}, behind on {losses}, tied on {ties} of "
        f"{wins + losses + ties} copy prompts, sign test p = {p:.3g} (rule: holds at p < {SD14_LEVEL}, fails where "
        "wins <= losses)")
    return verdict


#: The statistics ``test_sd14_self_speculation_against_the_shipped_drafts`` measures (γ = 4 greedy
#: chains in float64, free generation and one copy prompt, 32 tokens each): the rejection tests'
#: good input, which that test checks against its live run (exact counts).
SD14_RECORDED = {"self (block 1 skipped)": dict(rounds=19, emitted=67, accepted=48, drafted=76),
                 "draft_good": dict(rounds=29, emitted=65, accepted=36, drafted=116),
                 "draft_poor": dict(rounds=30, emitted=65, accepted=35, drafted=120)}


def check_sd14_figures(table: dict) -> None:
    """SD-14's figures of self-speculation and the shipped drafts: ``table`` {drafter: (α =
    accepted / drafted, tokens per target call)} at γ = 4; every α in [0, 1] (a fraction of the
    drafted tokens) and tokens per call in [1, γ + 1 = 5] (a round emits its accepted tokens and
    one more)."""
    for name, (a, t) in table.items():
        assert 0 <= a <= 1 and 1 <= t <= 5, (f"SD-14: {name}: alpha {a:.3g}, tokens per call {t:.3g} outside their "
                                             "ranges (rule: alpha in [0, 1], tokens per call in [1, gamma + 1 = 5])")
