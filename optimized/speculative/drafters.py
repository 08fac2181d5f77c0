"""Drafters of tree speculation (claims SD-12, SD-14; lecture 002 §2): each ``propose(context,
hidden)`` returns (parents, tokens), a token tree to try after the committed tokens ``context``
(a list of ids), given the target's final hidden state after the last committed token where the
engine computed it (else None), as :class:`inference_conformance.optimized.speculative_tree.engine.TreeSpeculativeEngine`
takes it: a draft model's greedy chain (:class:`ChainDrafter`) or its top-k tree
(:class:`TopKTreeDrafter`), self-speculation with skipped layers (:class:`SelfSpeculativeDrafter`),
prompt lookup (:class:`PromptLookupDrafter`) and Medusa-style heads (:class:`HeadsDrafter`).
"""
from __future__ import annotations

import torch

from inference_conformance.reference.transformer import Transformer


class ChainDrafter:
    """γ greedy tokens of a draft model (recomputed over the context each step: the draft is small)."""

    def __init__(self, draft: Transformer, gamma: int):
        self.draft, self.gamma = draft, gamma

    @torch.no_grad()
    def propose(self, context, hidden):
        seq = list(context)
        for _ in range(self.gamma):
            seq.append(int(self.draft(torch.tensor([seq[-self.draft.cfg.max_seq_len:]]))[0, -1].argmax()))
        new = seq[len(context):]
        return list(range(-1, len(new) - 1)), new


class TopKTreeDrafter:
    """A token tree from a draft model: the ``widths[d]`` most probable tokens as the children of
    every node of depth d (SpecInfer's expansion; width 1 is a chain)."""

    def __init__(self, draft: Transformer, widths=(2, 2, 1)):
        self.draft, self.widths = draft, tuple(widths)

    @torch.no_grad()
    def propose(self, context, hidden):
        parents, tokens, paths = [], [], {-1: []}
        frontier = [-1]
        for w in self.widths:
            nxt = []
            for u in frontier:
                seq = list(context) + paths[u]
                top = self.draft(torch.tensor([seq]))[0, -1].topk(w).indices.tolist()
                for x in top:
                    parents.append(u)
                    tokens.append(int(x))
                    paths[len(tokens) - 1] = paths[u] + [int(x)]
                    nxt.append(len(tokens) - 1)
            frontier = nxt
        return parents, tokens


class SelfSpeculativeDrafter(ChainDrafter):
    """Self-speculation (Draft & Verify, Zhang et al. 2024; LayerSkip): the target with its blocks
    ``skip`` left out (weights shared, nothing copied) drafts γ greedy tokens."""

    def __init__(self, target: Transformer, skip, gamma: int):
        import copy

        import torch.nn as nn

        shallow = copy.copy(target)
        shallow._modules = dict(target._modules)
        shallow._modules["blocks"] = nn.ModuleList(b for i, b in enumerate(target.blocks) if i not in set(skip))
        super().__init__(shallow, gamma)


class PromptLookupDrafter:
    """Prompt lookup (Saxena 2023; lookahead decoding's n-gram pool in its simplest form): find the
    latest earlier occurrence of the context's last ``ngram`` tokens (trying ``ngram`` down to 1)
    and propose the ``gamma`` tokens that followed it; nothing when there is none."""

    def __init__(self, ngram: int = 3, gamma: int = 5):
        self.ngram, self.gamma = ngram, gamma

    def propose(self, context, hidden):
        ctx = list(context)
        for n in range(min(self.ngram, len(ctx) - 1), 0, -1):
            key = ctx[-n:]
            for s in self.starts(len(ctx), n):
                if ctx[s:s + n] == key:
                    new = ctx[s + n:s + n + self.gamma]
                    return list(range(-1, len(new) - 1)), new
        return [], []

    def starts(self, length: int, n: int) -> range:
        """Where an earlier occurrence of the last ``n`` of ``length`` tokens may start, latest
        first: every position before the key's own (length - n)."""
        return range(length - n - 1, -1, -1)


class HeadsDrafter:
    """Medusa-style heads on the target (Cai et al. 2024): from the target's final hidden state
    after the last committed token, the base head's argmax is that token's successor (the pending
    token the round scores anyway) and head j's argmax the token j places after it; proposes that
    chain of len(heads) tokens (nothing in a round without a hidden state, the first)."""

    def __init__(self, target: Transformer, heads):
        self.target, self.heads = target, heads

    @torch.no_grad()
    def propose(self, context, hidden):
        if hidden is None:
            return [], []
        new = [int(x) for x in self.heads(hidden[None].to(self.heads.dtype))[:, 0].argmax(-1).tolist()]
        return list(range(-1, len(new) - 1)), new
