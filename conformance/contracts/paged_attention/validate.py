"""The checks of the ``paged_attention`` contract (``conformance/contracts/paged_attention/contract.py``
states the calls): :func:`validate` for ``paged_attention`` (decode: one query token per
sequence) and :func:`validate_prefill` for ``paged_prefill`` (chunked prefill: ``query_start_loc``
delimits each sequence's query tokens), the sizes they return (:class:`PagedShape`) and
:func:`query_lens`. The checks it shares with other contracts (index tensors, devices, the block
table and its lengths) are :mod:`inference_conformance.conformance.contracts.checks`'s. Every check raises TypeError or
ValueError naming the argument; the block table and lengths are read on the host.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from inference_conformance.conformance.contracts.attention import validate_options
from inference_conformance.conformance.contracts.checks import (check_block_table, check_index, check_kv,
                                                                 check_live_blocks, check_scale, check_seq_lens,
                                                                 check_tensor)
from inference_conformance.conformance.contracts.paged_attention.contract import DTYPES, INDEX_DTYPE, MAX_HEAD_DIM


@dataclass(frozen=True)
class PagedShape:
    """The sizes of one call: batch, query heads, KV heads, head dim, physical blocks, tokens
    per block, table width (max_blocks per sequence)."""

    B: int
    Hq: int
    Hkv: int
    D: int
    num_blocks: int
    block_size: int
    max_blocks: int

    @property
    def group(self) -> int:
        """Query heads per KV head (Hq // Hkv)."""
        return self.Hq // self.Hkv


def validate(q, k_cache, v_cache, block_table, seq_lens, scale, window=None, softcap=None, sinks=None) -> PagedShape:
    """Check one call against the contract; return its sizes.

    Raises TypeError (not a tensor, unsupported or mixed dtypes, block_table / seq_lens not
    int32, ``scale`` not a real number) or ValueError (wrong rank, caches whose shapes disagree,
    Hq not a multiple of Hkv, D outside 1..256, mixed devices, ``seq_lens`` below 1 or above
    the table's capacity max_blocks * block_size, a live block-table entry outside
    [0, num_blocks), a non-finite scale or one past the float32 range for inputs other than
    float64), each naming the argument; FA-8's options as the attention contract's
    ``validate_options`` checks them (a decode query is causal). Reads ``block_table`` and
    ``seq_lens`` on the host (one synchronisation on CUDA).
    """
    for name, t, rank, dims in (("q", q, 3, "(B, Hq, D)"),
                                ("k_cache", k_cache, 4, "(num_blocks, block_size, Hkv, D)"),
                                ("v_cache", v_cache, 4, "(num_blocks, block_size, Hkv, D)")):
        check_tensor(name, t, rank, dims, DTYPES, "paged_attention")
    check_index("block_table", block_table, "(B, max_blocks)", (INDEX_DTYPE,))
    check_index("seq_lens", seq_lens, "(B,)", (INDEX_DTYPE,))
    check_kv(q, k_cache, v_cache, ("q", "k_cache", "v_cache"), (("block_table", block_table), ("seq_lens", seq_lens)))
    B, Hq, D = q.shape
    num_blocks, block_size, Hkv, Dk = k_cache.shape
    if Dk != D:
        raise ValueError(f"k_cache/v_cache head dim {Dk} differs from q head dim {D}")
    if B < 1 or Hq < 1:
        raise ValueError(f"q must hold at least one sequence and one head, got shape {tuple(q.shape)}")
    if num_blocks < 1 or block_size < 1 or Hkv < 1:
        raise ValueError(f"k_cache must have num_blocks, block_size and Hkv >= 1, got shape {tuple(k_cache.shape)}")
    if Hq % Hkv:
        raise ValueError(f"q heads ({Hq}) must be a multiple of the caches' KV heads ({Hkv})")
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"head dim D must be in 1..{MAX_HEAD_DIM}, got {D}")
    max_blocks = check_block_table(block_table, B)
    check_scale(scale, q.dtype)
    lens = check_seq_lens(seq_lens, B, max_blocks * block_size, "max_blocks * block_size")
    check_live_blocks(block_table, lens, block_size, num_blocks)
    validate_options(q, True, window, softcap, sinks)
    return PagedShape(B, Hq, Hkv, D, num_blocks, block_size, max_blocks)


def query_lens(query_start_loc: torch.Tensor) -> torch.Tensor:
    """q_len_b = query_start_loc[b+1] - query_start_loc[b]: query tokens per sequence, (B,) int64."""
    loc = query_start_loc.detach().to("cpu", torch.int64)
    return loc[1:] - loc[:-1]


def validate_prefill(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, window=None, softcap=None,
                     sinks=None) -> PagedShape:
    """Check a ``paged_prefill`` call; return its sizes (``B``: the sequences, from ``seq_lens``).

    Raises as :func:`validate` (``q`` is (N, Hq, D) here: its first dimension is the query
    tokens, not the sequences), and TypeError for a ``query_start_loc`` that is not an int32
    tensor, ValueError for one not of shape (B + 1,), on another device, not starting at 0, not
    strictly increasing (every sequence has at least one query token), not ending at N, or with a
    sequence's query tokens above its ``seq_lens`` (the chunk is part of the cached tokens), each
    naming the argument; the options as :func:`validate`. Reads ``query_start_loc`` on the host.
    """
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    if q.dim() != 3:
        raise ValueError(f"q must have 3 dimensions (N, Hq, D), got shape {tuple(q.shape)}")
    check_index("seq_lens", seq_lens, "(B,)", (INDEX_DTYPE,))
    if seq_lens.dim() != 1 or seq_lens.shape[0] < 1:
        raise ValueError(f"seq_lens must have shape (B,) with B >= 1, got {tuple(seq_lens.shape)}")
    B = seq_lens.shape[0]
    check_index("query_start_loc", query_start_loc, "(B + 1,)", (INDEX_DTYPE,))
    if tuple(query_start_loc.shape) != (B + 1,):
        raise ValueError(f"query_start_loc must have shape (B + 1,) = ({B + 1},), got {tuple(query_start_loc.shape)}")
    if query_start_loc.device != q.device:
        raise ValueError(f"query_start_loc is on {query_start_loc.device}, q on {q.device}: all tensors must be "
                         "on one device")
    # the sequences' checks of ``validate``, with q's rows standing for the B sequences
    rows = q.new_empty((B, *q.shape[1:])) if q.dtype in DTYPES else q
    shape = validate(rows, k_cache, v_cache, block_table, seq_lens, scale)
    loc = query_start_loc.detach().to("cpu", torch.int64)
    N = q.shape[0]
    if int(loc[0]) != 0:
        raise ValueError(f"query_start_loc must start at 0, got query_start_loc[0] = {int(loc[0])}")
    qlens = loc[1:] - loc[:-1]
    bad = (qlens < 1).nonzero()
    if bad.numel():
        b = int(bad[0, 0])
        raise ValueError(f"query_start_loc must be strictly increasing (each sequence has >= 1 query token); "
                         f"query_start_loc[{b}] = {int(loc[b])}, query_start_loc[{b + 1}] = {int(loc[b + 1])}")
    if int(loc[-1]) != N:
        raise ValueError(f"query_start_loc must end at N = q.shape[0] = {N}, got query_start_loc[{B}] = {int(loc[-1])}")
    lens = seq_lens.detach().to("cpu", torch.int64)
    over = (qlens > lens).nonzero()
    if over.numel():
        b = int(over[0, 0])
        raise ValueError(f"query_start_loc gives sequence {b} {int(qlens[b])} query tokens, more than its "
                         f"seq_lens[{b}] = {int(lens[b])} (the chunk's tokens are part of the cached ones)")
    validate_options(q, True, window, softcap, sinks)
    return shape
