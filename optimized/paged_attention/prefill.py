"""The mixed batch of one serving step in Triton: prefill chunks and decode tokens of several
sequences in one launch over the paged KV cache (the ``paged_prefill`` function of the
paged_attention contract; claim PA-8), in the shape of vLLM's unified attention and FlashInfer's
batch prefill with paged KV.

Each program takes a query tile of one sequence: BLOCK_Q consecutive query tokens of its chunk
times the GROUP query heads that read one KV head (GQA: BLOCK_M = BLOCK_Q · BLOCK_H rows, row r
is token r // BLOCK_H, head r % BLOCK_H, so the K/V tile is loaded once for the group and a
decode token, q_len = 1, fills BLOCK_H rows). The host lists the tiles (sequence, first query)
of the batch once per call, as FlashInfer's plan step does; the grid is splits x tiles x KV
heads, 1-D. A program walks its sequence's blocks through the block table with the paged core
it shares with the decode kernel (:func:`inference_conformance.optimized.paged_attention.kv_tile.paged_kv_tile`: ``phys =
block_table[b, t // PAGE]``, slot ``t % PAGE``), causal with the bottom-right offset of the
cached prefix: query i of a chunk of q_len tokens over seq_len cached ones is at position
seq_len - q_len + i and sees the keys t <= that; keys past the tile's last visible position
are never walked. With several splits over the keys (a small batch of long sequences) each
program writes a partial output and its log-sum-exp, merged exactly by the split-KV merge of
:mod:`inference_conformance.optimized.attention.tiles` (FA-7); a split past a tile's last visible key weighs 0.

Float64 inputs are computed in float64, the others in float32; products are broadcast
multiplies and sums, not ``tl.dot`` (as the decode kernel), so it runs under the interpreter as
compiled. The host wrapper validates everything with the contract's ``validate_prefill``
before any launch. Claim PA-8; sources: Agrawal et al. 2024 (Sarathi-Serve), Kwon et al. 2023
(vLLM), lecture 001 §4.5.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from inference_conformance.conformance.contracts.checks import check_num_splits
from inference_conformance.conformance.contracts.paged_attention.validate import validate_prefill
from inference_conformance.conformance.device import triton_interpreted
from inference_conformance.optimized.attention.batch_invariant import merge_in_order
from inference_conformance.optimized.attention.flash_decoding import option_args
from inference_conformance.optimized.attention.tiles import fold_scale, log_sum_exp, merge_splits
from inference_conformance.optimized.paged_attention.kv_tile import join_sinks, paged_kv_tile
from inference_conformance.optimized.paged_attention.splits import split_plan
from inference_conformance.optimized.triton_shared import check_device, flat_grid, tile_loop


@triton.jit
def _paged_prefill_kernel(
        Q_ptr, K_ptr, V_ptr, BT_ptr, LENS_ptr, QSL_ptr, TSEQ_ptr, TQ0_ptr, O_ptr, OP_ptr, LSE_ptr,
        stride_qn, stride_qh, stride_qd,
        stride_kn, stride_ks, stride_kh, stride_kd,
        stride_vn, stride_vs, stride_vh, stride_vd,
        stride_btb, stride_btm, stride_sl, stride_qsl,
        stride_on, stride_oh, stride_od,
        stride_pn, stride_ph, stride_ps, stride_pd,
        stride_ln, stride_lh, stride_ls,
        Hkv, D, GROUP, NUM_TILES, TOKENS_PER_SPLIT, NUM_SPLITS, scale, WINDOW, Cap_ptr, Sinks_ptr,
        PAGE: tl.constexpr, SPLIT: tl.constexpr, ACC64: tl.constexpr,
        BLOCK_Q: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr):
    """1-D grid of NUM_SPLITS · NUM_TILES · Hkv programs: program split + NUM_SPLITS · (tile +
    NUM_TILES · kvh). Tile ``tile`` is the BLOCK_Q query tokens from TQ0_ptr[tile] of sequence
    TSEQ_ptr[tile]; split s covers keys [s·TOKENS_PER_SPLIT, (s+1)·TOKENS_PER_SPLIT). Without
    SPLIT writes out (N, Hq, D); with SPLIT writes o_s (N, Hq, S, D) and lse_s (N, Hq, S).
    FA-8's options: HAS_WINDOW starts the tile at its first row's first visible key (row p sees
    keys > p − WINDOW) and masks the band; the cap in the key tile; HAS_SINKS (unsplit) joins
    Sinks_ptr[h] at the end, a split call leaves them to the merge."""
    BLOCK_M: tl.constexpr = BLOCK_Q * BLOCK_H
    pid = tl.program_id(0)
    split = pid % NUM_SPLITS
    rest = pid // NUM_SPLITS
    tile = rest % NUM_TILES
    kvh = (rest // NUM_TILES).to(tl.int64)
    b = tl.load(TSEQ_ptr + tile).to(tl.int64)
    q0 = tl.load(TQ0_ptr + tile).to(tl.int64)                              # first query of the tile in its chunk
    qs = tl.load(QSL_ptr + b * stride_qsl).to(tl.int64)
    q_len = tl.load(QSL_ptr + (b + 1) * stride_qsl).to(tl.int64) - qs
    seq_len = tl.load(LENS_ptr + b * stride_sl).to(tl.int64)
    prefix = seq_len - q_len                                               # tokens cached before the chunk
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    i = q0 + offs_m // BLOCK_H                                             # (BLOCK_M,) query of the chunk
    j = offs_m % BLOCK_H                                                   # head within the group
    h = kvh * GROUP + j
    row_ok = (i < q_len) & (j < GROUP)
    d_mask = offs_d < D
    io_mask = row_ok[:, None] & d_mask[None, :]
    tok = qs + i                                                           # row of q / out
    q = tl.load(Q_ptr + tok[:, None] * stride_qn + h[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=io_mask, other=0.0)                                   # (BLOCK_M, BLOCK_D)
    ACC: tl.constexpr = tl.float64 if ACC64 else tl.float32
    q = q.to(ACC)
    row_lim = prefix + i                                                   # last visible key of each row
    state = (tl.zeros([BLOCK_M, BLOCK_D], dtype=ACC), tl.full([BLOCK_M], float("-inf"), dtype=ACC),
             tl.zeros([BLOCK_M], dtype=ACC))                               # (acc, m, l)
    start = split * TOKENS_PER_SPLIT
    last = prefix + tl.minimum(q0 + BLOCK_Q, q_len)                        # past the tile's last visible key
    end = tl.minimum(start + TOKENS_PER_SPLIT, last)
    if HAS_WINDOW:     # keys before the tile's first row's window are never read
        start = tl.maximum(start, tl.minimum(prefix + q0 - WINDOW + 1, end))
    cap = tl.load(Cap_ptr).to(ACC)
    acc, m_i, l_i = tile_loop(state, (q, row_lim, row_lim - WINDOW + 1, cap, BT_ptr + b * stride_btb,
                                      K_ptr + kvh * stride_kh, V_ptr + kvh * stride_vh, end, offs_n, offs_d, d_mask,
                                      scale, stride_btm, stride_kn, stride_ks, stride_kd, stride_vn, stride_vs,
                                      stride_vd),
                              start, end, BLOCK_N, paged_kv_tile, (PAGE, True, HAS_WINDOW, HAS_SOFTCAP))
    if HAS_SINKS and not SPLIT:
        acc, m_i, l_i = join_sinks(acc, m_i, l_i, Sinks_ptr, h, row_ok, ACC)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_safe[:, None]
    if SPLIT:
        lse = log_sum_exp(m_i, l_i)                                        # float64
        tl.store(OP_ptr + tok[:, None] * stride_pn + h[:, None] * stride_ph + split * stride_ps
                 + offs_d[None, :] * stride_pd, o.to(OP_ptr.dtype.element_ty), mask=io_mask)
        tl.store(LSE_ptr + tok * stride_ln + h * stride_lh + split * stride_ls, lse.to(LSE_ptr.dtype.element_ty),
                 mask=row_ok)
    else:
        tl.store(O_ptr + tok[:, None] * stride_on + h[:, None] * stride_oh + offs_d[None, :] * stride_od,
                 o.to(O_ptr.dtype.element_ty), mask=io_mask)


#: Keys per tile under the interpreter (fewer, larger tiles: its cost is per operation).
INTERPRET_BLOCK_N = 64
#: Query rows (BLOCK_Q · BLOCK_H) of a program: query tokens per tile are ROWS // BLOCK_H, 1 to 16.
ROWS = 16


def _tiles(dtype: torch.dtype, group: int, D: int) -> tuple[int, int, int, int]:
    """(BLOCK_Q, BLOCK_H, BLOCK_N, BLOCK_D): a tile of BLOCK_Q tokens x BLOCK_H heads, its 3-D
    product tile BLOCK_Q·BLOCK_H·BLOCK_N·BLOCK_D bounded."""
    BLOCK_H = triton.next_power_of_2(group)
    BLOCK_Q = max(1, min(16, ROWS // BLOCK_H))
    BLOCK_D = triton.next_power_of_2(D)
    if triton_interpreted():
        return BLOCK_Q, BLOCK_H, INTERPRET_BLOCK_N, BLOCK_D
    budget = 4096 if dtype == torch.float64 else 16384
    n = budget // (BLOCK_Q * BLOCK_H * BLOCK_D)
    return BLOCK_Q, BLOCK_H, max(4, min(64, 1 << max(0, n.bit_length() - 1))), BLOCK_D


def plan_tiles(query_start_loc: torch.Tensor, block_q: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The query tiles of a mixed batch: (sequence, first query of the chunk) of each tile of
    ``block_q`` query tokens, as two (num_tiles,) int32 tensors on the host."""
    loc = query_start_loc.to("cpu", torch.int64)
    qlens = (loc[1:] - loc[:-1]).tolist()
    seqs, starts = [], []
    for b, n in enumerate(qlens):
        for q0 in range(0, n, block_q):
            seqs.append(b)
            starts.append(q0)
    return torch.tensor(seqs, dtype=torch.int32), torch.tensor(starts, dtype=torch.int32)


def paged_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                  seq_lens: torch.Tensor, query_start_loc: torch.Tensor, *, scale: float,
                  num_splits: int | None = None, window: int | None = None, softcap: float | None = None,
                  sinks: torch.Tensor | None = None, batch_invariant: bool = False) -> torch.Tensor:
    """The mixed batch (claim PA-8): q (N, Hq, D), sequence b's query tokens at rows
    query_start_loc[b] .. query_start_loc[b+1] - 1, the last of its seq_lens[b] cached tokens;
    k_cache, v_cache (num_blocks, block_size, Hkv, D); block_table (B, max_blocks) int32;
    seq_lens (B,) int32; query_start_loc (B + 1,) int32 -> (N, Hq, D) in q's dtype, each query
    causal over its sequence with the offset of the cached prefix.

    ``num_splits``: split each tile's keys into this many ranges (merged exactly; at most
    MAX_SPLITS); None chooses from the grid (several only for few tiles of long sequences).
    ``window``, ``softcap``, ``sinks``: the contract's options (FA-8). ``batch_invariant``: splits
    of a fixed size, always merged, in split order (the "triton_invariant" implementation).
    Raises TypeError / ValueError as the contract's ``validate_prefill``, ValueError for a bad
    ``num_splits`` (or one given with ``batch_invariant``) or CPU tensors without the interpreter.
    """
    shape = validate_prefill(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, window, softcap,
                             sinks)
    check_device(q, "q")
    check_num_splits(num_splits, batch_invariant)
    win, cap, sinks = option_args(q, window, softcap, sinks)
    q, scale = fold_scale(q, scale)                                          # float64: scale into q
    N = q.shape[0]
    BLOCK_Q, BLOCK_H, BLOCK_N, BLOCK_D = _tiles(q.dtype, shape.group, shape.D)
    tile_seq, tile_q0 = plan_tiles(query_start_loc, BLOCK_Q)
    tiles = tile_seq.numel()
    max_len = int(seq_lens.max())
    per, S, split = split_plan(tiles, shape.Hkv, max_len, BLOCK_N, q.device, num_splits, batch_invariant,
                               split_interpreted=tiles <= 2)
    acc64 = q.dtype == torch.float64
    out = torch.empty(N, shape.Hq, shape.D, dtype=q.dtype, device=q.device)
    if split:
        part_dtype = torch.float64 if acc64 else torch.float32
        o_part = torch.empty(N, shape.Hq, S, shape.D, dtype=part_dtype, device=q.device)
        lse = torch.empty(N, shape.Hq, S, dtype=torch.float64, device=q.device)
    else:
        o_part = out.unsqueeze(2)                                            # unused (SPLIT is off)
        lse = torch.empty(1, 1, 1, dtype=torch.float32, device=q.device)
    _paged_prefill_kernel[flat_grid(S, tiles, shape.Hkv)](
        q, k_cache, v_cache, block_table, seq_lens, query_start_loc, tile_seq.to(q.device), tile_q0.to(q.device),
        out, o_part, lse,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_table.stride(), seq_lens.stride(0),
        query_start_loc.stride(0), *out.stride(), *o_part.stride(), *lse.stride(),
        shape.Hkv, shape.D, shape.group, tiles, per, S, scale, win, cap, cap if sinks is None else sinks,
        PAGE=shape.block_size, SPLIT=split, ACC64=acc64,
        BLOCK_Q=BLOCK_Q, BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D,
        HAS_WINDOW=window is not None, HAS_SOFTCAP=softcap is not None, HAS_SINKS=sinks is not None)
    if split:   # the split-KV merge, each query token a row: (N·Hq, 1, S, D)
        merge = merge_in_order if batch_invariant else merge_splits
        parts = (o_part.view(N * shape.Hq, 1, S, shape.D), lse.view(N * shape.Hq, 1, S), out.unsqueeze(2))
        if sinks is None:
            merge(*parts)
        else:
            merge(*parts, sinks)
    return out


def paged_prefill_invariant(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                            seq_lens: torch.Tensor, query_start_loc: torch.Tensor, *, scale: float,
                            window: int | None = None, softcap: float | None = None,
                            sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The mixed batch of "triton_invariant": :func:`paged_prefill` with ``batch_invariant=True``;
    shapes, options and errors as there."""
    return paged_prefill(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale=scale, window=window,
                         softcap=softcap, sinks=sinks, batch_invariant=True)


def compile_variants():
    """The mixed-batch kernel split (fp16, GQA 4) and unsplit with a float64 accumulator (no GQA),
    D 64, at the tiles :func:`_tiles` gives each on GPU."""
    from inference_conformance.optimized.triton_shared import CompileVariant

    out = []
    for dt, dtype, acc64, split, group in (("*fp16", torch.float16, False, True, 4), ("*fp64", torch.float64, True, False, 1)):
        bq, bh, bn, bd = _tiles(dtype, group, 64)
        out.append(CompileVariant(
            f"paged_prefill {dt[1:]} split={split}", _paged_prefill_kernel,
            {"Q_ptr": dt, "K_ptr": dt, "V_ptr": dt, "BT_ptr": "*i32", "LENS_ptr": "*i32", "QSL_ptr": "*i32",
             "TSEQ_ptr": "*i32", "TQ0_ptr": "*i32", "O_ptr": dt, "OP_ptr": "*fp32", "LSE_ptr": "*fp64",
             "scale": "fp32", "Cap_ptr": "*fp64" if acc64 else "*fp32", "Sinks_ptr": "*fp64" if acc64 else "*fp32"},
            dict(PAGE=16, SPLIT=split, ACC64=acc64, BLOCK_Q=bq, BLOCK_H=bh, BLOCK_N=bn, BLOCK_D=bd,
                 HAS_WINDOW=not split, HAS_SOFTCAP=not split, HAS_SINKS=not split), min_for_loops=1))
    return out


def smoke_calls(device: str):
    """A mixed batch (a decode token, a chunk after a cached prefix, a whole prompt; blocks of 3,
    GQA 4/2), float32, against the float64 reference over the same pages."""
    from inference_conformance.optimized.triton_shared import SmokeCall

    def run():
        from inference_conformance.conformance import tolerance
        from inference_conformance.reference.paged_attention import paged_prefill as prefill_ref

        g = torch.Generator().manual_seed(0)
        lens, qlens, bs = (9, 20, 6), (1, 7, 6), 3
        need = [-(-n // bs) for n in lens]
        perm = torch.randperm(sum(need) + 2, generator=g)
        table = torch.zeros(len(lens), max(need), dtype=torch.int32)
        used = 0
        for b, nb in enumerate(need):
            table[b, :nb] = perm[used:used + nb].to(torch.int32)
            used += nb
        kc = torch.randn(sum(need) + 2, bs, 2, 16, generator=g, dtype=torch.float64)
        vc = torch.randn(sum(need) + 2, bs, 2, 16, generator=g, dtype=torch.float64)
        q = torch.randn(sum(qlens), 4, 16, generator=g, dtype=torch.float64)
        loc = torch.tensor([0, 1, 8, 14], dtype=torch.int32)
        lens_t = torch.tensor(lens, dtype=torch.int32)
        args = [t.to(device) for t in (q, kc, vc, table, lens_t, loc)]
        out_ref = prefill_ref(*args, scale=0.25)
        args[:3] = [t.float() for t in args[:3]]
        return tolerance.check_close(paged_prefill(*args, scale=0.25), out_ref)
    return [SmokeCall("paged_prefill float32 mixed batch", run)]
