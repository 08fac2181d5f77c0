"""Reference paged KV cache: a block allocator with reference counts, block tables with fork and
copy-on-write, the gather of a sequence's blocks into a contiguous cache, and paged attention
as gather-then-attention.

Written to be read, not to be fast. Sources: Kwon et al. 2023 (vLLM, PagedAttention); lecture
001 §4.2 (block tables, blocks of 16 tokens) and §4.4 (shared prefixes, reference counts,
copy-on-write); claims PA-1, PA-3, PA-4, PA-5 of CLAIMS.md.

Terms: a *block* holds ``block_size`` consecutive tokens' K and V; the *block table* of a
sequence lists, for its logical blocks 0, 1, ..., the physical blocks that hold them; the
*slot* of token ``t`` is ``block_table[t // block_size] * block_size + t % block_size``, an
index into the cache viewed as (num_blocks * block_size, Hkv, D); the *slot mapping* of a step
lists the slots its new tokens are written to.
"""
from __future__ import annotations

from collections import deque
from typing import Hashable, Iterable

import torch

from inference_conformance.conformance.contracts.checks import blocks_needed
from inference_conformance.conformance.contracts.paged_attention.validate import validate, validate_prefill
from inference_conformance.reference.attention import attention, masked_attention

# ----------------------------------------------------------------------------------------------
# gather and paged attention (PA-1)
# ----------------------------------------------------------------------------------------------


def gather(cache: torch.Tensor, block_table_row: torch.Tensor, seq_len: int) -> torch.Tensor:
    """One sequence's tokens in logical order, copied out of the paged cache.

    ``cache`` (num_blocks, block_size, Hkv, D); ``block_table_row`` (max_blocks,) integer;
    ``seq_len`` >= 1. Returns (Hkv, seq_len, D) in the cache's dtype. Reads only the first
    ceil(seq_len / block_size) table entries and only the first ``seq_len`` slots of them.
    """
    block_size = cache.shape[1]
    n = -(-int(seq_len) // block_size)
    blocks = block_table_row[:n].to(device=cache.device, dtype=torch.int64)
    tokens = cache[blocks].reshape(n * block_size, *cache.shape[2:])[: int(seq_len)]    # (seq_len, Hkv, D)
    return tokens.permute(1, 0, 2)                                                       # (Hkv, seq_len, D)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_table: torch.Tensor, seq_lens: torch.Tensor, *, scale: float, window: int | None = None,
                    softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The "reference" implementation of the paged_attention contract: for each sequence,
    gather its K and V into a contiguous cache (:func:`gather`) and call the reference
    attention (float64, non-causal: the decode query sees every cached token; with a window,
    causal: the last query of its sequence sees the last W tokens). The options (FA-8) as the
    attention reference applies them.

    q (B, Hq, D); k_cache, v_cache (num_blocks, block_size, Hkv, D); block_table (B, max_blocks)
    int32; seq_lens (B,) int32. Returns (B, Hq, D) in q's dtype. Raises as the contract's
    ``validate``.
    """
    shape = validate(q, k_cache, v_cache, block_table, seq_lens, scale, window, softcap, sinks)
    lens = seq_lens.to("cpu", torch.int64).tolist()
    out = torch.empty(shape.B, shape.Hq, shape.D, dtype=q.dtype, device=q.device)
    for b, n in enumerate(lens):
        k = gather(k_cache, block_table[b], n)[None]                        # (1, Hkv, n, D)
        v = gather(v_cache, block_table[b], n)[None]
        out[b] = attention(q[b][None, :, None, :], k, v, causal=window is not None, scale=scale, window=window,
                           softcap=softcap, sinks=sinks)[0, :, 0]
    return out


def chunk_mask(seq_len: int, q_len: int, device=None, window: int | None = None) -> torch.Tensor:
    """The causal mask of a chunk of ``q_len`` query tokens that are the last of ``seq_len``
    cached tokens, (q_len, seq_len) bool: query i (position seq_len - q_len + i, the offset of
    the cached prefix) sees the keys t <= that position (bottom-right aligned); with a
    ``window`` W only those t > position - W (FA-8)."""
    pos = torch.arange(seq_len - q_len, seq_len, device=device)
    t = torch.arange(seq_len, device=device)[None, :]
    return (t <= pos[:, None]) & (t > pos[:, None] - (window if window is not None else seq_len))


def paged_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                  seq_lens: torch.Tensor, query_start_loc: torch.Tensor, *, scale: float, window: int | None = None,
                  softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The reference mixed batch of the contract's ``paged_prefill`` (claim PA-8): for each
    sequence, gather its K and V (:func:`gather`) and attend its chunk's queries through
    :func:`inference_conformance.reference.attention.masked_attention` with the chunk's causal mask (:func:`chunk_mask`),
    in float64.

    q (N, Hq, D), the query tokens of all sequences, sequence b's at rows query_start_loc[b] ..
    query_start_loc[b+1] - 1; k_cache, v_cache (num_blocks, block_size, Hkv, D); block_table
    (B, max_blocks) int32; seq_lens (B,) int32 (the chunk included); query_start_loc (B + 1,)
    int32. Returns (N, Hq, D) in q's dtype; the options (FA-8) as the attention reference
    applies them. Raises as the contract's ``validate_prefill``.
    """
    validate_prefill(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, window, softcap, sinks)
    lens = seq_lens.to("cpu", torch.int64).tolist()
    loc = query_start_loc.to("cpu", torch.int64).tolist()
    out = torch.empty_like(q)
    for b, n in enumerate(lens):
        q0, q1 = loc[b], loc[b + 1]
        k = gather(k_cache, block_table[b], n).to(torch.float64)          # (Hkv, n, D)
        v = gather(v_cache, block_table[b], n).to(torch.float64)
        qb = q[q0:q1].to(torch.float64).transpose(0, 1)                    # (Hq, q_len, D)
        o = masked_attention(qb, k, v, scale=scale, mask=chunk_mask(n, q1 - q0, q.device, window), softcap=softcap,
                             sinks=None if sinks is None else sinks.to(torch.float64))   # (Hq, q_len, D)
        out[q0:q1] = o.transpose(0, 1).to(q.dtype)
    return out


# ----------------------------------------------------------------------------------------------
# the block allocator (PA-4)
# ----------------------------------------------------------------------------------------------


class OutOfBlocks(RuntimeError):
    """No free block is left in the pool (the serving layer preempts or waits)."""


class BlockAllocator:
    """A pool of ``num_blocks`` physical blocks with a free list and reference counts.

    ``allocate()`` takes a free block (reference count 1); ``share(b)`` adds a reference;
    ``free(b)`` drops one, and the block returns to the free list when none is left. Freeing a
    block that is already free raises ValueError (a double free), as does any block id outside
    [0, num_blocks). Invariant: ``num_free + num_used == num_blocks``.
    """

    def __init__(self, num_blocks: int, block_size: int):
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be an int >= 1, got {num_blocks!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an int >= 1, got {block_size!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self.refcount = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def shuffle_free(self, generator: torch.Generator) -> None:
        """Reorder the free list by a random permutation drawn from ``generator``: the pool of a
        server that has served other requests hands blocks out in no particular order."""
        perm = torch.randperm(len(self._free), generator=generator).tolist()
        free = list(self._free)
        self._free = deque(free[i] for i in perm)

    def free_blocks(self) -> list[int]:
        """The free list, in the order blocks will be handed out."""
        return list(self._free)

    def _check(self, block: int) -> None:
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"block {block} outside [0, num_blocks) = [0, {self.num_blocks})")

    def allocate(self) -> int:
        """A free block with reference count 1; raises :class:`OutOfBlocks` when none is left."""
        if not self._free:
            raise OutOfBlocks(f"all {self.num_blocks} blocks are in use")
        block = self._free.popleft()
        self.refcount[block] = 1
        return block

    def share(self, block: int) -> None:
        """One more holder of a used block (fork, prefix cache); ValueError for a free block."""
        self._check(block)
        if self.refcount[block] == 0:
            raise ValueError(f"block {block} is free: it cannot be shared")
        self.refcount[block] += 1

    def free(self, block: int) -> None:
        """Drop one reference; at zero the block returns to the free list. ValueError for a
        block that is already free (double free)."""
        self._check(block)
        if self.refcount[block] == 0:
            raise ValueError(f"double free: block {block} is already free")
        self.refcount[block] -= 1
        if self.refcount[block] == 0:
            self._free.append(block)


class PagedKVCache:
    """Sequences over a :class:`BlockAllocator`: block tables, appends, fork, copy-on-write
    writes, free, and (with ``kv_shape``) the K/V storage itself.

    ``kv_shape`` = (Hkv, D): keeps ``k``, ``v`` tensors (num_blocks, block_size, Hkv, D) in
    ``dtype``, unwritten slots NaN; without it only the bookkeeping runs (serving simulations,
    PA-3, PA-5). Sequence ids are any hashable values.

    - ``append(seq, k, v)`` writes one token at position ``length(seq)``: a new block when the
      last one is full; a copy first when the last block is shared (copy-on-write).
    - ``write(seq, pos, k, v)`` overwrites position ``pos`` < length; a shared block is copied
      first, so no other sequence ever sees the write (PA-4).
    - ``fork(parent, child)`` gives ``child`` the parent's table, sharing every block.
    - ``free(seq)`` drops the sequence's references.

    Errors: ValueError for an unknown or existing sequence id, a position out of range, K/V of
    the wrong shape; :class:`OutOfBlocks` when a block is needed and none is free (the state is
    then unchanged).
    """

    def __init__(self, num_blocks: int, block_size: int, kv_shape: tuple[int, int] | None = None,
                 dtype: torch.dtype = torch.float64, device: str | torch.device = "cpu"):
        self.allocator = BlockAllocator(num_blocks, block_size)
        self.block_size = block_size
        self.tables: dict[Hashable, list[int]] = {}
        self.lengths: dict[Hashable, int] = {}
        self.copies = 0  # copy-on-write copies made so far
        #: (source, destination) of every copy-on-write, in order: a server without K/V here
        #: copies these blocks in its own caches before writing the step's tokens
        self.copy_log: list[tuple[int, int]] = []
        self.k = self.v = None
        if kv_shape is not None:
            Hkv, D = kv_shape
            self.k = torch.full((num_blocks, block_size, Hkv, D), float("nan"), dtype=dtype, device=device)
            self.v = torch.full_like(self.k, float("nan"))

    # -- bookkeeping
    def _table(self, seq) -> list[int]:
        if seq not in self.tables:
            raise ValueError(f"unknown sequence {seq!r}")
        return self.tables[seq]

    def new_sequence(self, seq) -> None:
        if seq in self.tables:
            raise ValueError(f"sequence {seq!r} already exists")
        self.tables[seq] = []
        self.lengths[seq] = 0

    def length(self, seq) -> int:
        self._table(seq)
        return self.lengths[seq]

    def slots_held(self) -> int:
        """Token slots of the blocks in use (each physical block counted once)."""
        return self.allocator.num_used * self.block_size

    def tokens_held(self) -> int:
        """Tokens stored, each physical slot counted once (a shared prefix counts once)."""
        seen: dict[int, int] = {}
        for seq, table in self.tables.items():
            n = self.lengths[seq]
            for i, blk in enumerate(table):
                seen[blk] = max(seen.get(blk, 0), min(self.block_size, n - i * self.block_size))
        return sum(seen.values())

    def slot(self, seq, pos: int) -> int:
        """The physical slot of token ``pos`` of ``seq``: table[pos // bs] * bs + pos % bs."""
        table = self._table(seq)
        if not 0 <= pos < self.lengths[seq]:
            raise ValueError(f"position {pos} outside [0, {self.lengths[seq]}) of sequence {seq!r}")
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def block_table(self, seqs: Iterable, max_blocks: int | None = None, fill: int = -1,
                    device: str | torch.device = "cpu") -> torch.Tensor:
        """(len(seqs), max_blocks) int32 block table; entries past a sequence's blocks hold ``fill``."""
        seqs = list(seqs)
        width = max_blocks or max(1, max(len(self._table(s)) for s in seqs))
        out = torch.full((len(seqs), width), fill, dtype=torch.int32)
        for r, s in enumerate(seqs):
            t = self._table(s)
            if len(t) > width:
                raise ValueError(f"sequence {s!r} has {len(t)} blocks, more than max_blocks={width}")
            out[r, : len(t)] = torch.tensor(t, dtype=torch.int32)
        return out.to(device)

    # -- writes
    def _store(self, block: int, offset: int, k, v) -> None:
        if self.k is None:
            return
        self.k[block, offset] = k.to(self.k.dtype)
        self.v[block, offset] = v.to(self.v.dtype)

    def _own(self, seq, index: int) -> int:
        """Make logical block ``index`` of ``seq`` private (copy-on-write) and return it."""
        table = self.tables[seq]
        blk = table[index]
        if self.allocator.refcount[blk] == 1:
            return blk
        new = self.allocator.allocate()
        if self.k is not None:
            self.k[new] = self.k[blk]
            self.v[new] = self.v[blk]
        self.allocator.free(blk)
        table[index] = new
        self.copies += 1
        self.copy_log.append((blk, new))
        return new

    def append(self, seq, k=None, v=None) -> int:
        """Write one token at position ``length(seq)``; returns its slot."""
        table = self._table(seq)
        if self.k is not None:  # validate before touching anything
            self._store_check(k, v)
        pos = self.lengths[seq]
        index, offset = divmod(pos, self.block_size)
        if index == len(table):
            table.append(self.allocator.allocate())
        else:
            self._own(seq, index)
        blk = table[index]
        self._store(blk, offset, k, v)
        self.lengths[seq] = pos + 1
        return blk * self.block_size + offset

    def append_tokens(self, seq, n: int) -> None:
        """Book ``n`` tokens without K/V (bookkeeping only); all or nothing on OutOfBlocks."""
        table = self._table(seq)
        pos = self.lengths[seq]
        new_blocks = -(-(pos + n) // self.block_size) - len(table)
        cow = 1 if (n > 0 and pos % self.block_size and self.allocator.refcount[table[-1]] > 1) else 0
        if new_blocks + cow > self.allocator.num_free:
            raise OutOfBlocks(f"{new_blocks + cow} blocks needed, {self.allocator.num_free} free")
        if cow:
            self._own(seq, len(table) - 1)
        for _ in range(max(0, new_blocks)):
            table.append(self.allocator.allocate())
        self.lengths[seq] = pos + n

    def write(self, seq, pos: int, k=None, v=None) -> int:
        """Overwrite token ``pos`` (< length) of ``seq``, copying a shared block first; returns the slot."""
        self._table(seq)
        if not 0 <= pos < self.lengths[seq]:
            raise ValueError(f"position {pos} outside [0, {self.lengths[seq]}) of sequence {seq!r}")
        if self.k is not None:
            self._store_check(k, v)
        index, offset = divmod(pos, self.block_size)
        blk = self._own(seq, index)
        self._store(blk, offset, k, v)
        return blk * self.block_size + offset

    def _store_check(self, k, v) -> None:
        Hkv, D = self.k.shape[2:]
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != (Hkv, D):
                raise ValueError(f"{name} must be a tensor of shape (Hkv, D) = ({Hkv}, {D})")

    def fork(self, parent, child) -> None:
        """``child`` starts as a copy of ``parent`` that shares all of its blocks."""
        table = self._table(parent)
        if child in self.tables:
            raise ValueError(f"sequence {child!r} already exists")
        for blk in table:
            self.allocator.share(blk)
        self.tables[child] = list(table)
        self.lengths[child] = self.lengths[parent]

    def free(self, seq) -> None:
        """Drop the sequence and its references to its blocks."""
        for blk in self._table(seq):
            self.allocator.free(blk)
        del self.tables[seq]
        del self.lengths[seq]

    def read(self, seq) -> tuple[torch.Tensor, torch.Tensor]:
        """The sequence's K and V in logical order, (Hkv, length, D) each (needs ``kv_shape``)."""
        if self.k is None:
            raise ValueError("this cache keeps no K/V (created without kv_shape)")
        table = torch.tensor(self._table(seq) or [0], dtype=torch.int64)
        n = self.lengths[seq]
        if n == 0:
            Hkv, D = self.k.shape[2:]
            return self.k.new_empty(Hkv, 0, D), self.v.new_empty(Hkv, 0, D)
        return gather(self.k, table, n), gather(self.v, table, n)


def waste_per_request(lengths: Iterable[int], block_size: int) -> list[int]:
    """Slots reserved but not holding a token, per request, counted by an allocator: each
    request appends its tokens into a fresh :class:`PagedKVCache` pool and the unfilled slots of
    its blocks are read back (PA-5)."""
    lengths = [int(n) for n in lengths]
    cache = PagedKVCache(max(1, sum(-(-n // block_size) for n in lengths)), block_size)
    out = []
    for i, n in enumerate(lengths):
        cache.new_sequence(i)
        cache.append_tokens(i, n)
        out.append(len(cache.tables[i]) * block_size - cache.length(i))
    return out


__all__ = ["gather", "paged_attention", "paged_prefill", "chunk_mask", "blocks_needed", "BlockAllocator", "OutOfBlocks", "PagedKVCache",
           "waste_per_request"]


def implementations():
    """The paged-attention reference (gather the blocks, then the reference attention), decode
    and the mixed batch."""
    import types

    from inference_conformance.conformance.registry import builtin

    return (builtin("paged_attention", "reference",
                    types.SimpleNamespace(paged_attention=paged_attention, paged_prefill=paged_prefill),
                    batch_invariant=True),)
