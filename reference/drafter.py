"""The reference of the ``drafter`` contract (``conformance/contracts/drafter.py``; claims SD-12,
SD-14; lecture 002 §2): prompt lookup (Saxena 2023; lookahead decoding's n-gram pool in its
simplest form), the drafter that needs no model: the latest earlier occurrence of the context's
last n-gram, and the tokens that followed it, searched with plain loops.
"""
from __future__ import annotations

from inference_conformance.conformance.contracts.drafter import validate


class PromptLookupDrafter:
    """Prompt lookup: find the latest earlier occurrence of the context's last ``ngram`` tokens
    (trying ``ngram`` down to 1) and propose the ``gamma`` tokens that followed it, as a chain;
    nothing when there is none. ``ngram``, ``gamma`` >= 1 (ValueError naming them otherwise)."""

    def __init__(self, ngram: int = 3, gamma: int = 5):
        for name, v in (("ngram", ngram), ("gamma", gamma)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        self.ngram, self.gamma = ngram, gamma

    def propose(self, context, hidden, target):
        """(parents, tokens): the chain of at most γ tokens that followed the latest earlier match."""
        validate(context, hidden, target)
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


def implementations():
    """The reference drafter: prompt lookup with 3-grams, γ = 5."""
    from inference_conformance.conformance.registry import builtin

    return (builtin("drafter", "reference", PromptLookupDrafter(3, 5)),)
