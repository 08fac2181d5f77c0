"""The paged engine's per-request state (``optimized/paged_attention/engine.py``; claims PA-6..PA-9): a
request as the engine runs it (:class:`EngineRequest`) and a request handed from one engine to
another (:class:`RequestState`, PA-9; the K/V travel in the ``kv_transfer`` implementation's own payload).
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
class RequestState:
    """A request's state as one engine hands it to another (PA-9; the ``kv_transfer`` contract's
    engine surface): ``request_id``, its ``prompt`` and generated tokens ``out`` (lists of ints),
    ``max_new`` tokens it may generate in all, ``temperature`` and ``generator`` (its sampling
    state, used as is), ``length``: the tokens whose K/V the sender computed (every token but the
    last sampled one), ``logits``: the logits (V,) it sampled from so far (with ``keep_logits``)."""

    request_id: object
    prompt: list
    out: list
    max_new: int
    temperature: float
    generator: torch.Generator | None
    length: int
    logits: list = field(default_factory=list)
