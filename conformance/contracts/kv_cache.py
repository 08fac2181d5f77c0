"""The ``kv_cache`` contract: a decode engine that caches each layer's keys and values.

An implementation is a factory: a function ``new_engine(model, max_batch, max_seq_len)``, or any
object or module with a callable attribute ``new_engine`` (``--impl kv_cache=module:attr``
names either). It returns an *engine* over the reference model ``model``
(:class:`inference_conformance.reference.transformer.Transformer`, in float64, float32 or bfloat16; the engine uses
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
    Bytes the engine's cache holds, measured from its tensors (:func:`held_bytes`: every
    tensor it reaches, each storage counted once, int64 and bool bookkeeping such as lengths
    and masks not counted), never computed from a formula alone. The laws measure it themselves too, and the
    two must agree. For the cached tokens it is 2 × L × Hkv × D × bytes per value per token
    (claim KV-4); how many token slots the cache holds is its :class:`Footprint`.

``footprint() -> Footprint`` (optional; without it: ``Footprint("exact")``)
    The layout the cache holds by design (:data:`LAYOUTS`): ``exact``, Σ lengths slots (only the
    cached tokens); ``padded``, B × W slots (a rectangular right-padded batch, W the longest
    sequence: padding and the columns of shorter rows are held too); ``reserved``, B × max_seq_len
    or max_batch × max_seq_len slots (capacity allocated up front). A quantized cache declares
    its bytes per value, the bytes of its scales per layer (``overhead_bytes``) and the relative error per
    cached value its number format promises (``value_rel_error``, implied by its format and
    scale granularity); such a lossy cache is held to it: its values at every layer (KV-4) and
    its prefill + decode logits (KV-1), its batched logits (KV-10) and the tokens it samples
    (KV-2) within the bounds that error implies through the model (``properties/kv_cache/lossy.py``
    states the derivation). A lossy cache that declares no per-value error fails those laws,
    never "unsupported"; so does one declaring an error its storage cannot make
    (:func:`value_error_cap`: above :data:`ERROR_FACTOR` × the relative step of the coarsest
    format of its bits per value: 4 bits 2^-1, 8 bits 2^-2, 16 bits 2^-7, 32 bits 2^-23). The
    footprint law (KV-4)
    holds the measured bytes to exactly what the declared layout and format imply, and the
    report shows the ratio to the exact formula: a padded or reserved cache "differs by design",
    with its figure, never a silent pass and never a failure.

``kv(layer, seq) -> (k, v)``
    The cached keys (after RoPE) and values of sequence ``seq`` at ``layer``: two tensors of shape
    (Hkv, lengths[seq], D) in the model's dtype, equal to what the model computes for those
    positions.

Errors: a non-tensor or a non-int64 ``tokens``/``lengths``/``next_tokens`` raises TypeError; a
wrong shape, a wrong device, an id outside [0, V), a length outside [1, S], a batch above
max_batch or a write past max_seq_len raises ValueError naming the argument, before anything is
written; ``decode`` before any ``prefill`` raises RuntimeError. ``new_engine`` raises ValueError
naming ``max_batch`` or ``max_seq_len`` when either is below 1 or ``max_seq_len`` is above
``model.cfg.max_seq_len``.

A cache storage instead of an engine (the form of transformers' ``Cache`` objects):
``new_cache(cfg, batch, max_seq_len, dtype, device)`` returns an object with
``update(k, v, layer) -> (k_all, v_all)``: k, v (B, Hkv, T, D) are layer ``layer``'s new keys
(after RoPE) and values, appended as columns after the ones already held; k_all, v_all
(B, Hkv, W', D) are what attention reads: every column held (W' >= the columns written: the
first W are the columns in order, the rest unwritten capacity) or the last W' columns (a sliding
window); ``held(layer) -> (k, v)``, optional, what it holds in the same layout, else an update
with no new column (T = 0) must return that and change nothing (the engine's ``kv`` reads it).
``inference_conformance.optimized.kv_cache.storage.storage_engine(new_cache, footprint)`` drives the suite's own model
forward over it (its AttentionCache calls ``update`` and masks padding) and is an engine of this
contract: the storage needs no engine of its own, and its bytes are measured from its tensors.

Oracle: the reference model's full forward without a cache (``inference_conformance.reference.transformer``:
``model(tokens)`` and ``generate``), which recomputes the whole prefix every step.

Built-ins: ``triton`` (cache writes by the Triton kernel ``inference_conformance.optimized.kv_cache.append.kv_append_kernel``,
interpreted on CPU, compiled on CUDA) and ``torch`` (vectorized ``index_put_``); both are
:class:`inference_conformance.optimized.kv_cache.KVCacheEngine`. Adapters: transformers' cache classes as storages
(``hf_*``, :mod:`inference_conformance.optimized.kv_cache.outside_transformers`, in the peer environment ``tox -e peers-hf``). Bug zoo:
:mod:`inference_conformance.properties.kv_cache.zoo`.

Names (B, S, V, Hkv, D, L) as in :mod:`inference_conformance.conformance.contracts.glossary`.

Source: lecture 001 §1.1 (prefill and decode), §2 (the KV cache, experiments of §2.2 and sizes of
§2.3), §1.3 (batching); CS336 lecture 10 part 3. Claims KV-1, KV-2, KV-3, KV-4, KV-10, AI-8, AI-9.
"""
from __future__ import annotations

import types
from dataclasses import dataclass

import torch

from inference_conformance.conformance.coverage import CoverageClass
from inference_conformance.conformance.registry import Contract

#: The layouts a cache may hold by design (see ``footprint()`` in the module docstring).
LAYOUTS = ("exact", "padded", "reserved")


@dataclass(frozen=True)
class Footprint:
    """What a cache holds by design: ``layout`` one of :data:`LAYOUTS`; ``bytes_per_value`` of
    its keys and values (None: the model dtype's element size); ``overhead_bytes``: bytes per
    layer it holds besides the slots (a quantized cache's scales); ``value_rel_error``: the
    relative error per cached value its number format promises (None: the values are the
    model's, judged by the model's tolerance rule); ``bytes_bound``: a quantized format whose
    packing the law does not model (its measured bytes are recorded against the layout's full
    precision, not held to a formula: group scales can outweigh 4-bit values at small shapes);
    ``why``: one line for the report.
    Raises ValueError for an unknown layout or a negative size."""

    layout: str = "exact"
    bytes_per_value: int | None = None
    overhead_bytes: int = 0
    value_rel_error: float | None = None
    bytes_bound: bool = False
    why: str = ""

    @property
    def lossy(self) -> bool:
        """The cache does not hold the model's values (a quantized format): KV-1 and KV-4 hold
        it to the bounds its ``value_rel_error`` implies, KV-2 and KV-10 too (a failure where it
        declares none, or more than :func:`value_error_cap`)."""
        return self.value_rel_error is not None or self.bytes_bound or self.bytes_per_value is not None

    def __post_init__(self):
        e = self.value_rel_error
        if e is not None and not (isinstance(e, (int, float)) and 0 <= e < float("inf")):
            raise ValueError(f"value_rel_error must be a finite float >= 0 or None, got {e!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.bytes_per_value is not None and self.bytes_per_value < 1:
            raise ValueError(f"bytes_per_value must be >= 1, got {self.bytes_per_value}")
        if self.overhead_bytes < 0:
            raise ValueError(f"overhead_bytes must be >= 0, got {self.overhead_bytes}")


#: The relative step of the coarsest number format of each storage width (bits per value), in
#: the lossy bound's form (ε·|x| + ε·2^-6·max|x|, ``properties/kv_cache/lossy.py``): 4 bits FP4
#: e2m1 (int4 absmax: 1/7 of its block's largest); 8 bits FP8 e5m2 (e4m3: 2^-3; int8 absmax:
#: 1/127 of its block's largest, within 2^-2·2^-6 of it); 16 bits bfloat16; 32 float32; 64 float64.
FORMAT_STEPS = {4: (2.0 ** -1, "FP4 e2m1 / int4"), 8: (2.0 ** -2, "FP8 e5m2 / int8"), 16: (2.0 ** -7, "bfloat16"),
                32: (2.0 ** -23, "float32"), 64: (2.0 ** -52, "float64")}
#: The factor a declared per-value error may exceed its storage's format step by (the step is
#: twice round-to-nearest's error: the factor leaves room for a scale stored in the format).
ERROR_FACTOR = 2.0


def storage_bits(fp: Footprint, model_dtype: torch.dtype) -> int:
    """Bits per stored value a footprint declares: 8 × ``bytes_per_value``; a ``bytes_bound``
    packing without it: 4 (the narrowest format the suite admits); else the model dtype's."""
    if fp.bytes_per_value is not None:
        return 8 * fp.bytes_per_value
    if fp.bytes_bound:
        return 4
    return 8 * torch.empty((), dtype=model_dtype).element_size()


def value_error_cap(fp: Footprint, model_dtype: torch.dtype) -> tuple[float, str]:
    """(cap, why): the largest per-value error (``value_rel_error``) a cache with footprint
    ``fp`` over a model in ``model_dtype`` may declare: :data:`ERROR_FACTOR` × the relative step
    of the coarsest format of its storage width (:data:`FORMAT_STEPS`; a width between two rows
    takes the narrower row's). A larger error is not a rounding its bytes can make."""
    bits = storage_bits(fp, model_dtype)
    step, name = FORMAT_STEPS[max(b for b in FORMAT_STEPS if b <= bits)]
    return ERROR_FACTOR * step, (f"{ERROR_FACTOR:g} x {step:.3g}, the relative step of {name}, the coarsest format "
                                 f"of the {bits} bits per value it declares")


def check_ids(x, name: str, dim: int, device, vocab_size: int | None = None) -> None:
    """The contract's check of a token or length argument: a torch.Tensor (TypeError), int64
    (TypeError), ``dim`` dimensions ((B, S) or (B,); ValueError), on ``device`` (ValueError) and,
    with ``vocab_size``, ids in [0, vocab_size) (ValueError); each message names ``name``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.int64:
        raise TypeError(f"{name} must be int64, got {x.dtype}")
    if x.dim() != dim:
        shape = "(B, S)" if dim == 2 else "(B,)"
        raise ValueError(f"{name} must have shape {shape}, got {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device}, but the model is on {device}")
    if vocab_size is not None and x.numel() and (int(x.min()) < 0 or int(x.max()) >= vocab_size):
        raise ValueError(f"{name} holds token ids outside [0, {vocab_size})")


def check_prefill_shape(tokens, lengths, max_batch: int, max_seq_len: int) -> torch.Tensor:
    """The contract's check of a prefill's sizes (after :func:`check_ids`): batch B in
    [1, max_batch], length S in [1, max_seq_len] (the cache capacity), lengths of shape (B,) in
    [1, S]; ValueError naming the argument. Returns the lengths on the CPU."""
    B, S = tokens.shape
    if not 1 <= B <= max_batch:
        raise ValueError(f"tokens has batch {B}; it must be in [1, max_batch={max_batch}]")
    if not 1 <= S <= max_seq_len:
        raise ValueError(f"tokens has length {S}; it must be in [1, max_seq_len={max_seq_len}] (the cache capacity)")
    if lengths.shape != (B,):
        raise ValueError(f"lengths must have shape ({B},), got {tuple(lengths.shape)}")
    host = lengths.cpu()
    if int(host.min()) < 1 or int(host.max()) > S:
        raise ValueError(f"lengths must lie in [1, S={S}], got {host.tolist()}")
    return host


def held_bytes(obj, *, skip: tuple = ()) -> int:
    """Bytes of every tensor reachable from ``obj`` (its attributes, lists, tuples, dicts, at any
    depth; tensor subclasses that wrap inner tensors through ``__tensor_flatten__`` are opened),
    each underlying storage counted once, int64 and bool tensors (lengths, positions, masks:
    bookkeeping) and
    objects of the types in ``skip`` (the model: its weights are not cache) left out. Returns
    an int number of bytes: what a cache actually holds, as the kv_cache laws measure it."""
    seen_storage: set[tuple[str, int]] = set()
    seen: set[int] = set()
    total = 0
    stack = [obj]
    while stack:
        x = stack.pop()
        if id(x) in seen or x is None or isinstance(x, (str, bytes, int, float, bool, type)):
            continue
        seen.add(id(x))
        if skip and isinstance(x, skip):
            continue
        if isinstance(x, torch.Tensor):
            flatten = getattr(type(x), "__tensor_flatten__", None)
            if flatten is not None:                    # a wrapper subclass: its inner tensors
                names, _ = x.__tensor_flatten__()
                stack.extend(getattr(x, n) for n in names)
                continue
            if x.dtype in (torch.int64, torch.bool) or x.device.type == "meta":
                continue
            st = x.untyped_storage()
            key = (str(x.device), st.data_ptr())
            if st.nbytes() and key not in seen_storage:
                seen_storage.add(key)
                total += st.nbytes()
            continue
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple, set, frozenset)):
            stack.extend(x)
        elif isinstance(x, (types.FunctionType, types.MethodType, types.ModuleType, types.BuiltinFunctionType)):
            continue
        elif hasattr(x, "__dict__"):
            stack.extend(vars(x).values())
    return total

# ----------------------------------------------------------------------------------------------
# coverage table: the boundary classes the laws of properties/kv_cache/laws.py must hand every
# engine in every profile (their pinned cases reach them; the drawn ones may too)
# ----------------------------------------------------------------------------------------------
_KV1 = "law_prefill_then_decode_equals_full_forward"
_KV4 = "law_cache_holds_exactly_the_tokens"
_KV10 = "law_batch_mates_change_nothing"


def _group(c) -> int:
    return c.n_heads // c.n_kv_heads


def _last_position(c) -> int:
    """The highest RoPE position the case writes: its longest prompt plus its decode steps, less one."""
    return max(c.prompt_lens) + c.steps - 1


#: The kv_cache contract's coverage table. Observations are the laws' cases: objects with
#: ``prompt_lens`` (one per sequence), ``steps`` (decode steps), ``n_layers``, ``n_heads``,
#: ``n_kv_heads`` and ``head_dim`` (as inference_conformance.properties.kv_cache.cases.Case).
COVERAGE = (
    CoverageClass("B > 1, different prompt lengths", (_KV1, _KV4, _KV10),
                  lambda c: len(set(c.prompt_lens)) > 1),
    # a per-row position, slot or RoPE offset wrong from row 4 on
    CoverageClass("batch of five or more", (_KV1,), lambda c: len(c.prompt_lens) >= 5),
    CoverageClass("prompt of one token", (_KV1,), lambda c: min(c.prompt_lens) == 1),
    # a prompt that fills a tile of 16 exactly (a prefill that drops a full tile's last token)
    CoverageClass("prompt of 16 tokens (one full tile)", (_KV1,), lambda c: 16 in c.prompt_lens),
    CoverageClass("more than one layer", (_KV1, _KV4, _KV10), lambda c: c.n_layers > 1),
    CoverageClass("one KV head (MQA)", (_KV1, _KV4, _KV10), lambda c: c.n_kv_heads == 1),
    CoverageClass("GQA group not a power of two", (_KV1, _KV4, _KV10),
                  lambda c: _group(c) > 1 and _group(c) & (_group(c) - 1) != 0),
    CoverageClass("head dim not a power of two", (_KV1, _KV4, _KV10),
                  lambda c: c.head_dim & (c.head_dim - 1) != 0),
    # Llama's 8 KV heads x 128: an append tiled in blocks of 4096 // (Hkv x D) = 4 tokens spans
    # several blocks (at the drawn shapes one block holds the whole prompt)
    CoverageClass("KV heads x head dim >= 1024, prompt over 4 tokens", (_KV4,),
                  lambda c: c.n_kv_heads * c.head_dim >= 1024 and max(c.prompt_lens) > 4),
    # RoPE tables, cache tiles and index arithmetic that break only at length
    CoverageClass("positions past 64 and 128", ("law_long_sequences",),
                  lambda c: max(c.prompt_lens) > 64 and _last_position(c) > 128),
    # bfloat16 holds integers exactly only up to 256: a position passed through it rounds
    CoverageClass("positions past 256", ("law_bfloat16_cache_past_256_positions",),
                  lambda c: _last_position(c) > 256),
)

CONTRACT = Contract(
    technique="kv_cache",
    functions=("new_engine",),
    doc=__doc__,
)
# The engines' bad calls need a reference model, a layer above this one: they are
# inference_conformance.properties.kv_cache.cases.invalid_calls, which the bad-input law finds by the technique's name.
