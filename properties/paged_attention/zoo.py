"""Known-bad paged-attention implementations (the bug zoo): each is a classic paged-decode
kernel bug, and the PA-1 law (``properties/paged_attention/test_paged_attention.py``) must reject every one; the
mixed-batch entries (``chunk_offset_from_zero``, ``last_chunk_as_c``, ``searches_first_4_sequences``,
``chunk_top_left_in_large_batches``:
a correct decode call, a buggy ``paged_prefill``) are rejected by the PA-8 law.

All follow the paged_attention contract's signature and compute in float64 for float64 inputs
and float32 otherwise, so that only the bug (not rounding) makes them wrong. The known-bad paged
engines are here too (``serving_engine_zoo``), registered as ``inference_engine`` zoo entries and
rejected by the serve laws (PA-6, PA-8 and their pairs, ``properties/inference_engine/laws/serving.py``);
the known-bad KV transfers (PA-9) are the ``kv_transfer`` technique's (``properties/kv_transfer/zoo.py``).
"""
from __future__ import annotations

import torch

from inference_conformance.conformance.contracts.paged_attention.validate import validate

#: The fixed table walk of :func:`walk_capped_64_blocks` (a kernel that loads a fixed-size
#: window of the block table).
CAPPED_BLOCKS = 64


def _paged(q, k_cache, v_cache, block_table, seq_lens, scale, *, read_len=None, table=None, head_map=None,
           skip_slot=None):
    """Paged decode with the bug injected: ``read_len(n, block_size)`` tokens read per sequence
    (default n), ``table(b, n_blocks, row, shape)`` the physical blocks, ``head_map(h, Hq, Hkv)``,
    ``skip_slot(slots, block_size)`` the tokens (a bool mask over their slots in their blocks) never read."""
    shape = validate(q, k_cache, v_cache, block_table, seq_lens, scale)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    bs = shape.block_size
    heads = torch.tensor([head_map(h, shape.Hq, shape.Hkv) if head_map else h // shape.group
                          for h in range(shape.Hq)], device=q.device)
    out = torch.empty(shape.B, shape.Hq, shape.D, dtype=q.dtype, device=q.device)
    for b, n in enumerate(seq_lens.tolist()):
        m = read_len(n, bs) if read_len else n
        nb = -(-m // bs)
        blocks = (table(b, nb, block_table[b], shape) if table else block_table[b, :nb]).to(torch.int64)
        k = k_cache[blocks].reshape(nb * bs, shape.Hkv, shape.D)[:m].to(acc)[:, heads]    # (m, Hq, D)
        v = v_cache[blocks].reshape(nb * bs, shape.Hkv, shape.D)[:m].to(acc)[:, heads]
        if skip_slot is not None:
            kept = ~skip_slot(torch.arange(m, device=q.device) % bs, bs)
            k, v = k[kept], v[kept]
        s = torch.einsum("hd,thd->ht", q[b].to(acc), k) * scale                           # (Hq, m)
        p = torch.softmax(s, dim=-1)
        out[b] = torch.einsum("ht,thd->hd", p, v).to(q.dtype)
    return out


def ignores_partial_block(q, k_cache, v_cache, block_table, seq_lens, *, scale):
    """Reads only the full blocks: the tokens of a partly filled last block are dropped."""
    return _paged(q, k_cache, v_cache, block_table, seq_lens, scale, read_len=lambda n, bs: (n // bs) * bs)


def reads_nan_slots(q, k_cache, v_cache, block_table, seq_lens, *, scale):
    """Reads the whole last block, garbage slots past seq_lens included (no tail mask)."""
    return _paged(q, k_cache, v_cache, block_table, seq_lens, scale, read_len=lambda n, bs: -(-n // bs) * bs)


def identity_table(q, k_cache, v_cache, block_table, seq_lens, *, scale):
    """Assumes sequence b's blocks are contiguous from b * max_blocks (the block table is never read)."""
    def table(b, nb, row, shape):
        return (b * shape.max_blocks + torch.arange(nb, device=row.device)) % shape.num_blocks
    return _paged(q, k_cache, v_cache, block_table, seq_lens, scale, table=table)


def off_by_one_length(q, k_cache, v_cache, block_table, seq_lens, *, scale):
    """Treats seq_lens as the index of the last token: the newest token is never read."""
    return _paged(q, k_cache, v_cache, block_table, seq_lens, scale, read_len=lambda n, bs: max(1, n - 1))


def gqa_modulo(q, k_cache, v_cache, block_table, seq_lens, *, scale):
    """Query head h reads KV head h % Hkv instead of h // (Hq // Hkv)."""
    return _paged(q, k_cache, v_cache, block_table, seq_lens, scale, head_map=lambda h, hq, hkv: h % hkv)


def tiles_of_128_skip_block_tail(q, k_cache, v_cache, block_table, seq_lens, *, scale):
    """Walks each block in tiles of 128 slots, block_size // 128 of them: a block above 128
    slots that is not a multiple of 128 (144, 200) loses its last block_size % 128 slots."""
    return _paged(q, k_cache, v_cache, block_table, seq_lens, scale,
                  skip_slot=lambda slot, bs: (slot >= 128 * (bs // 128)) & (bs > 128))


def walk_capped_64_blocks(q, k_cache, v_cache, block_table, seq_lens, *, scale):
    """Walks at most 64 entries of the block table (a fixed-size table window): tokens past
    64 blocks are dropped."""
    return _paged(q, k_cache, v_cache, block_table, seq_lens, scale,
                  read_len=lambda n, bs: min(n, CAPPED_BLOCKS * bs))


def _read_with_shape_strides(t: torch.Tensor) -> torch.Tensor:
    """What a kernel that computes offsets from the shape (ignoring ``.stride()``) reads: ``t``'s
    storage from its offset, as if ``t`` were contiguous."""
    strides, acc = [], 1
    for n in reversed(t.shape):
        strides.append(acc)
        acc *= n
    return torch.as_strided(t, t.shape, tuple(reversed(strides)), t.storage_offset())


def table_stride_from_shape(q, k_cache, v_cache, block_table, seq_lens, *, scale):
    """Indexes block_table[b, i] as ptr + b * max_blocks + i (the row stride taken from the
    shape): wrong when the table is a column slice of a wider one (table[:, :n]). The entries it
    reads there may be any value (the contract leaves unused entries unspecified, out of range
    included); like a kernel it then reads whatever block that offset lands in (taken modulo
    the pool here), never raising."""
    validate(q, k_cache, v_cache, block_table, seq_lens, scale)
    table = _read_with_shape_strides(block_table)
    return _paged(q, k_cache, v_cache, block_table, seq_lens, scale,
                  table=lambda b, nb, row, shape: table[b, :nb] % shape.num_blocks)


def cache_strides_from_shape(q, k_cache, v_cache, block_table, seq_lens, *, scale):
    """Computes cache offsets from the shape (assumes contiguous caches): wrong when k_cache and
    v_cache are kv[:, 0] and kv[:, 1] of one (num_blocks, 2, block_size, Hkv, D) tensor (vLLM's
    layout)."""
    validate(q, k_cache, v_cache, block_table, seq_lens, scale)
    return _paged(q, _read_with_shape_strides(k_cache), _read_with_shape_strides(v_cache), block_table,
                  seq_lens, scale)


def block_offsets_in_int32(q, k_cache, v_cache, block_table, seq_lens, *, scale):
    """Computes a block's element offset, block id x block stride, in int32: past 2^31 it wraps
    (negative), and like a kernel it reads whatever block the wrapped offset lands in (taken
    modulo the pool here), never raising."""
    def table(b, nb, row, shape):
        off = row[:nb].to(torch.int64) * k_cache.stride(0)
        wrapped = (off + 2**31) % 2**32 - 2**31                           # the int32 product
        return torch.div(wrapped, k_cache.stride(0), rounding_mode="floor") % shape.num_blocks
    return _paged(q, k_cache, v_cache, block_table, seq_lens, scale, table=table)


def scale_folded_in_16bit(q, k_cache, v_cache, block_table, seq_lens, *, scale):
    """For 16-bit inputs the scale is folded into q in q's dtype (q * scale rounded to bfloat16
    or float16) and the scores computed with scale 1; the contract scales them in float32."""
    if q.dtype in (torch.float16, torch.bfloat16):
        return _paged(q * scale, k_cache, v_cache, block_table, seq_lens, 1.0)
    return _paged(q, k_cache, v_cache, block_table, seq_lens, scale)


# ------------------------------------------------------------ the mixed batch (PA-8)
def _prefill(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, *, positions, found=None):
    """The mixed batch with the bug injected: ``positions(n, q_len, C, i)`` the position query i of a
    chunk attends up to (correct: n - q_len + i), C the longest chunk of the call; ``found(b)``
    the sequence whose keys and chunk sequence b's rows are taken to be (correct: b)."""
    from inference_conformance.conformance.contracts.paged_attention.validate import validate_prefill
    from inference_conformance.reference.attention import masked_attention
    from inference_conformance.reference.paged_attention import gather

    validate_prefill(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    loc, lens = query_start_loc.tolist(), seq_lens.tolist()
    C = max(b - a for a, b in zip(loc, loc[1:]))
    out = torch.empty_like(q)
    for b in range(len(lens)):
        f = found(b) if found else b
        n, m = lens[f], loc[f + 1] - loc[f]
        k, v = (gather(c, block_table[f], n).to(acc) for c in (k_cache, v_cache))
        pos = positions(n, m, C, torch.arange(loc[b] - loc[f], loc[b + 1] - loc[f])).to(q.device)
        mask = torch.arange(n, device=q.device)[None, :] <= pos[:, None]
        o = masked_attention(q[loc[b]:loc[b + 1]].to(acc).transpose(0, 1), k, v, scale=scale, mask=mask)
        out[loc[b]:loc[b + 1]] = o.transpose(0, 1).to(q.dtype)
    return out


def _with_prefill(prefill):
    """A mixed-batch zoo entry: the contract's decode call correct (the reference), the
    ``paged_prefill`` buggy."""
    import types

    from inference_conformance.reference.paged_attention import paged_attention

    return types.SimpleNamespace(paged_attention=paged_attention, paged_prefill=prefill)


def chunk_offset_from_zero(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, *, scale):
    """The causal mask of a chunk counted from 0: query i sees keys <= i, not <= prefix + i (the
    cached prefix's offset forgotten, as a prefill kernel run on a later chunk)."""
    return _prefill(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale,
                    positions=lambda n, m, C, i: i)


def last_chunk_as_c(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, *, scale):
    """Every sequence's chunk taken as C tokens long (the call's longest): the cached prefix of a
    shorter last chunk, or of a decode token, is put at n - C, so its queries miss their newest keys."""
    return _prefill(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale,
                    positions=lambda n, m, C, i: n - C + i)


def searches_first_4_sequences(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, *, scale):
    """Finds each query row's sequence by searching only the first 4 entries of query_start_loc
    (a fixed-size search window): the rows of sequences 4, 5, ... are taken as rows of sequence 3,
    attending to its keys at positions past its chunk."""
    return _prefill(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale,
                    positions=lambda n, m, C, i: n - m + i, found=lambda b: min(b, 3))


def chunk_top_left_in_large_batches(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, *, scale):
    """Right for up to 4 sequences; from 5 on a path whose chunk mask is aligned top-left (query
    i of a chunk sees keys <= i): a chunk after a cached prefix in a batch of 5 or more is wrong."""
    big = seq_lens.numel() >= 5
    return _prefill(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale,
                    positions=lambda n, m, C, i: i if big and m > 1 else n - m + i)


# ------------------------------------------------------------ FA-8: the options in the paged kernels
def paged_sinks_dropped_in_merge(q, k_cache, v_cache, block_table, seq_lens, *, scale, window=None, softcap=None,
                                 sinks=None):
    """A paged decode whose split-KV merge forgets the sinks (window and cap right)."""
    from inference_conformance.reference.paged_attention import paged_attention

    validate(q, k_cache, v_cache, block_table, seq_lens, scale, window, softcap, sinks)
    return paged_attention(q, k_cache, v_cache, block_table, seq_lens, scale=scale, window=window, softcap=softcap)


def paged_window_of_one_ignored(q, k_cache, v_cache, block_table, seq_lens, *, scale, window=None, softcap=None,
                                sinks=None):
    """A paged decode that takes FlashAttention's convention (left = W - 1 keys before the query)
    and tests ``left > 0`` for "a window": a window of one key (left = 0) reads as no window."""
    from inference_conformance.reference.paged_attention import paged_attention

    validate(q, k_cache, v_cache, block_table, seq_lens, scale, window, softcap, sinks)
    left = -1 if window is None else window - 1
    return paged_attention(q, k_cache, v_cache, block_table, seq_lens, scale=scale,
                           window=left + 1 if left > 0 else None, softcap=softcap, sinks=sinks)    # BUG: >= 0


def prefill_window_from_chunk_start(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, *, scale,
                                    window=None, softcap=None, sinks=None):
    """A mixed batch whose window is measured from the chunk's start: query i of a chunk sees
    keys t > i − W instead of t > prefix + i − W (the causal edge right): right for a whole
    prompt, too many prefix keys for a chunk after a cached prefix or a decode token."""
    from inference_conformance.conformance.contracts.paged_attention.validate import validate_prefill
    from inference_conformance.reference.attention import masked_attention
    from inference_conformance.reference.paged_attention import gather

    validate_prefill(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, window, softcap, sinks)
    loc = query_start_loc.tolist()
    out = torch.empty_like(q)
    for b, n in enumerate(seq_lens.tolist()):
        m = loc[b + 1] - loc[b]
        k, v = (gather(c, block_table[b], n).to(torch.float64) for c in (k_cache, v_cache))
        i, t = torch.arange(m, device=q.device)[:, None], torch.arange(n, device=q.device)[None, :]
        mask = t <= n - m + i
        if window is not None:
            mask = mask & (t > i - window)                             # BUG: the prefix's offset forgotten
        o = masked_attention(q[loc[b]:loc[b + 1]].to(torch.float64).transpose(0, 1), k, v, scale=scale, mask=mask,
                             softcap=softcap, sinks=None if sinks is None else sinks.to(torch.float64))
        out[loc[b]:loc[b + 1]] = o.transpose(0, 1).to(q.dtype)
    return out


def expect_rejection(claim: str, law, *args, entry: str, match: str | None = None) -> str:
    """Run ``law(*args)`` on the known-bad engine or cache ``entry`` (outside the registry's zoo);
    return the failure's first line, recorded as the test's rejection (the failing comparison
    inside is the point, not the test's error); the test's rows are ``entry``'s ("zoo:<entry>"),
    so the kill rate counts it. Raises AssertionError when the law accepts it."""
    import re

    from inference_conformance.conformance import results

    if entry not in results.recorder().zoo:
        results.recorder().zoo.append(entry)
    try:
        law(*args)
    except AssertionError as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if match is not None and not re.search(match, str(exc)):
            raise
        results.recorder().reset()
        results.record(claim, measured=f"rejected: {text[:200]}", unit="rejection")
        return text
    raise AssertionError(f"the law {getattr(law, '__name__', law)!r} accepted a known-bad implementation")


# ------------------------------------------------------------------ block allocator (PA-4)
from inference_conformance.reference.paged_attention import PagedKVCache  # noqa: E402


class CowForgetsToCopy(PagedKVCache):
    """Copy-on-write that never copies: a write to a shared block goes into the shared block
    itself, so it changes what every other holder of the block reads."""

    def _own(self, seq, index: int) -> int:
        return self.tables[seq][index]


# ------------------------------- the continuous-batching engine (PA-6, PA-8, their pairs)
def serving_engine_zoo() -> dict:
    """Known-bad paged engines by name, registered as ``inference_engine`` zoo entries through the
    paged engine's adapter (``properties/inference_engine/zoo.py``), each rejected there by its
    serve law (``properties/inference_engine/laws/serving.py``: PA-6, PA-8, the pairs)."""
    from inference_conformance.optimized.paged_attention.engine import PagedEngine

    class QueryMissesItsOwnToken(PagedEngine):
        """Each token's query sees the keys before its position but not its own (seq_lens off
        by one; the first token still sees itself)."""

        def _query_lens(self, positions):
            return positions.clamp(min=1).to(torch.int32)
    from inference_conformance.optimized.paged_attention.engine_attention import PagedCacheAttention

    class _WriteAfterAttention(PagedCacheAttention):
        def attend(self, layer, q, k, v):
            out = self._attend(layer, q)
            self._write(layer, k, v)
            return out

    class ChunkKVWrittenAfterAttention(PagedEngine):
        """Each layer attends first and writes the step's K/V after: a chunk's queries miss the
        keys of their own chunk (and a decode token its own key)."""

        def _backend(self, **kw):
            return _WriteAfterAttention(**kw)

    class PublishesPrefixBeforeComputed(PagedEngine):
        """Puts every full block of a prompt into the prefix cache at admission, before its chunk
        is computed: a request arriving while the prompt is still prefilled in chunks reuses
        blocks whose K/V are not written yet (right without a budget or without the cache)."""

        def _admit(self):
            new = super()._admit()
            for r in new:
                computed, r.computed = r.computed, len(r.tokens)
                self._register_blocks(r)
                r.computed = computed
            return new

    class ForkWritesIntoTheSharedBlock(PagedEngine):
        """Copy-on-write that never copies (its bookkeeping is :class:`CowForgetsToCopy`): after a
        fork, the parent and the child write their next tokens' K/V into the partly filled block
        they share, the later write over the earlier."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.book.__class__ = CowForgetsToCopy

    return {"query_misses_its_own_token": QueryMissesItsOwnToken,
            "fork_writes_into_the_shared_block": ForkWritesIntoTheSharedBlock,
            "chunk_kv_written_after_attention": ChunkKVWrittenAfterAttention,
            "prefix_published_before_computed": PublishesPrefixBeforeComputed}


def implementations():
    """The known-bad paged_attention implementations (the bug zoo): each law's ``kills`` names those it
    must reject."""
    from inference_conformance.conformance.registry import known_bad

    return (
        known_bad("paged_attention", "ignores_partial_block", ignores_partial_block),
        known_bad("paged_attention", "reads_nan_slots", reads_nan_slots),
        known_bad("paged_attention", "identity_table", identity_table),
        known_bad("paged_attention", "off_by_one_length", off_by_one_length),
        known_bad("paged_attention", "gqa_modulo", gqa_modulo),
        known_bad("paged_attention", "walk_capped_64_blocks", walk_capped_64_blocks),
        known_bad("paged_attention", "tiles_of_128_skip_block_tail", tiles_of_128_skip_block_tail),
        known_bad("paged_attention", "table_stride_from_shape", table_stride_from_shape),
        known_bad("paged_attention", "cache_strides_from_shape", cache_strides_from_shape),
        known_bad("paged_attention", "scale_folded_in_16bit", scale_folded_in_16bit),
        known_bad("paged_attention", "block_offsets_in_int32", block_offsets_in_int32),
        known_bad("paged_attention", "chunk_offset_from_zero", _with_prefill(chunk_offset_from_zero),
                  bug="a chunk's causal offset counted from 0 instead of from its cached prefix"),
        known_bad("paged_attention", "last_chunk_as_c", _with_prefill(last_chunk_as_c),
                  bug="the last chunk's (and a decode token's) length taken as the chunk size C"),
        known_bad("paged_attention", "searches_first_4_sequences", _with_prefill(searches_first_4_sequences),
                  bug="a query row's sequence searched among the first 4 of query_start_loc only"),
        known_bad("paged_attention", "chunk_top_left_in_large_batches", _with_prefill(chunk_top_left_in_large_batches),
                  bug="from 5 sequences on, a chunk's causal mask aligned top-left"),
        known_bad("paged_attention", "paged_sinks_dropped_in_merge", paged_sinks_dropped_in_merge),
        known_bad("paged_attention", "paged_window_of_one_ignored", paged_window_of_one_ignored),
        known_bad("paged_attention", "prefill_window_from_chunk_start", _with_prefill(prefill_window_from_chunk_start),
                  bug="a chunk's window measured from the chunk's start instead of from its position"),
    )
