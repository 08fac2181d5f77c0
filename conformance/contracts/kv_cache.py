"""The ``kv_cache`` contract: a decode engine that caches each layer's keys and values.

An implementation is a factory: a function ``new_engine(model, max_batch, max_seq_len)``, or any
object or module with a callable attribute ``new_engine`` (``--impl kv_cache=module:attr``
names either). It returns an *engine* over the reference model ``model``
(:class:`reference.transformer.Transformer`, in float64, float32 or bfloat16; the engine uses
its weights, dtype and device as they are) that holds up to ``max_batch`` sequences of up to
``max_seq_len`` tokens each (``max_seq_len`` <= ``model.cfg.max_seq_len``).

The engine provides:

``prefill(tokens, lengths) -> logits``
    tokens: (B, S) int64 on the model's device, ids in [0, V), 1 <= B <= max_batch,
    1 <= S <= max_seq_len; lengths: (B,) int64, 1 <= lengths[b] <= S. Row b's prompt is
    ``tokens[b, :lengths[b]]``; the positions after it are padding (valid ids, ignored: they must
    change nothing). RoPE positions start at 0 for each sequence's first token. Returns logits
    (B, S, V) in the model's dtype: ``logits[b, t]`` for t < lengths[b] equal the model's logits
    at position t of row b's prompt; logits at padding positions are unspecified. A prefill
    starts B new sequences and forgets all earlier ones.

``decode(next_tokens) -> logits``
    next_tokens: (B,) int64 (B = the batch of the last prefill). Appends ``next_tokens[b]`` to
    sequence b at position ``lengths[b]`` (its current length) and returns logits (B, V): the
    model's logits after that sequence's tokens, as one full forward over them would give
    (claim KV-1), whatever the other sequences of the batch, their lengths or the padding of
    the prefill (claim KV-10).

``lengths() -> (B,) int64``
    Tokens cached per sequence (prompt length + decoded tokens), on the CPU.

``cache_bytes() -> int``
    Bytes of keys and values the engine holds for the cached tokens: exactly
    2 × L × Hkv × D × bytes per value × Σ lengths (claim KV-4; capacity
    reserved but not yet written does not count).

``kv(layer, seq) -> (k, v)``
    The cached keys (after RoPE) and values of sequence ``seq`` at ``layer``: two tensors of shape
    (Hkv, lengths[seq], D) in the model's dtype, equal to what the model computes for those
    positions.

Errors: a non-tensor or a non-int64 ``tokens``/``lengths``/``next_tokens`` raises TypeError; a
wrong shape, a wrong device, an id outside [0, V), a length outside [1, S], a batch above
max_batch or a write past max_seq_len raises ValueError naming the argument, before anything is
written; ``decode`` before any ``prefill`` raises RuntimeError.

Oracle: the reference model's full forward without a cache (``reference.transformer``:
``model(tokens)`` and ``generate``), which recomputes the whole prefix every step.

Built-ins: ``triton`` (cache writes by the Triton kernel ``optimized.kv_append.kv_append_kernel``,
interpreted on CPU, compiled on CUDA) and ``torch`` (vectorized ``index_put_``); both are
:class:`optimized.kv_cache.KVCacheEngine`. Bug zoo: :mod:`properties.zoo_kv_cache`.

Names (B, S, V, Hkv, D, L) as in :mod:`conformance.contracts.glossary`.

Source: lecture 001 §1.1 (prefill and decode), §2 (the KV cache, experiments of §2.2 and sizes of
§2.3), §1.3 (batching); CS336 lecture 10 part 3. Claims KV-1, KV-2, KV-3, KV-4, KV-10, AI-8, AI-9.
"""
from conformance.registry import Contract

CONTRACT = Contract(
    technique="kv_cache",
    functions=("new_engine",),
    doc=__doc__,
)
