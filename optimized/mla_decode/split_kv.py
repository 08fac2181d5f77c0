"""MLA decode in Triton, split-KV over the latent cache: the "triton" implementation of the
``mla_decode`` contract (claim KV-12).

Every query head reads the one latent cache (C + R values per token), so a program owns a tile of
BLOCK_H query heads of one sequence and one range of its tokens (a split): it loads each tile of
BLOCK_N tokens once for all its heads, scores them against the absorbed query [q_lat, q_rot]
(C + R values, absorbed and rotated on the host: :func:`inference_conformance.optimized.mla_decode.vectorized.absorb`),
runs the online softmax and accumulates the latents (the output stays in the latent space). A
contiguous cache (B, T_max, C + R) is walked as a paged one whose sequence b is one block of
T_max slots (table [[0], [1], ...]); a paged cache through its block table (token t in slot
t % block_size of block block_table[b, t // block_size]). Split s of sequence b covers tokens
[s·L // S, (s+1)·L // S), L = seq_lens[b]: each writes its normalised partial output and its
log-sum-exp (float64), and the split-KV merge of the attention kernels
(:func:`inference_conformance.optimized.attention.tiles.merge_splits`, Flash-Decoding: each
split weighed by exp(lse_s − max lse), FA-7) combines them; a split with no token weighs 0.

``batch_invariant=True`` (the "triton_invariant" implementation): a sequence's bits do not depend
on what is batched with it. The absorption runs row by row (:func:`absorb_per_row`: the same
B = 1 computation for every sequence), split s of sequence b covers tokens
[s·P, min((s+1)·P, L)) with P a constant
(:func:`inference_conformance.optimized.attention.batch_invariant.keys_per_split`), the launch
has enough splits for the longest sequence (a shorter one's extra splits are empty), and the
ordered merge (:func:`~inference_conformance.optimized.attention.batch_invariant.merge_in_order`)
adds each row's splits one by one in split order.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from inference_conformance.conformance.contracts.checks import check_num_splits
from inference_conformance.conformance.contracts.mla_decode import INDEX_DTYPE, validate
from inference_conformance.conformance.device import triton_interpreted
from inference_conformance.optimized.attention.batch_invariant import keys_per_split, merge_in_order
from inference_conformance.optimized.attention.tiles import MAX_SPLITS, log_sum_exp, merge_splits
from inference_conformance.optimized.mla_decode.vectorized import absorb
from inference_conformance.optimized.triton_shared import DOT_NATIVE, DOT_SUM, check_device, dot_mode, flat_grid, sm_count, tile_loop


@triton.jit
def _latent_tile(state, args, t0, CONSTS: tl.constexpr):
    """One tile of BLOCK_N tokens t0 + offs_n of the program's sequence (a ``tile_loop`` body):
    look each token's block up, load its latent (BLOCK_N, BLOCK_C) and RoPE key (BLOCK_N, BLOCK_R),
    score them against the program's BLOCK_H absorbed queries and update the online softmax
    (acc (BLOCK_H, BLOCK_C), m, l). CONSTS = (DOT_MODE,)."""
    acc, m_i, l_i = state
    (ql, qr, bt_row, cache, end, offs_n, offs_c, offs_r, c_mask, r_mask, C, block_size, scale,
     stride_btm, stride_cn, stride_cs, stride_cd) = args
    DOT_MODE: tl.constexpr = CONSTS[0]
    offs_t = t0 + offs_n                                                 # (BLOCK_N,)
    t_mask = offs_t < end
    phys = tl.load(bt_row + (offs_t // block_size) * stride_btm, mask=t_mask, other=0).to(tl.int64)
    row = cache + phys * stride_cn + (offs_t % block_size).to(tl.int64) * stride_cs
    c = tl.load(row[:, None] + offs_c[None, :] * stride_cd, mask=t_mask[:, None] & c_mask[None, :], other=0.0)
    kr = tl.load(row[:, None] + (C + offs_r)[None, :] * stride_cd, mask=t_mask[:, None] & r_mask[None, :], other=0.0)
    if DOT_MODE == 2:      # float64: broadcast products
        s = tl.sum(ql[:, None, :] * c[None, :, :], axis=2) + tl.sum(qr[:, None, :] * kr[None, :, :], axis=2)
    elif DOT_MODE == 1:    # 16-bit under the interpreter: float32 products
        s = (tl.dot(ql, tl.trans(c.to(tl.float32)), input_precision="ieee")
             + tl.dot(qr, tl.trans(kr.to(tl.float32)), input_precision="ieee"))
    elif DOT_MODE == 3:    # float32
        s = tl.dot(ql, tl.trans(c), input_precision="ieee") + tl.dot(qr, tl.trans(kr), input_precision="ieee")
    else:                  # 16-bit on GPU: the absorbed query in the cache's dtype (as FlashMLA takes it)
        s = tl.dot(ql.to(c.dtype), tl.trans(c)) + tl.dot(qr.to(kr.dtype), tl.trans(kr))
    s = tl.where(t_mask[None, :], s * scale, float("-inf"))             # (BLOCK_H, BLOCK_N)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if DOT_MODE == 2:
        pv = tl.sum(p[:, :, None] * c[None, :, :], axis=1)               # (BLOCK_H, BLOCK_C)
    elif DOT_MODE == 1:
        pv = tl.dot(p, c.to(tl.float32), input_precision="ieee")
    elif DOT_MODE == 3:
        pv = tl.dot(p, c, input_precision="ieee")
    else:
        pv = tl.dot(p.to(c.dtype), c)
    return acc * alpha[:, None] + pv, m_new, l_i


@triton.jit
def mla_split_kernel(QL_ptr, QR_ptr, CACHE_ptr, BT_ptr, LENS_ptr, OP_ptr, LSE_ptr,
                     stride_qlb, stride_qlh, stride_qlc, stride_qrb, stride_qrh, stride_qrr,
                     stride_cn, stride_cs, stride_cd, stride_btb, stride_btm,
                     stride_pbh, stride_ps, stride_pc, stride_lbh, stride_ls,
                     Hq, C, R, block_size, NUM_SPLITS, HEAD_TILES, scale, PER_SPLIT,
                     FIXED_SPLITS: tl.constexpr, DOT_MODE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr):
    """1-D grid of NUM_SPLITS · HEAD_TILES · B programs: program split + NUM_SPLITS · (head tile
    + HEAD_TILES · b). Split s covers tokens [s·L // NUM_SPLITS, (s+1)·L // NUM_SPLITS) of sequence
    b (L = LENS[b]), or with FIXED_SPLITS [s·PER_SPLIT, (s+1)·PER_SPLIT) cut at L. Writes o_s (B·Hq, 1, S, C) (normalised over the split's
    tokens; 0 for a
    split with none) and lse_s (B·Hq, 1, S) in float64 (−inf for a split with none)."""
    pid = tl.program_id(0)
    split = pid % NUM_SPLITS
    rest = pid // NUM_SPLITS
    ht = rest % HEAD_TILES
    b = (rest // HEAD_TILES).to(tl.int64)
    L = tl.load(LENS_ptr + b)
    if FIXED_SPLITS:       # the batch-invariant mode: PER_SPLIT tokens from the sequence's start
        start = tl.minimum(split * PER_SPLIT, L)
        end = tl.minimum(start + PER_SPLIT, L)
    else:
        start = (split * L) // NUM_SPLITS
        end = ((split + 1) * L) // NUM_SPLITS
    offs_h = ht * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_c = tl.arange(0, BLOCK_C)
    offs_r = tl.arange(0, BLOCK_R)
    h_mask, c_mask, r_mask = offs_h < Hq, offs_c < C, offs_r < R
    ql = tl.load(QL_ptr + b * stride_qlb + offs_h[:, None] * stride_qlh + offs_c[None, :] * stride_qlc,
                 mask=h_mask[:, None] & c_mask[None, :], other=0.0)      # (BLOCK_H, BLOCK_C)
    qr = tl.load(QR_ptr + b * stride_qrb + offs_h[:, None] * stride_qrh + offs_r[None, :] * stride_qrr,
                 mask=h_mask[:, None] & r_mask[None, :], other=0.0)      # (BLOCK_H, BLOCK_R)
    ACC: tl.constexpr = tl.float64 if DOT_MODE == 2 else tl.float32
    acc = tl.zeros([BLOCK_H, BLOCK_C], dtype=ACC)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=ACC)
    l_i = tl.zeros([BLOCK_H], dtype=ACC)
    acc, m_i, l_i = tile_loop(
        (acc, m_i, l_i),
        (ql, qr, BT_ptr + b * stride_btb, CACHE_ptr, end, tl.arange(0, BLOCK_N), offs_c, offs_r, c_mask, r_mask,
         C, block_size, scale, stride_btm, stride_cn, stride_cs, stride_cd),
        start, end, BLOCK_N, _latent_tile, (DOT_MODE,))
    o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    rows = b * Hq + offs_h
    tl.store(OP_ptr + rows[:, None] * stride_pbh + split * stride_ps + offs_c[None, :] * stride_pc,
             o.to(OP_ptr.dtype.element_ty), mask=h_mask[:, None] & c_mask[None, :])
    tl.store(LSE_ptr + rows * stride_lbh + split * stride_ls, log_sum_exp(m_i, l_i), mask=h_mask)


#: True: float16 inputs take the GPU's 16-bit path (DOT_NATIVE: the absorbed query cast to the
#: cache's dtype in registers, P cast before P·C) under the interpreter too, so that CPU tests
#: check it (the interpreter's bfloat16 tl.dot is wrong, its float16 one is not). None: the
#: dtype's mode (:func:`inference_conformance.optimized.triton_shared.dot_mode`).
NATIVE_FLOAT16_OVERRIDE: bool | None = None

#: Splits under the interpreter when none is asked for (enough to exercise the merge).
INTERPRET_SPLITS = 2
#: Fewest tokens per split that the automatic choice allows on GPU.
MIN_TOKENS_PER_SPLIT = 256


def blocks(dtype: torch.dtype, C: int, R: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_H, BLOCK_N, BLOCK_C, BLOCK_R, num_warps) for inputs of ``dtype`` and sizes C, R."""
    bc, br = max(16, triton.next_power_of_2(C)), max(16, triton.next_power_of_2(R))
    if triton_interpreted():
        return 16, (16 if bc >= 256 else 32), bc, br, 4
    if dtype == torch.float64:        # broadcast products: keep BLOCK_H · BLOCK_N · BLOCK_C small
        return 4, max(2, min(16, 4096 // bc)), bc, br, 4
    return 16, (16 if bc >= 512 else 32), bc, br, (8 if bc >= 512 else 4)


def gpu_num_splits(B: int, head_tiles: int, max_len: int, sms: int) -> int:
    """The GPU's choice: splits that bring the grid of B x ``head_tiles`` programs per split to
    about two programs per each of ``sms`` multiprocessors, each split keeping at least
    MIN_TOKENS_PER_SPLIT tokens of the longest sequence (``max_len``), at most MAX_SPLITS; >= 1.
    It follows B: what makes the default mode's bits follow the batch on a GPU."""
    return max(1, min(triton.cdiv(2 * sms, B * head_tiles), max_len // MIN_TOKENS_PER_SPLIT, MAX_SPLITS))


def default_num_splits(B: int, head_tiles: int, max_len: int, device: torch.device) -> int:
    """:func:`gpu_num_splits` at the device's multiprocessor count on CUDA; under the interpreter
    or on the CPU INTERPRET_SPLITS (at most ``max_len``)."""
    if triton_interpreted() or device.type != "cuda":
        return max(1, min(INTERPRET_SPLITS, max_len))
    return gpu_num_splits(B, head_tiles, max_len,
                          sm_count(device.index if device.index is not None else torch.cuda.current_device()))


def absorb_per_row(q_nope: torch.Tensor, q_rope: torch.Tensor, w_uk: torch.Tensor, seq_lens: torch.Tensor,
                   rope_theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~inference_conformance.optimized.mla_decode.vectorized.absorb` one sequence at a
    time, each on fresh B = 1 copies of its rows (shapes, dtypes as there): the one computation,
    at the one alignment, whatever the batch, so a row's bits never depend on B (the batched
    einsum's blocking, and so its rounding, follows B)."""
    rows = [absorb(q_nope[b:b + 1].clone(), q_rope[b:b + 1].clone(), w_uk, seq_lens[b:b + 1].clone(), rope_theta)
            for b in range(q_nope.shape[0])]
    return torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])


def mla_decode(q_nope: torch.Tensor, q_rope: torch.Tensor, w_uk: torch.Tensor, cache: torch.Tensor,
               block_table: torch.Tensor | None, seq_lens: torch.Tensor, *, scale: float, rope_theta: float,
               num_splits: int | None = None, batch_invariant: bool = False) -> torch.Tensor:
    """MLA decode, split-KV: q_nope (B, Hq, D), q_rope (B, Hq, R), w_uk (Hq, C, D), cache
    (B, T_max, C + R) or (num_blocks, block_size, C + R) with block_table (B, max_blocks) int32,
    seq_lens (B,) int32 -> (B, Hq, C) in q_nope's dtype.

    ``num_splits``: token ranges per sequence (capped at min(max seq_lens, MAX_SPLITS); a
    sequence shorter than it leaves some of its splits empty); None chooses
    (:func:`default_num_splits`). ``batch_invariant``: the absorption row by row, splits of a
    fixed size (``keys_per_split``), merged in split order (the "triton_invariant"
    implementation). Raises TypeError / ValueError as the contract's ``validate``, ValueError for
    a bad ``num_splits`` (or one given with ``batch_invariant``) or CPU tensors without the
    interpreter."""
    shape = validate(q_nope, q_rope, w_uk, cache, block_table, seq_lens, scale, rope_theta)
    check_device(q_nope, "q_nope")
    check_num_splits(num_splits, batch_invariant)
    mode = DOT_NATIVE if NATIVE_FLOAT16_OVERRIDE and q_nope.dtype == torch.float16 else dot_mode(q_nope.dtype)
    q_lat, q_rot = (absorb_per_row if batch_invariant else absorb)(q_nope, q_rope, w_uk, seq_lens, rope_theta)
    if mode == DOT_SUM:     # compiled Triton types a float argument as float32: fold the scale in float64
        q_lat, q_rot, scale = q_lat * float(scale), q_rot * float(scale), 1.0
    if block_table is None:  # sequence b is block b of T_max slots
        block_table = torch.arange(shape.B, dtype=INDEX_DTYPE, device=q_nope.device)[:, None]
    bh, bn, bc, br, warps = blocks(q_nope.dtype, shape.C, shape.R)
    head_tiles = triton.cdiv(shape.Hq, bh)
    max_len = int(seq_lens.max())
    per = keys_per_split(bn, q_nope.device) if batch_invariant else 0
    if batch_invariant:    # enough splits for the longest sequence; a shorter one's last are empty
        S = -(-max_len // per)
    else:
        if num_splits is None:
            num_splits = default_num_splits(shape.B, head_tiles, max_len, q_nope.device)
        S = min(num_splits, max_len, MAX_SPLITS)
    part_dtype = torch.float64 if mode == DOT_SUM else torch.float32
    o_part = torch.empty(shape.B * shape.Hq, 1, S, shape.C, dtype=part_dtype, device=q_nope.device)
    lse = torch.empty(shape.B * shape.Hq, 1, S, dtype=torch.float64, device=q_nope.device)
    mla_split_kernel[flat_grid(S, head_tiles, shape.B)](
        q_lat, q_rot, cache, block_table, seq_lens, o_part, lse,
        *q_lat.stride(), *q_rot.stride(), *cache.stride(), *block_table.stride(),
        o_part.stride(0), o_part.stride(2), o_part.stride(3), lse.stride(0), lse.stride(2),
        shape.Hq, shape.C, shape.R, shape.block_size, S, head_tiles, float(scale), per,
        FIXED_SPLITS=batch_invariant, DOT_MODE=mode, BLOCK_H=bh, BLOCK_N=bn, BLOCK_C=bc, BLOCK_R=br, num_warps=warps,
        num_stages=1 if mode == DOT_SUM or triton_interpreted() else 2)
    out = torch.empty(shape.B, shape.Hq, shape.C, dtype=q_nope.dtype, device=q_nope.device)
    (merge_in_order if batch_invariant else merge_splits)(o_part, lse, out[:, :, None])
    return out


def mla_decode_invariant(q_nope: torch.Tensor, q_rope: torch.Tensor, w_uk: torch.Tensor, cache: torch.Tensor,
                         block_table: torch.Tensor | None, seq_lens: torch.Tensor, *, scale: float,
                         rope_theta: float) -> torch.Tensor:
    """The "triton_invariant" implementation: :func:`mla_decode` with ``batch_invariant=True`` (a
    sequence's bits never depend on its batch); shapes, dtypes, errors as there."""
    return mla_decode(q_nope, q_rope, w_uk, cache, block_table, seq_lens, scale=scale, rope_theta=rope_theta,
                      batch_invariant=True)


def compile_variants():
    """The split kernel in bfloat16 at DeepSeek's sizes (C = 512, R = 64) and in float64."""
    from inference_conformance.optimized.triton_shared import CompileVariant

    types = {"QL_ptr": "*fp32", "QR_ptr": "*fp32", "CACHE_ptr": "*bf16", "BT_ptr": "*i32", "LENS_ptr": "*i32",
             "OP_ptr": "*fp32", "LSE_ptr": "*fp64", "scale": "fp32"}
    f64 = dict(types, QL_ptr="*fp64", QR_ptr="*fp64", CACHE_ptr="*fp64", OP_ptr="*fp64")
    return [CompileVariant("mla split bf16 C=512 R=64", mla_split_kernel, types,
                           dict(FIXED_SPLITS=False, DOT_MODE=DOT_NATIVE, BLOCK_H=16, BLOCK_N=16, BLOCK_C=512, BLOCK_R=64), min_for_loops=1),
            CompileVariant("mla split fp64", mla_split_kernel, f64,
                           dict(FIXED_SPLITS=True, DOT_MODE=DOT_SUM, BLOCK_H=4, BLOCK_N=8, BLOCK_C=64, BLOCK_R=16), min_for_loops=1)]


def smoke_calls(device: str):
    """bfloat16, paged (blocks of 5), three splits, against the float64 reference by the contract's
    16-bit rule."""
    from inference_conformance.optimized.triton_shared import SmokeCall

    def run():
        from inference_conformance.conformance import tolerance
        from inference_conformance.conformance.contracts.mla_decode import MLA_16BIT_RULE, _inputs
        from inference_conformance.reference import mla_decode as ref

        args = [None if a is None else a.to(device, torch.bfloat16) if a.is_floating_point() else a.to(device)
                for a in _inputs(torch.Generator().manual_seed(0), (70, 9), 4, 32, 48, 16, 5)]
        kw = {"scale": 48 ** -0.5, "rope_theta": 10000.0}
        out = mla_decode(*args, num_splits=3, **kw)
        return tolerance.check_close(out, ref.mla_decode(*[a if a is None or not a.is_floating_point()
                                                            else a.double() for a in args], **kw),
                                     out_pt=ref.absorbed_rounded(*args, **kw), rule=MLA_16BIT_RULE)
    return [SmokeCall("mla_decode bfloat16 paged bs=5 num_splits=3", run)]
