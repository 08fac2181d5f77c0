"""Drafters of tree speculation (the ``drafter`` contract, ``conformance/contracts/drafter.py``;
claims SD-12, SD-14; lecture 002 §2 and §6.6): each ``propose(context, hidden, target)`` returns
(parents, tokens), a token tree to try after the committed tokens ``context``, given the target's
final hidden state at the last committed token where the engine computed it (else None), as
:class:`inference_conformance.optimized.speculative_tree.engine.TreeSpeculativeEngine` takes it:
a draft model's greedy chain (:class:`ChainDrafter`) or its top-k tree (:class:`TopKTreeDrafter`),
self-speculation with skipped blocks (:class:`SelfSpeculativeDrafter`) and Medusa-style heads
(:class:`HeadsDrafter`); prompt lookup, which needs no model, is the reference
(``reference/drafter.py``: ``PromptLookupDrafter``). Every argmax and top-k runs over the
tokenizer's V = ``target.cfg.vocab_size`` ids only: a checkpoint's output matrix may have padded
rows past V, which are no token.
"""
from __future__ import annotations

from functools import lru_cache

import torch

from inference_conformance.conformance.contracts.drafter import validate
from inference_conformance.reference.transformer import Transformer


@lru_cache(maxsize=None)
def _shipped(name: str, dtype: torch.dtype, device: str) -> Transformer:
    from inference_conformance.smallworld.checkpoints import load_model

    with torch.random.fork_rng(devices=[]):           # the modules' initialisation draws: not from the caller's
        return load_model(name, dtype, device)


def shipped_draft(target: Transformer, name: str = "draft_good") -> Transformer:
    """The small world's shipped draft ``name`` ("draft_good" or "draft_poor") in ``target``'s
    dtype on its device (read once per process and dtype). Raises FileNotFoundError for a missing
    checkpoint."""
    w = target.output_weight()
    return _shipped(name, w.dtype, str(w.device))


class ChainDrafter:
    """γ greedy tokens of a draft model (recomputed over the whole context each step: the draft is
    small). ``draft``: a Transformer over the target's vocabulary, or None for the shipped
    "draft_good" in the target's dtype; ``gamma`` >= 1 (ValueError naming gamma otherwise)."""

    def __init__(self, draft: Transformer | None = None, gamma: int = 4):
        if not isinstance(gamma, int) or gamma < 1:
            raise ValueError(f"gamma must be an int >= 1, got {gamma!r}")
        self.draft, self.gamma = draft, gamma

    def draft_for(self, target: Transformer) -> Transformer:
        """The model this drafter drafts with for ``target``."""
        return self.draft if self.draft is not None else shipped_draft(target)

    @torch.no_grad()
    def propose(self, context, hidden, target):
        """(parents, tokens): the chain [-1, 0, ..., γ - 2] of the draft's γ greedy tokens."""
        validate(context, hidden, target)
        draft = self.draft_for(target)
        seq = list(context)
        for _ in range(self.gamma):
            window = seq[-draft.cfg.max_seq_len:]
            logits = draft(torch.tensor([window], device=target.output_weight().device))[0, -1]
            seq.append(int(logits[:target.cfg.vocab_size].argmax()))     # padded rows past V are no token
        new = seq[len(context):]
        return list(range(-1, len(new) - 1)), new


class TopKTreeDrafter:
    """A token tree from a draft model: the ``widths[d]`` most probable tokens as the children of
    every node of depth d (SpecInfer's expansion; width 1 is a chain). ``draft``: a Transformer
    or None for the shipped "draft_good" in the target's dtype."""

    def __init__(self, draft: Transformer | None = None, widths=(2, 2, 1)):
        self.draft, self.widths = draft, tuple(widths)

    @torch.no_grad()
    def propose(self, context, hidden, target):
        validate(context, hidden, target)
        draft = self.draft if self.draft is not None else shipped_draft(target)
        dev = target.output_weight().device
        parents, tokens, paths = [], [], {-1: []}
        frontier = [-1]
        for w in self.widths:
            nxt = []
            for u in frontier:
                seq = list(context) + paths[u]
                top = draft(torch.tensor([seq], device=dev))[0, -1, :target.cfg.vocab_size].topk(w).indices.tolist()
                for x in top:
                    parents.append(u)
                    tokens.append(int(x))
                    paths[len(tokens) - 1] = paths[u] + [int(x)]
                    nxt.append(len(tokens) - 1)
            frontier = nxt
        return parents, tokens


def without_blocks(target: Transformer, skip) -> Transformer:
    """``target`` with its blocks ``skip`` left out: a shallow copy whose block list is new, the
    weights shared (nothing copied, ``target`` unchanged)."""
    import copy

    import torch.nn as nn

    shallow = copy.copy(target)
    shallow._modules = dict(target._modules)
    shallow._modules["blocks"] = nn.ModuleList(b for i, b in enumerate(target.blocks) if i not in set(skip))
    return shallow


class SelfSpeculativeDrafter(ChainDrafter):
    """Self-speculation (Draft & Verify, Zhang et al. 2024; LayerSkip): the target it is given with
    its blocks ``skip`` left out (:func:`without_blocks`) drafts γ greedy tokens."""

    def __init__(self, skip=(1,), gamma: int = 3):
        super().__init__(None, gamma)
        self.skip, self._made = tuple(skip), (None, None)

    def draft_for(self, target: Transformer) -> Transformer:
        if self._made[0] is not target:
            self._made = (target, without_blocks(target, self.skip))
        return self._made[1]


class HeadsDrafter:
    """Medusa-style heads on the target (Cai et al. 2024): from the target's final hidden state
    at the last committed token, the base head's argmax is that token's successor (the pending
    token the round scores anyway) and head j's argmax the token j places after it; proposes that
    chain of len(heads) tokens (nothing in a round without a hidden state, the first). ``heads``:
    a :class:`inference_conformance.smallworld.heads.MedusaHeads`, or None for the shipped heads
    over the target it is given."""

    def __init__(self, heads=None):
        self.heads, self._made = heads, (None, None)

    def heads_for(self, target: Transformer):
        if self.heads is not None:
            return self.heads
        if self._made[0] is not target:
            from inference_conformance.smallworld.heads import shipped_heads

            with torch.random.fork_rng(devices=[]):       # the heads' initialisation draws: not from the caller's
                self._made = (target, shipped_heads().over(target))
        return self._made[1]

    @torch.no_grad()
    def propose(self, context, hidden, target):
        validate(context, hidden, target)
        if hidden is None:
            return [], []
        heads = self.heads_for(target)
        logits = heads(hidden[None].to(heads.dtype))[:, 0, :target.cfg.vocab_size]      # padded rows: no token
        new = [int(x) for x in logits.argmax(-1).tolist()]
        return list(range(-1, len(new) - 1)), new


def implementations():
    """The suite's drafters over the small world: the good draft's greedy chain (γ = 4) and top-k
    tree (2, 2, 1), the shipped Medusa-style heads, self-speculation without block 1 (γ = 3); and
    vLLM's n-gram drafter (:mod:`inference_conformance.optimized.drafter.outside_vllm`)."""
    from inference_conformance.conformance.registry import builtin
    from inference_conformance.optimized.drafter.outside_vllm import drafter_registrations

    return (
        builtin("drafter", "draft_chain", ChainDrafter(None, 4)),
        builtin("drafter", "draft_tree", TopKTreeDrafter(None, (2, 2, 1))),
        builtin("drafter", "heads", HeadsDrafter()),
        builtin("drafter", "self_speculation", SelfSpeculativeDrafter((1,), 3)),
        *drafter_registrations(),
    )
