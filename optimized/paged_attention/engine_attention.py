"""The attention backend of the paged engine (``optimized/paged_attention/engine.py``; PA-6, PA-8): the
model's one forward calls :class:`PagedCacheAttention`, which writes each layer's new keys and
values into their slots and calls a ``paged_attention`` (one query per token) or
``paged_prefill`` (the step's mixed batch) implementation; :func:`torch_write` is the default
cache write (PyTorch ``index_copy_``).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


def torch_write(k_cache, v_cache, k, v, slot_mapping) -> None:
    """Write ``k``, ``v`` (N, Hkv, D) into slots ``slot_mapping`` (N,) of ``k_cache``, ``v_cache``
    (num_blocks, block_size, Hkv, D), in place (PyTorch ``index_copy_``)."""
    nb, bs, hkv, d = k_cache.shape
    idx = slot_mapping.to(torch.int64)
    k_cache.view(nb * bs, hkv, d).index_copy_(0, idx, k)
    v_cache.view(nb * bs, hkv, d).index_copy_(0, idx, v)


@dataclass
class PagedCacheAttention:
    """The attention backend (:class:`inference_conformance.reference.transformer.AttentionCache`) of one step's
    forward over a paged cache: the forward's N tokens, of several sequences, are one row
    (B = 1, T = N) of the token matrix.

    Each layer writes token i's k, v into slot ``slots[i]`` of its layer's caches
    (``write(k_caches[layer], v_caches[layer], k (N, Hkv, D), v, slots)``; caches
    (num_blocks, block_size, Hkv, D)), then calls ``attention`` (a ``paged_attention``
    implementation) with one query per token, the block table of the token's sequence
    (``tables``: (N, max_blocks) int32) and ``seq_lens`` (N,) int32 = the keys it sees.
    """

    k_caches: list
    v_caches: list
    write: Callable
    attention: Callable
    tables: torch.Tensor
    slots: torch.Tensor
    seq_lens: torch.Tensor
    scale: float
    #: the mixed-batch path: a ``paged_prefill`` implementation and its per-sequence block table
    #: (R, max_blocks), seq_lens (R,) and query_start_loc (R + 1,); None: one query per token
    prefill: Callable | None = None
    seq_tables: torch.Tensor | None = None
    seq_seq_lens: torch.Tensor | None = None
    query_start_loc: torch.Tensor | None = None

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (1, Hq, N, D), k, v (1, Hkv, N, D) after RoPE -> attention output (1, Hq, N, D): the
        step's K/V written first, then attention over the cache (the chunk sees its own keys)."""
        self._write(layer, k, v)
        return self._attend(layer, q)

    def _write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.write(self.k_caches[layer], self.v_caches[layer], k[0].transpose(0, 1).contiguous(),
                   v[0].transpose(0, 1).contiguous(), self.slots)

    def _attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        k_cache, v_cache = self.k_caches[layer], self.v_caches[layer]
        qt = q[0].transpose(0, 1).contiguous()                               # (N, Hq, D)
        if self.prefill is not None:
            out = self.prefill(qt, k_cache, v_cache, self.seq_tables, self.seq_seq_lens, self.query_start_loc,
                               scale=self.scale)
        else:
            out = self.attention(qt, k_cache, v_cache, self.tables, self.seq_lens, scale=self.scale)
        return out.transpose(0, 1)[None]
