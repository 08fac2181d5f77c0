"""Adapters of Hugging Face transformers to the suite's contracts (``needs="transformers"``):
its KV cache classes as ``kv_cache`` storages (its assisted generation's verification step is in
``optimized/speculative/outside_transformers.py``).

KV caches: each adapter is a ``new_cache(cfg, batch, max_seq_len, dtype, device)`` that builds
one of transformers' ``Cache`` objects for the reference model's configuration (translated to
a ``LlamaConfig``/``MistralConfig``: layers, KV heads, head dim; only its layer types reach the
cache), wrapped by :func:`inference_conformance.optimized.kv_cache.storage.storage_engine`, which drives the suite's model
forward through it (``Cache.update(k, v, layer)`` is transformers' own call, unchanged). Nothing
here stores, evicts or quantizes: transformers does. Each declares the layout its class holds by
design (:class:`inference_conformance.conformance.contracts.kv_cache.Footprint`); its bytes are measured.

- ``hf_dynamic``: ``DynamicCache(config=...)`` (``DynamicLayer``: grows by ``torch.cat``) holds
  the padded rectangle B × W of the batch.
- ``hf_static``: ``StaticCache(config=..., max_cache_len=max_seq_len)`` (``StaticLayer``:
  zero-filled B × max_seq_len, written by ``index_copy_``): reserved capacity.
- ``hf_sliding_window``: ``DynamicCache`` over a Mistral config with ``sliding_window`` one
  above the engine's capacity (``DynamicSlidingWindowLayer``: keeps the last window - 1 columns
  and returns the full states); the laws' model has no window, so eviction itself is never
  reached here (it belongs to KV-8, over a window model).
- ``hf_static_sliding_window``: ``StaticCache`` over the same config (``StaticSlidingWindowLayer``,
  capacity min(window, max_seq_len)).
- ``hf_offloaded``: ``DynamicCache(config=..., offloading=True)``: layers moved to the CPU between
  forwards (CUDA only: transformers 5.24 calls ``torch.cuda.default_stream`` in every ``update``;
  on a CPU-only build it raises AssertionError, pinned in tests/test_outside_transformers.py).
- ``hf_quantized_fp8``: ``QuantizedCache("fp8", config)`` (``Fp8QuantizedLayer``: float8_e4m3fn
  values with one float32 scale per layer's keys and one per its values, frozen at the first
  update): 1 byte per value, 8 bytes of scales per layer; values within e4m3's rounding.
- ``hf_quantized_quanto``: ``QuantizedCache("quanto", config, nbits=4, ...)`` where
  optimum-quanto is installed (``needs="optimum.quanto"``; not in requirements/peers-hf.txt: it
  builds a C++ extension on first use).

Source: transformers ``cache_utils`` (5.x); lecture 001 §2; claims KV-1, KV-2, KV-4, KV-10.
"""
from __future__ import annotations


from inference_conformance.conformance.contracts.kv_cache import Footprint
from inference_conformance.optimized.kv_cache.storage import storage_engine

#: float8_e4m3fn has 3 mantissa bits: round-to-nearest within 2^-4 of a normal value.
FP8_E4M3_REL_ERROR = 2.0 ** -4


def _config(cfg, *, sliding_window: int | None = None):
    """transformers' config of the reference model's cache shape (what its Cache classes read:
    layers, KV heads, head dim, layer types). hidden_size = Hq × D: StaticCache's config check
    needs it divisible by the heads."""
    import transformers

    kw = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.n_heads * cfg.hd, intermediate_size=cfg.d_ff,
              num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
              head_dim=cfg.hd, max_position_embeddings=cfg.max_seq_len, rope_theta=cfg.rope_theta)
    if sliding_window is None:
        return transformers.LlamaConfig(**kw)
    return transformers.MistralConfig(sliding_window=sliding_window, **kw)


class _Layers:
    """One of transformers' full-precision ``Cache`` objects, unchanged, with the read the
    storage bridge asks for: ``held(layer)`` is that layer's own ``keys``/``values`` (what it
    holds, without an ``update``: a ``StaticSlidingWindowLayer`` at full capacity cannot take an
    update of no column)."""

    def __init__(self, cache):
        self.cache = cache

    def update(self, k, v, layer):
        return self.cache.update(k, v, layer)

    def held(self, layer):
        held = self.cache.layers[layer]
        return held.keys, held.values


def _dynamic(cfg, batch, max_seq_len, dtype, device):
    from transformers import DynamicCache

    return _Layers(DynamicCache(config=_config(cfg)))


def _static(cfg, batch, max_seq_len, dtype, device):
    from transformers import StaticCache

    return _Layers(StaticCache(config=_config(cfg), max_cache_len=max_seq_len))


def _sliding(cfg, batch, max_seq_len, dtype, device):
    from transformers import DynamicCache

    return _Layers(DynamicCache(config=_config(cfg, sliding_window=max_seq_len + 1)))


def _static_sliding(cfg, batch, max_seq_len, dtype, device):
    from transformers import StaticCache

    return _Layers(StaticCache(config=_config(cfg, sliding_window=max_seq_len + 1), max_cache_len=max_seq_len))


def _offloaded(cfg, batch, max_seq_len, dtype, device):
    from transformers import DynamicCache

    return _Layers(DynamicCache(config=_config(cfg), offloading=True))


def _fp8(cfg, batch, max_seq_len, dtype, device):
    from transformers import QuantizedCache

    return QuantizedCache("fp8", _config(cfg))


def _quanto(cfg, batch, max_seq_len, dtype, device):
    from transformers import QuantizedCache

    return QuantizedCache("quanto", _config(cfg), nbits=4, q_group_size=cfg.hd, residual_length=max_seq_len + 1)


HF_DYNAMIC = storage_engine(_dynamic, Footprint("padded", why="DynamicCache: one rectangle B × W per layer"))
HF_STATIC = storage_engine(_static, Footprint("reserved", why="StaticCache: B × max_cache_len allocated up front"))
HF_SLIDING_WINDOW = storage_engine(_sliding, Footprint(
    "padded", why="DynamicSlidingWindowLayer below its window: one rectangle B × W per layer"))
HF_STATIC_SLIDING_WINDOW = storage_engine(_static_sliding, Footprint(
    "reserved", why="StaticSlidingWindowLayer: B × min(window, max_cache_len) allocated up front"))
HF_OFFLOADED = storage_engine(_offloaded, Footprint("padded", why="offloaded DynamicCache: one rectangle B × W"))
#: fp8: 1 byte per value; per layer one float32 scale for the keys and one for the values (the
#: overhead is per layer: the adapter's footprint scales it by the layers of the model it meets)
HF_QUANTIZED_FP8 = storage_engine(_fp8, Footprint(
    "padded", bytes_per_value=1, overhead_bytes=8, value_rel_error=FP8_E4M3_REL_ERROR,
    why="QuantizedCache fp8: float8_e4m3fn values, a float32 scale per layer's keys and values"))
#: quanto: 4-bit integers packed two to a byte, with float scales and zero points per group of
#: head-dim values; the first update (the prefill) is quantized at once, later columns stay in
#: full precision up to residual_length. Its packing is not modelled: bytes at most the padded
#: rectangle at full precision, values without a declared per-value bound.
HF_QUANTIZED_QUANTO = storage_engine(_quanto, Footprint(
    "padded", bytes_bound=True, why="QuantizedCache quanto: 4-bit groups of head-dim values (KIVI-style)"))
