"""Known-bad drafters (the bug zoo): each one is a bug of the field's drafters, and the laws of
``properties/drafter/laws.py`` must reject every one: SD-12's (greedy speculation emits
greedy decoding; the context, hidden state, target, global generators and tree checked each
round) the first four, SD-14's (the figures replay from the proposals, each proposal reproduced
when asked again after another context) the next two, and SD-12's proposals on a target whose
output matrix is padded past the tokenizer's vocabulary the last (heads whose argmax runs over
the padded rows).

Each is a built-in drafter (``reference/drafter.py``, ``optimized/drafter/``) with one step
changed, so that only the bug makes it wrong.
"""
from __future__ import annotations

import torch

from inference_conformance.optimized.drafter import ChainDrafter, HeadsDrafter, SelfSpeculativeDrafter
from inference_conformance.reference.drafter import PromptLookupDrafter


class SkipsLayersInPlace(SelfSpeculativeDrafter):
    """Self-speculation that leaves out the skipped block by deleting it from the target's own block
    list (no copy of the list), so the target that verifies runs without it too."""

    def draft_for(self, target):
        if len(target.blocks) == target.cfg.n_layers:
            for i in sorted(self.skip, reverse=True):
                del target.blocks[i]
        return target


class ParentsCountedFromThePendingToken(ChainDrafter):
    """A chain whose parent pointers count the pending token as node 0 (the engine's internal tree,
    where the root is the last committed token): ``parents = [0, 1, ..., γ - 1]``, one more than the
    contract's ``[-1, 0, ..., γ - 2]``, so node i names itself as its parent."""

    def propose(self, context, hidden, target):
        parents, tokens = super().propose(context, hidden, target)
        return [p + 1 for p in parents], tokens


class ExtendsTheContextInPlace(PromptLookupDrafter):
    """Prompt lookup that appends what it proposes to the context list it was given (a lookahead
    pool that extends its search window in place), changing the caller's committed tokens."""

    def propose(self, context, hidden, target):
        parents, tokens = super().propose(context, hidden, target)
        context.extend(tokens)
        return parents, tokens


class SamplesWithTheGlobalGenerator(ChainDrafter):
    """A draft chain that samples each draft token from the draft's softmax with torch's global
    generator instead of taking its argmax: greedy verification still emits greedy decoding, but
    each call proposes another chain, so its α and tokens per call are not reproducible."""

    @torch.no_grad()
    def propose(self, context, hidden, target):
        draft = self.draft_for(target)
        seq = list(context)
        for _ in range(self.gamma):
            probs = torch.softmax(draft(torch.tensor([seq]))[0, -1].double(), -1)
            seq.append(int(torch.multinomial(probs, 1)))
        new = seq[len(context):]
        return list(range(-1, len(new) - 1)), new


class IndexKeptAcrossSequences(PromptLookupDrafter):
    """Prompt lookup over an incremental n-gram index that each call extends with the tokens past
    the length it has seen and rebuilds only when a context is shorter than the last one, so a
    new sequence at least as long as the last is searched in the old sequence's tokens."""

    def __init__(self, ngram: int = 3, gamma: int = 5):
        super().__init__(ngram, gamma)
        self.seen: list = []

    def propose(self, context, hidden, target):
        ctx = list(context)
        if len(ctx) < len(self.seen):
            self.seen = []
        self.seen = self.seen + ctx[len(self.seen):]
        return super().propose(self.seen, hidden, target)


class HeadsArgmaxOverPaddedRows(HeadsDrafter):
    """Medusa-style heads whose argmax runs over every row of the target's output matrix, the
    padding past the tokenizer's vocabulary included, so that where a padded row wins they
    propose an id that is no token."""

    @torch.no_grad()
    def propose(self, context, hidden, target):
        if hidden is None:
            return [], []
        heads = self.heads_for(target)
        new = [int(x) for x in heads(hidden[None].to(heads.dtype))[:, 0].argmax(-1).tolist()]
        return list(range(-1, len(new) - 1)), new


def _bug(cls) -> str:
    """The first sentence of a known-bad drafter's docstring (its one-line bug)."""
    return " ".join(cls.__doc__.split()).split(". ")[0].rstrip(".")


def implementations():
    """The known-bad drafters: SD-12's and SD-14's laws name each in their ``kills``."""
    from inference_conformance.conformance.registry import known_bad

    return (
        known_bad("drafter", "skips_layers_in_place", SkipsLayersInPlace((1,), 3), bug=_bug(SkipsLayersInPlace)),
        known_bad("drafter", "parents_counted_from_the_pending_token", ParentsCountedFromThePendingToken(None, 4),
                  bug=_bug(ParentsCountedFromThePendingToken)),
        known_bad("drafter", "extends_the_context_in_place", ExtendsTheContextInPlace(3, 5),
                  bug=_bug(ExtendsTheContextInPlace)),
        known_bad("drafter", "samples_with_the_global_generator", SamplesWithTheGlobalGenerator(None, 4),
                  bug=_bug(SamplesWithTheGlobalGenerator)),
        known_bad("drafter", "index_kept_across_sequences", IndexKeptAcrossSequences(3, 5),
                  bug=_bug(IndexKeptAcrossSequences)),
        known_bad("drafter", "heads_argmax_over_padded_rows", HeadsArgmaxOverPaddedRows(),
                  bug=_bug(HeadsArgmaxOverPaddedRows)),
    )
