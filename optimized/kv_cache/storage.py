"""An engine of the ``kv_cache`` contract over a cache *storage*: the suite's own model forward
drives any object with ``update(k, v, layer) -> (k_all, v_all)`` (transformers' ``Cache``
classes have exactly that call), so a real cache plugs in without an engine of its own.

:class:`StorageEngine` runs :meth:`inference_conformance.reference.transformer.Transformer.forward` with a
:class:`StorageAttention` as its attention backend. A prefill makes a new storage
(``new_cache(cfg, batch, max_seq_len, dtype, device)``) and hands it the right-padded batch:
columns 0..S-1 of every row, padding included (a rectangular storage holds it; the mask hides
it). Decode step i appends column S + i for every row, at RoPE position ``lengths[b] + i`` of
row b, and each row's query sees its own prompt columns ``[0, lengths[b])`` and the decoded
columns ``[S, S + i]``. What ``update`` returns is aligned to those columns: its first W
columns when it returns at least the W written (a static storage returns its whole capacity),
else its last columns (a sliding window). ``kv(layer, seq)`` reads the columns of sequence
``seq`` from the storage itself: an ``update`` with no new column returns what it holds.

``cache_bytes()`` is measured from the storage's tensors
(:func:`inference_conformance.conformance.contracts.kv_cache.held_bytes`), never computed; ``footprint()`` is the
layout the storage holds by design (:class:`inference_conformance.conformance.contracts.kv_cache.Footprint`), given
by whoever wraps the storage (the adapters of :mod:`inference_conformance.optimized.kv_cache.outside_transformers`).

Validation is the contract's (:func:`inference_conformance.conformance.contracts.kv_cache.check_ids`, as the suite's
own engine): the same TypeError/ValueError, naming the argument, before anything reaches the
storage.

Source: lecture 001 §1.1 (prefill and decode), §2 (the KV cache); claims KV-1, KV-2, KV-4, KV-10.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

import torch

from inference_conformance.conformance.contracts.kv_cache import Footprint, check_ids, check_prefill_shape, held_bytes
from inference_conformance.optimized.kv_cache.append import INDEX_DTYPE
from inference_conformance.reference.transformer import Transformer, naive_attention


@dataclass
class StorageAttention:
    """The attention backend of one forward over a storage: ``written`` columns after this
    forward's ``update`` (every row), ``visible`` (B, written) bool: the columns each row may
    read, ``causal``: the forward's new tokens also see only earlier new tokens (a prefill).
    Nothing of what ``update`` returns is kept after the forward (the engine holds only what
    the storage holds)."""

    storage: Any
    written: int
    visible: torch.Tensor
    causal: bool

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (B, Hq, T, D), k, v (B, Hkv, T, D) after RoPE -> attention output (B, Hq, T, D)."""
        k_all, v_all = self.storage.update(k, v, layer)
        width = k_all.shape[2]
        first = 0 if width >= self.written else self.written - width
        k_all = k_all[:, :, :self.written - first].to(q.dtype)
        v_all = v_all[:, :, :self.written - first].to(q.dtype)
        T = q.shape[2]
        mask = self.visible[:, first:][:, None, None, :].expand(-1, 1, T, -1)      # (B, 1, T, cols)
        if self.causal:
            col = torch.arange(first, self.written, device=q.device)
            row = torch.arange(self.written - T, self.written, device=q.device)
            mask = mask & (col[None, :] <= row[:, None])[None, None]
        return naive_attention(q, k_all, v_all, mask)


class StorageEngine:
    """The ``kv_cache`` contract's engine over the storages ``new_cache`` makes (one per
    prefill), for ``model`` (a reference Transformer, used as it is), up to ``max_batch``
    sequences of ``max_seq_len`` tokens. ``footprint`` is what the storage holds by design.
    Raises TypeError for a model that is not a reference Transformer, ValueError for a
    non-positive ``max_batch``/``max_seq_len`` or one above the model's."""

    def _check_ids(self, x, name: str, dim: int) -> None:
        check_ids(x, name, dim, self.device)

    def _check_vocab(self, x, name: str) -> None:
        check_ids(x, name, x.dim(), self.device, self.cfg.vocab_size)

    def __init__(self, model: Transformer, max_batch: int, max_seq_len: int, new_cache: Callable,
                 footprint: Footprint):
        if not isinstance(model, Transformer):
            raise TypeError(f"model must be a inference_conformance.reference.transformer.Transformer, got {type(model).__name__}")
        for name, v in (("max_batch", max_batch), ("max_seq_len", max_seq_len)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if max_seq_len > model.cfg.max_seq_len:
            raise ValueError(f"max_seq_len ({max_seq_len}) must be <= the model's max_seq_len ({model.cfg.max_seq_len})")
        self.model, self.cfg = model, model.cfg
        w = model.embed.weight
        self.dtype, self.device = w.dtype, w.device
        self.max_batch, self.max_seq_len = max_batch, max_seq_len
        self._new_cache, self._footprint = new_cache, footprint
        self.storage = None
        self._lengths = torch.zeros(0, dtype=INDEX_DTYPE)       # (B,) on the CPU
        self._prompt_cols = 0                                    # S of the last prefill
        self._written = 0                                        # columns written per row

    def footprint(self) -> Footprint:
        """The layout the storage holds by design."""
        return self._footprint

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Start B new sequences from right-padded prompts (B, S); returns logits (B, S, V).
        Raises TypeError/ValueError as the suite engine's prefill."""
        self._check_ids(tokens, "tokens", 2)
        self._check_ids(lengths, "lengths", 1)
        host = check_prefill_shape(tokens, lengths, self.max_batch, self.max_seq_len)
        B, S = tokens.shape
        self._check_vocab(tokens, "tokens")
        self.storage = None                                      # a prefill forgets every sequence
        storage = self._new_cache(self.cfg, B, self.max_seq_len, self.dtype, self.device)
        visible = torch.arange(S, device=self.device)[None, :] < lengths[:, None]   # (B, S)
        attention = StorageAttention(storage, S, visible, True)
        logits = self.model(tokens, torch.arange(S, device=self.device).expand(B, S), attention)
        self.storage, self._lengths, self._prompt_cols, self._written = storage, host.clone(), S, S
        self._visible = visible
        return logits

    @torch.no_grad()
    def decode(self, next_tokens: torch.Tensor) -> torch.Tensor:
        """Append one token to each sequence of the last prefill; returns logits (B, V). Raises
        RuntimeError before any prefill, TypeError/ValueError as the suite engine's decode."""
        if self.storage is None:
            raise RuntimeError("decode called before prefill: there are no sequences to extend")
        self._check_ids(next_tokens, "next_tokens", 1)
        B = self._lengths.shape[0]
        if next_tokens.shape != (B,):
            raise ValueError(f"next_tokens must have shape ({B},) (one token per sequence of the last "
                             f"prefill), got {tuple(next_tokens.shape)}")
        self._check_vocab(next_tokens, "next_tokens")
        if self._written + 1 > self.max_seq_len:
            raise ValueError(f"next_tokens would grow a sequence past the cache capacity "
                             f"max_seq_len={self.max_seq_len} (lengths {self._lengths.tolist()})")
        positions = self._lengths.to(self.device)[:, None]                              # (B, 1): each length
        visible = torch.cat([self._visible, torch.ones(B, 1, dtype=torch.bool, device=self.device)], dim=1)
        attention = StorageAttention(self.storage, self._written + 1, visible, False)
        logits = self.model(next_tokens[:, None], positions, attention)               # (B, 1, V)
        self._visible, self._written = visible, self._written + 1
        self._lengths = self._lengths + 1
        return logits[:, 0]

    def lengths(self) -> torch.Tensor:
        """(B,) int64 on the CPU: tokens cached per sequence of the last prefill."""
        return self._lengths.clone()

    def cache_bytes(self) -> int:
        """Bytes the storage holds, measured from its tensors (0 before any prefill)."""
        return held_bytes(self.storage)

    def kv(self, layer: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sequence ``seq``'s cached keys and values at ``layer`` (Hkv, n, D) each, read from the
        storage (its ``held(layer)`` where it has one, else an ``update`` with no new column;
        its visible columns).
        Raises IndexError for a layer or seq out of range."""
        if not 0 <= layer < self.cfg.n_layers:
            raise IndexError(f"layer {layer} out of range [0, {self.cfg.n_layers})")
        if not 0 <= seq < self._lengths.shape[0]:
            raise IndexError(f"seq {seq} out of range [0, {self._lengths.shape[0]})")
        c = self.cfg
        if callable(getattr(self.storage, "held", None)):
            k, v = self.storage.held(layer)
        else:                                                # no new column: what the storage holds
            empty = torch.zeros(self._lengths.shape[0], c.n_kv_heads, 0, c.hd, dtype=self.dtype, device=self.device)
            k, v = self.storage.update(empty, empty, layer)
        k, v = k.to(self.device), v.to(self.device)           # an offloading storage holds them elsewhere
        first = 0 if k.shape[2] >= self._written else self._written - k.shape[2]
        cols = self._visible[seq, first:]
        held = self._written - first
        return k[seq, :, :held][:, cols].to(self.dtype), v[seq, :, :held][:, cols].to(self.dtype)


def storage_engine(new_cache: Callable, footprint: Footprint = Footprint("exact")) -> SimpleNamespace:
    """A ``kv_cache`` implementation (``new_engine``) over the storages ``new_cache(cfg, batch,
    max_seq_len, dtype, device)`` makes, holding ``footprint`` by design."""
    def new_engine(model: Transformer, max_batch: int, max_seq_len: int) -> StorageEngine:
        return StorageEngine(model, max_batch, max_seq_len, new_cache, footprint)

    return SimpleNamespace(new_engine=new_engine)
