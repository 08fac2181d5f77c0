"""Known-bad KV-cache engines (the bug zoo of the ``kv_cache`` contract).

Each is the PyTorch engine with one classic mistake; the laws in
:mod:`inference_conformance.properties.kv_cache.test_kv_cache` must reject every one (each law names the ones it kills in
``@pytest.mark.kills``).

- ``drop_oldest``: a bounded cache that evicts the oldest token at every decode step, so
  decoded tokens no longer see the start of the prompt (and the cache stops growing).
- ``no_rope_offset``: the decoded token is rotated at RoPE position 0 instead of its own
  position (the offset of the cached prefix is forgotten).
- ``reads_past_length``: decode attends over the whole capacity, unwritten slots included.
- ``shared_positions``: batched decode uses one length for every sequence (the longest): the
  RoPE position, the write slot and the attention span of shorter sequences are wrong.
- ``pads_cached``: prefill caches the padding of shorter prompts as if it were prompt tokens.
- ``append_no_block_offset``: the append kernel tiles the new tokens in blocks of
  4096 // next_pow2(KV heads × head dim) and every block writes tokens ``arange(BLOCK_T)``
  instead of ``j * BLOCK_T + arange(BLOCK_T)``: invisible while one block covers the prompt
  (small heads), at Llama shapes (8 KV heads × 128, blocks of 4) every prefill longer than 4
  tokens keeps unwritten slots.
- ``rope_off_after_64_declared_lossy``: ``rope_off_after_64`` declaring itself a lossy cache of
  4-byte values within a per-value error of 8 (so that its logits' bound swallows the bug and
  the exact laws excuse it): no rounding of 32-bit values errs that much, so every law refuses
  the declaration (``conformance/contracts/kv_cache.py``, ``value_error_cap``).
- ``positions_in_model_dtype``: decode positions pass through the model's dtype before RoPE;
  bfloat16 holds integers exactly only up to 256, so position 257 is rotated as 256.

Two cache *storages* (``update(k, v, layer) -> (k_all, v_all)``, driven by
:func:`inference_conformance.optimized.kv_cache.storage.storage_engine`; a plain ``torch.cat`` storage with one mistake):

- ``under_reports_bytes``: reports the exact formula's bytes (Σ lengths slots) from
  ``cache_bytes()`` and declares the exact layout, while it holds the padded rectangle
  B × W of the batch (the hand adapter that self-reports instead of measuring).
- ``drops_layer_update``: layer 1 attends over its held columns plus the new ones but never
  keeps the new ones: from the second decode step on, that layer has lost every decoded token.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from inference_conformance.conformance.contracts.kv_cache import Footprint
from inference_conformance.optimized.kv_cache.append import kv_append_torch
from inference_conformance.optimized.kv_cache import KVCacheEngine
from inference_conformance.optimized.kv_cache.storage import StorageEngine, storage_engine


class _DropOldest(KVCacheEngine):
    def _prefill(self, tokens, lengths, host_lengths):
        out = super()._prefill(tokens, lengths, host_lengths)
        self._first = torch.zeros_like(lengths)  # (B,) oldest slot still kept
        self._host_first = torch.zeros_like(host_lengths)
        return out

    def _visible(self, new_lengths, span):
        pos = torch.arange(span, device=self.device)[None, :]
        return (pos < new_lengths[:, None]) & (pos >= self._first[:, None] + 1)

    def _decode(self, next_tokens):
        out = super()._decode(next_tokens)
        self._first = self._first + 1
        self._host_first = self._host_first + 1
        return out

    def cache_bytes(self):
        kept = self.cache.host_lengths[:self.batch] - self._host_first
        return self.cache.bytes_per_token() * int(kept.sum())

    def kv(self, layer, seq):
        k, v = super().kv(layer, seq)
        first = int(self._host_first[seq])
        return k[:, first:], v[:, first:]


class _NoRopeOffset(KVCacheEngine):
    def _decode_positions(self, lengths):
        return torch.zeros_like(lengths)


class _ReadsPastLength(KVCacheEngine):
    def _span(self, host_new_lengths):
        return self.cache.max_seq_len

    def _visible(self, new_lengths, span):
        return torch.ones(new_lengths.shape[0], span, dtype=torch.bool, device=self.device)


class _SharedPositions(KVCacheEngine):
    def _decode_positions(self, lengths):
        return torch.full_like(lengths, int(lengths.max()))

    def _write_slots(self, lengths):
        return torch.full_like(lengths, int(lengths.max()))

    def _visible(self, new_lengths, span):
        return super()._visible(torch.full_like(new_lengths, int(new_lengths.max())), span)


class _PadsCached(KVCacheEngine):
    def _prefill(self, tokens, lengths, host_lengths):
        B, S = tokens.shape
        return super()._prefill(tokens, torch.full_like(lengths, S), torch.full_like(host_lengths, S))


class _RopeOffAfter64(KVCacheEngine):
    """RoPE position off by one from position 64 on (an index wrap that shows only at length)."""

    def _decode_positions(self, lengths):
        return lengths + (lengths >= 64).to(lengths.dtype)


class _RopeOffAfter64DeclaredLossy(_RopeOffAfter64):
    def footprint(self) -> Footprint:
        return Footprint("reserved", bytes_per_value=4, value_rel_error=8.0, why="float32 values, 8 x per value")


class _StaleAfterReprefill(KVCacheEngine):
    """A second prefill on the same engine keeps a position offset from the first batch."""

    _prefills = 0

    def _prefill(self, tokens, lengths, host_lengths):
        self._prefills += 1
        return super()._prefill(tokens, lengths, host_lengths)

    def _decode_positions(self, lengths):
        return lengths + 1 if self._prefills > 1 else lengths


class _PositionsInModelDtype(KVCacheEngine):
    def _decode_positions(self, lengths):
        return lengths.to(self.dtype).to(lengths.dtype)


def _append_no_block_offset(k_cache, v_cache, k_new, v_new, start, count, host_start=None, host_count=None):
    """``inference_conformance.optimized.kv_cache.append.kv_append``'s tiling with the block offset forgotten: program j of
    sequence b copies tokens [0, BLOCK_T) instead of [j·BLOCK_T, (j+1)·BLOCK_T)."""
    B, Hkv, T, D = k_new.shape
    block_kh = 1 << max(0, (Hkv * D - 1).bit_length())                      # next power of two
    block_t = max(1, min(1 << max(0, (T - 1).bit_length()), 4096 // block_kh))
    first = min(T, block_t)
    kv_append_torch(k_cache, v_cache, k_new[:, :, :first], v_new[:, :, :first], start,
                    count.clamp(max=first), None if host_start is None else host_start,
                    None if host_count is None else host_count.clamp(max=first))


class _AppendNoBlockOffset(KVCacheEngine):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cache._append = _append_no_block_offset


class _CatStorage:
    """A storage that keeps, per layer, every column it was given (``torch.cat``)."""

    def __init__(self, cfg, batch, max_seq_len, dtype, device):
        self.k: dict = {}
        self.v: dict = {}

    def keep(self, layer: int) -> bool:
        return True

    def update(self, k, v, layer):
        k_all = torch.cat([self.k[layer], k], dim=2) if layer in self.k else k
        v_all = torch.cat([self.v[layer], v], dim=2) if layer in self.v else v
        if self.keep(layer) or layer not in self.k:
            self.k[layer], self.v[layer] = k_all, v_all
        return k_all, v_all


class _DropsLayerUpdate(_CatStorage):
    def keep(self, layer):
        return layer != 1


class _UnderReportsBytes(StorageEngine):
    def cache_bytes(self):
        c = self.cfg
        return 2 * c.n_layers * c.n_kv_heads * c.hd * self.model.embed.weight.element_size() * int(self._lengths.sum())


def _under_reports(model, max_batch, max_seq_len):
    return _UnderReportsBytes(model, max_batch, max_seq_len, _CatStorage, Footprint("exact"))


def _ns(cls):
    return SimpleNamespace(new_engine=lambda model, max_batch, max_seq_len: cls(model, max_batch, max_seq_len,
                                                                                  append="torch"))


DROP_OLDEST = _ns(_DropOldest)
NO_ROPE_OFFSET = _ns(_NoRopeOffset)
READS_PAST_LENGTH = _ns(_ReadsPastLength)
SHARED_POSITIONS = _ns(_SharedPositions)
PADS_CACHED = _ns(_PadsCached)
ROPE_OFF_AFTER_64 = _ns(_RopeOffAfter64)
ROPE_OFF_AFTER_64_DECLARED_LOSSY = _ns(_RopeOffAfter64DeclaredLossy)
STALE_AFTER_REPREFILL = _ns(_StaleAfterReprefill)
APPEND_NO_BLOCK_OFFSET = _ns(_AppendNoBlockOffset)
POSITIONS_IN_MODEL_DTYPE = _ns(_PositionsInModelDtype)
UNDER_REPORTS_BYTES = SimpleNamespace(new_engine=_under_reports)
DROPS_LAYER_UPDATE = storage_engine(_DropsLayerUpdate, Footprint("padded", why="torch.cat storage"))


def implementations():
    """The known-bad kv_cache implementations (the bug zoo): each law's ``kills`` names those it
    must reject."""
    from inference_conformance.conformance.registry import known_bad

    return (
        known_bad("kv_cache", "drop_oldest", DROP_OLDEST,
                  bug="drops the oldest cached token once the cache is full"),
        known_bad("kv_cache", "no_rope_offset", NO_ROPE_OFFSET,
                  bug="applies RoPE to a decoded token at position 0 instead of its length"),
        known_bad("kv_cache", "reads_past_length", READS_PAST_LENGTH,
                  bug="attends over slots past a sequence's length"),
        known_bad("kv_cache", "shared_positions", SHARED_POSITIONS,
                  bug="one position (the batch's longest length) for every sequence"),
        known_bad("kv_cache", "pads_cached", PADS_CACHED,
                  bug="writes the prompt padding into the cache"),
        known_bad("kv_cache", "rope_off_after_64", ROPE_OFF_AFTER_64,
                  bug="RoPE position off by one from position 64 on (an index wrap that shows only at length)"),
        known_bad("kv_cache", "rope_off_after_64_declared_lossy", ROPE_OFF_AFTER_64_DECLARED_LOSSY,
                  bug="RoPE off by one from position 64 on, declaring 4-byte values within a per-value error of 8"),
        known_bad("kv_cache", "stale_after_reprefill", STALE_AFTER_REPREFILL,
                  bug="a second prefill on the same engine keeps a position offset from the first batch"),
        known_bad("kv_cache", "append_no_block_offset", APPEND_NO_BLOCK_OFFSET,
                  bug="an append kernel that forgets its block offset (shows at 8 KV heads x 128)"),
        known_bad("kv_cache", "positions_in_model_dtype", POSITIONS_IN_MODEL_DTYPE,
                  bug="computes RoPE positions in the model's dtype (bfloat16 rounds them)"),
        known_bad("kv_cache", "under_reports_bytes", UNDER_REPORTS_BYTES,
                  bug="reports the cached tokens' formula bytes while it holds the padded batch"),
        known_bad("kv_cache", "drops_layer_update", DROPS_LAYER_UPDATE,
                  bug="a storage that never keeps layer 1's new columns"),
    )
