"""The cached decode engine: prefill + one-token decode steps over the reference model's weights.

:class:`KVCacheEngine` runs the reference :class:`inference_conformance.reference.transformer.Transformer` (its
modules and weights, unchanged) with a :class:`inference_conformance.optimized.kv_cache.append.StaticKVCache`:

- ``prefill(tokens, lengths)`` runs a right-padded batch of prompts through the model in one
  forward (causal attention over the prompt), writes each sequence's ``lengths[b]`` keys and
  values into the cache (the padding is never written) and returns the logits.
- ``decode(next_tokens)`` appends one token to every sequence: the new token's q, k, v are
  computed at RoPE position ``length[b]``, its k, v written at slot ``length[b]``, and its query
  attends over slots ``[0, length[b]]`` of its own sequence only (slots past a sequence's length
  hold NaN and are excluded with ``torch.where`` on K and V as well as the -inf score mask, so
  0 × NaN never reaches the output).

Both run the model's one forward (:meth:`inference_conformance.reference.transformer.Transformer.forward`) with a
:class:`StaticCacheAttention` as its attention backend: each layer appends its new k, v to the
cache, then attends over the new tokens (prefill) or the cached slots (decode).

Float64, float32 and bfloat16 (the model's dtype). The two built-ins differ only in the cache
write: ``TRITON`` (the Triton kernel ``kv_append_kernel``) and ``TORCH`` (vectorized
``index_put_``). The contract they meet is :mod:`inference_conformance.conformance.contracts.kv_cache`.

Source: lecture 001 §1.1 (prefill and decode), §2 (the KV cache; claims KV-1, KV-2, KV-4,
KV-10), CS336 lecture 10 part 3.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

from inference_conformance.conformance.contracts.kv_cache import Footprint, check_ids, check_prefill_shape, held_bytes
from inference_conformance.optimized.kv_cache.append import INDEX_DTYPE, StaticKVCache
from inference_conformance.reference.transformer import Transformer, naive_attention


@dataclass
class StaticCacheAttention:
    """The attention backend (:class:`inference_conformance.reference.transformer.AttentionCache`) of one forward over
    a :class:`inference_conformance.optimized.kv_cache.append.StaticKVCache`, for the forward's B sequences (cache rows
    0..B-1) and T new tokens each.

    Each layer appends the new k, v of row b to slots ``start[b] .. start[b] + count[b] - 1``
    (``start``, ``count``: (B,) int64 on the cache's device; ``host_start``, ``host_count``:
    the same on the CPU), then attends with ``mask`` (bool, broadcastable to (B, 1, T, keys),
    True = may attend):

    - ``span`` None: over the new k, v themselves (a prefill, whose new tokens are the whole
      sequence);
    - ``span`` an int: over the cache's slots ``[0, span)`` of each row, after zeroing the slots
      ``keep`` (bool (B, 1, span, 1)) excludes (they may hold NaN, and 0 × NaN would reach the
      output through the masked scores); ``keep`` None skips that copy (every slot below span
      of every row is written).

    The cache lengths are not advanced: the engine does that once after the forward.
    """

    cache: StaticKVCache
    start: torch.Tensor
    count: torch.Tensor
    host_start: torch.Tensor
    host_count: torch.Tensor
    mask: torch.Tensor
    span: int | None = None
    keep: torch.Tensor | None = None

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (B, Hq, T, D), k, v (B, Hkv, T, D) after RoPE -> attention output (B, Hq, T, D)."""
        cache = self.cache
        cache.append(layer, k, v, self.start, self.count, self.host_start, self.host_count)
        if self.span is None:
            return naive_attention(q, k, v, self.mask)
        B = q.shape[0]
        kc = cache.k[layer, :B, :, :self.span]                         # (B, Hkv, span, D)
        vc = cache.v[layer, :B, :, :self.span]
        if self.keep is not None:                                      # NaN past a length -> 0
            zero = torch.zeros((), dtype=kc.dtype, device=kc.device)
            kc = torch.where(self.keep, kc, zero)
            vc = torch.where(self.keep, vc, zero)
        return naive_attention(q, kc, vc, self.mask)


class KVCacheEngine:
    """A batch of up to ``max_batch`` sequences of at most ``max_seq_len`` tokens each, decoded
    with a static KV cache over ``model``'s weights (the model is used, never copied).

    Raises TypeError when ``model`` is not a reference Transformer, ValueError for a
    non-positive ``max_batch``/``max_seq_len`` or ``max_seq_len`` > the model's max_seq_len.
    """

    def __init__(self, model: Transformer, max_batch: int, max_seq_len: int, append: str = "torch"):
        if not isinstance(model, Transformer):
            raise TypeError(f"model must be a inference_conformance.reference.transformer.Transformer, got {type(model).__name__}")
        for name, v in (("max_batch", max_batch), ("max_seq_len", max_seq_len)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if max_seq_len > model.cfg.max_seq_len:
            raise ValueError(f"max_seq_len ({max_seq_len}) must be <= the model's max_seq_len ({model.cfg.max_seq_len})")
        self.model = model
        self.cfg = model.cfg
        w = model.embed.weight
        self.dtype, self.device = w.dtype, w.device
        self.cache = StaticKVCache(self.cfg.n_layers, max_batch, self.cfg.n_kv_heads, max_seq_len, self.cfg.hd,
                                   self.dtype, self.device, append=append)
        self.batch = 0  # sequences of the current prefill (0: none yet)

    # ------------------------------------------------------------------ validation
    def _check_ids(self, x, name: str, dim: int) -> None:
        check_ids(x, name, dim, self.device)

    def _check_vocab(self, x, name: str) -> None:
        check_ids(x, name, x.dim(), self.device, self.cfg.vocab_size)

    # ------------------------------------------------------------------ hooks (overridden only by known-bad engines)
    def _decode_positions(self, lengths: torch.Tensor) -> torch.Tensor:
        """RoPE positions (B,) of the tokens being decoded: each sequence's own length."""
        return lengths

    def _write_slots(self, lengths: torch.Tensor) -> torch.Tensor:
        """Cache slots (B,) the decoded tokens are written to: each sequence's own length."""
        return lengths

    def _visible(self, new_lengths: torch.Tensor, span: int) -> torch.Tensor:
        """(B, span) bool: which of the first ``span`` slots each sequence's new token reads."""
        return torch.arange(span, device=self.device)[None, :] < new_lengths[:, None]

    def _span(self, host_new_lengths: torch.Tensor) -> int:
        """How many slots a decode step reads: the longest sequence's length."""
        return int(host_new_lengths.max())

    # ------------------------------------------------------------------ the contract
    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Start B new sequences from right-padded prompts; returns logits (B, S, V).

        tokens: (B, S) int64 ids in [0, V), 1 <= B <= max_batch, 1 <= S <= max_seq_len; row b's
        prompt is tokens[b, :lengths[b]], the rest is padding (any valid ids, ignored).
        lengths: (B,) int64, 1 <= lengths[b] <= S. RoPE positions are 0..lengths[b]-1.
        logits[b, t] for t < lengths[b] are the model's logits after tokens[b, :t+1]; logits at
        padding positions are unspecified. Forgets every earlier sequence.
        Raises TypeError (non-tensor, non-int64) or ValueError (shape, device, range, capacity).
        """
        self._check_ids(tokens, "tokens", 2)
        self._check_ids(lengths, "lengths", 1)
        host_lengths = check_prefill_shape(tokens, lengths, self.cache.max_batch, self.cache.max_seq_len)
        self._check_vocab(tokens, "tokens")
        return self._prefill(tokens, lengths, host_lengths)

    def _prefill(self, tokens, lengths, host_lengths):
        B, S = tokens.shape
        cache = self.cache
        cache.reset()
        zeros = torch.zeros(B, dtype=INDEX_DTYPE, device=self.device)
        host_zeros = torch.zeros(B, dtype=INDEX_DTYPE)
        positions = torch.arange(S, device=self.device).expand(B, S)      # (B, S)
        causal = torch.ones(S, S, dtype=torch.bool, device=self.device).tril()[None, None]
        attention = StaticCacheAttention(cache, zeros, lengths, host_zeros, host_lengths, causal)
        logits = self.model(tokens, positions, attention)                  # (B, S, V)
        cache.advance(lengths, host_lengths)
        self.batch = B
        return logits

    @torch.no_grad()
    def decode(self, next_tokens: torch.Tensor) -> torch.Tensor:
        """Append one token to each of the B sequences of the last prefill; returns logits (B, V).

        next_tokens: (B,) int64 ids in [0, V). logits[b] are the model's logits after
        sequence b's tokens followed by next_tokens[b] (RoPE position = its current length).
        Raises RuntimeError before any prefill, TypeError (non-tensor, non-int64), ValueError
        (shape, device, ids, or a sequence already at max_seq_len; nothing is written then).
        """
        if self.batch == 0:
            raise RuntimeError("decode called before prefill: there are no sequences to extend")
        self._check_ids(next_tokens, "next_tokens", 1)
        B = self.batch
        if next_tokens.shape != (B,):
            raise ValueError(f"next_tokens must have shape ({B},) (one token per sequence of the last "
                             f"prefill), got {tuple(next_tokens.shape)}")
        self._check_vocab(next_tokens, "next_tokens")
        host_len = self.cache.host_lengths[:B]
        if int(host_len.max()) + 1 > self.cache.max_seq_len:
            raise ValueError(f"next_tokens would grow a sequence past the cache capacity "
                             f"max_seq_len={self.cache.max_seq_len} (lengths {host_len.tolist()})")
        return self._decode(next_tokens)

    def _decode(self, next_tokens):
        B = self.batch
        cache = self.cache
        lengths = cache.lengths[:B]                                        # (B,)
        host_len = cache.host_lengths[:B].clone()                          # (B,) on the CPU
        host_new = host_len + 1
        ones = torch.ones(B, dtype=INDEX_DTYPE, device=self.device)
        host_ones = torch.ones(B, dtype=INDEX_DTYPE)
        positions = self._decode_positions(lengths)[:, None]               # (B, 1)
        slots = self._write_slots(lengths)                                 # (B,)
        host_slots = self._write_slots(host_len)
        span = self._span(host_new)
        visible = self._visible(lengths + 1, span)                         # (B, span)
        attention = StaticCacheAttention(cache, slots, ones, host_slots, host_ones,
                                         mask=visible[:, None, None, :],  # (B, 1, 1, span)
                                         span=span, keep=visible[:, None, :, None])
        logits = self.model(next_tokens[:, None], positions, attention)    # (B, 1, V)
        cache.advance(ones, host_ones)
        return logits[:, 0]                                                # (B, V)

    def lengths(self) -> torch.Tensor:
        """(B,) int64 on the CPU: tokens cached per sequence of the last prefill."""
        return self.cache.host_lengths[:self.batch].clone()

    def cache_bytes(self) -> int:
        """Bytes the cache holds, measured from its tensors: its whole reserved capacity,
        max_batch × max_seq_len slots of 2·L·Hkv·D·bytes per value (KV-4)."""
        return held_bytes(self.cache)

    def footprint(self) -> Footprint:
        """The layout held by design: capacity reserved up front (max_batch × max_seq_len)."""
        return Footprint("reserved", why="static cache: max_batch × max_seq_len slots allocated up front")

    def capacity_bytes(self) -> int:
        """Bytes preallocated for the whole capacity (max_batch × max_seq_len tokens)."""
        return self.cache.bytes_allocated()

    def kv(self, layer: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached keys (after RoPE) and values of sequence ``seq`` at ``layer``: two views
        of shape (Hkv, n, D), n = its length. Raises IndexError for a layer or seq out of range."""
        if not 0 <= layer < self.cfg.n_layers:
            raise IndexError(f"layer {layer} out of range [0, {self.cfg.n_layers})")
        if not 0 <= seq < self.batch:
            raise IndexError(f"seq {seq} out of range [0, {self.batch})")
        n = int(self.cache.host_lengths[seq])
        return self.cache.k[layer, seq, :, :n], self.cache.v[layer, seq, :, :n]


def _factory(append: str):
    def new_engine(model: Transformer, max_batch: int, max_seq_len: int) -> KVCacheEngine:
        """A :class:`KVCacheEngine` over ``model`` whose cache writes use the "{append}" path."""
        return KVCacheEngine(model, max_batch, max_seq_len, append=append)

    new_engine.__doc__ = new_engine.__doc__.replace("{append}", append)
    return new_engine


#: Built-in implementations of the ``kv_cache`` contract (see conformance/contracts/kv_cache.py).
TRITON = SimpleNamespace(new_engine=_factory("triton"))
TORCH = SimpleNamespace(new_engine=_factory("torch"))


def implementations():
    """The cached engines: the Triton append kernel and the PyTorch ``index_put_`` append; the
    adapters of transformers' cache classes (:mod:`inference_conformance.optimized.kv_cache.outside_transformers`)."""
    from inference_conformance.conformance.registry import builtin
    from inference_conformance.optimized.kv_cache import append as kv_append
    from inference_conformance.optimized.kv_cache import outside_transformers as hf

    # Dynamic and Static run wherever transformers is (the test extra has it); the other caches
    # in the peers-hf environment (tox -e peers-hf), which runs every kv_cache law over them
    return (builtin("kv_cache", "triton", TRITON, kernel_modules=(kv_append,)), builtin("kv_cache", "torch", TORCH),
            builtin("kv_cache", "hf_dynamic", hf.HF_DYNAMIC, needs="transformers", adapter=True),
            builtin("kv_cache", "hf_static", hf.HF_STATIC, needs="transformers", adapter=True),
            builtin("kv_cache", "hf_sliding_window", hf.HF_SLIDING_WINDOW, needs="transformers", adapter=True, peer="hf"),
            builtin("kv_cache", "hf_static_sliding_window", hf.HF_STATIC_SLIDING_WINDOW, needs="transformers",
                    adapter=True, peer="hf"),
            builtin("kv_cache", "hf_offloaded", hf.HF_OFFLOADED, needs="transformers", requires={"cuda"}, adapter=True),
            builtin("kv_cache", "hf_quantized_fp8", hf.HF_QUANTIZED_FP8, needs="transformers", adapter=True, peer="hf"),
            builtin("kv_cache", "hf_quantized_quanto", hf.HF_QUANTIZED_QUANTO, needs="optimum.quanto", adapter=True,
                    peer="hf"))
