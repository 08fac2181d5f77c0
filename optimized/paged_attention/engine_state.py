"""The paged engine's per-request state (``optimized/paged_attention/engine.py``; claims PA-6..PA-9): a
request as the engine runs it (:class:`EngineRequest`) and a request handed from one engine to
another with the K/V of its computed tokens (:class:`KVTransfer`, PA-9).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class EngineRequest:
    """A request as the engine runs it: its prompt and generated tokens (``out``), sampling state,
    how many tokens' K/V are in the cache (``computed``) and the prefix-cache keys of its full
    computed blocks (``keys``)."""

    rid: object
    prompt: list
    max_new: int
    temperature: float
    generator: torch.Generator | None
    out: list = field(default_factory=list)
    computed: int = 0          # tokens whose K/V are in the cache
    keys: list = field(default_factory=list)   # prefix-cache keys of its full computed blocks

    @property
    def tokens(self) -> list:
        return self.prompt + self.out


@dataclass
class KVTransfer:
    """A request handed from one engine to another (PA-9): its tokens, sampling state and the K/V
    of its first ``length`` tokens as the sender's blocks: ``block_ids`` (the sender's ids, in
    logical order), ``block_size`` (the sender's), ``k``, ``v`` (per layer (len(block_ids),
    block_size, Hkv, D), block i holding tokens i·block_size ..). ``logits``: the logits it
    sampled from so far (with ``keep_logits``)."""

    rid: object
    prompt: list
    out: list
    max_new: int
    temperature: float
    generator: torch.Generator | None
    length: int
    block_size: int
    block_ids: list
    k: list
    v: list
    logits: list = field(default_factory=list)
