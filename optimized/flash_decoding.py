"""Split-KV attention (Flash-Decoding) in Triton: the "triton_splitkv" implementation of the
attention contract.

At decode time Tq is 1 (or a few draft tokens) and the KV cache is long: the FlashAttention grid
(query tiles × heads) then has only B·Hq programs, too few to fill the GPU. Flash-Decoding
(Dao, Haziza, Massa, Sizov 2023) also splits the keys into ``num_splits`` ranges: each program
streams one range and writes a partial output o_s, normalised over its own keys, and the
log-sum-exp lse_s = m_s + log l_s of its scores; a second kernel merges the partials exactly:

    out = sum_s w_s o_s,   w_s = exp(lse_s − max_s lse_s) / sum_s exp(lse_s − max_s lse_s)

(claim FA-7; lecture 001 §3.4). Any Tq, causal or not, GQA, D 1..256 are supported: the split
kernel shares the tile loop of :mod:`optimized.attention_tiles` with FlashAttention.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from conformance.contracts.attention import validate
from conformance.device import triton_interpreted
from optimized.attention_tiles import (DOT_SUM, attn_tiles, block_d, check_device, dot_mode, fixed_blocks, fold_scale,
                                       two_stage)


@triton.jit
def _split_kv_kernel(
        Q_ptr, K_ptr, V_ptr, OP_ptr, LSE_ptr,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_pbh, stride_pm, stride_ps, stride_pd,
        stride_lbh, stride_lm, stride_ls,
        Hq, Tq, Tk, D, GROUP, NUM_SPLITS, scale,
        CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, DOT_MODE: tl.constexpr, TWO_STAGE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Grid (cdiv(Tq, BLOCK_M), B * Hq, NUM_SPLITS). Split s covers keys
    [s·Tk // NUM_SPLITS, (s+1)·Tk // NUM_SPLITS). Writes o_s (B·Hq, Tq, S, D) and lse_s
    (B·Hq, Tq, S); a split with no visible key for a row writes o = 0, lse = -inf."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    split = tl.program_id(2)
    b = (pid_bh // Hq).to(tl.int64)
    h = pid_bh % Hq
    kvh = (h // GROUP).to(tl.int64)
    h = h.to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)                       # (BLOCK_M,)
    offs_d = tl.arange(0, BLOCK_D)
    q_ptrs = Q_ptr + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
    io_mask = (offs_m[:, None] < Tq) & (offs_d[None, :] < D)
    q = tl.load(q_ptrs, mask=io_mask, other=0.0)                           # (BLOCK_M, BLOCK_D)
    k_base = K_ptr + b * stride_kb + kvh * stride_kh
    v_base = V_ptr + b * stride_vb + kvh * stride_vh
    if DOT_MODE == 2:
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float64)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float64)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float64)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    start = (split * Tk) // NUM_SPLITS
    end = ((split + 1) * Tk) // NUM_SPLITS
    offset = Tk - Tq
    row_lim = offs_m + offset
    if CAUSAL:
        hi = tl.minimum(end, (pid_m + 1) * BLOCK_M + offset)
    else:
        hi = end
    hi = tl.maximum(hi, start)
    if TWO_STAGE:
        if CAUSAL:
            lo = tl.maximum(tl.minimum(pid_m * BLOCK_M + offset + 1, hi), start)
        else:
            lo = hi
        lo = start + ((lo - start) // BLOCK_N) * BLOCK_N
        acc, m_i, l_i = attn_tiles(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_kd,
                                    stride_vn, stride_vd, row_lim, start, lo, D, scale,
                                    False, CAUSAL, EVEN_D, BLOCK_N, BLOCK_D, DOT_MODE)
    else:
        lo = start
    acc, m_i, l_i = attn_tiles(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn,
                                stride_vd, row_lim, lo, hi, D, scale,
                                True, CAUSAL, EVEN_D, BLOCK_N, BLOCK_D, DOT_MODE)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_safe[:, None]
    lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log(l_safe))
    op_ptrs = OP_ptr + pid_bh * stride_pbh + offs_m[:, None] * stride_pm + split * stride_ps + offs_d[None, :] * stride_pd
    tl.store(op_ptrs, o.to(OP_ptr.dtype.element_ty), mask=io_mask)
    tl.store(LSE_ptr + pid_bh * stride_lbh + offs_m * stride_lm + split * stride_ls,
             lse.to(LSE_ptr.dtype.element_ty), mask=offs_m < Tq)


@triton.jit
def _merge_kernel(OP_ptr, LSE_ptr, O_ptr,
                  stride_pbh, stride_pm, stride_ps, stride_pd,
                  stride_lbh, stride_lm, stride_ls,
                  stride_ob, stride_oh, stride_om, stride_od,
                  Hq, Tq, D, NUM_SPLITS,
                  BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """Grid (cdiv(Tq, BLOCK_M), B * Hq): out = sum_s softmax_s(lse) o_s, exactly."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // Hq).to(tl.int64)
    h = (pid_bh % Hq).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    ls_mask = (offs_m[:, None] < Tq) & (offs_s[None, :] < NUM_SPLITS)
    lse = tl.load(LSE_ptr + pid_bh * stride_lbh + offs_m[:, None] * stride_lm + offs_s[None, :] * stride_ls,
                  mask=ls_mask, other=float("-inf"))                       # (BLOCK_M, BLOCK_S)
    mx = tl.max(lse, 1)
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    w = tl.exp(lse - mx[:, None])
    w_sum = tl.sum(w, 1)
    w = w / tl.where(w_sum == 0.0, 1.0, w_sum)[:, None]                   # rows past Tq: all -inf
    o_mask = ls_mask[:, :, None] & (offs_d[None, None, :] < D)
    o = tl.load(OP_ptr + pid_bh * stride_pbh + offs_m[:, None, None] * stride_pm
                + offs_s[None, :, None] * stride_ps + offs_d[None, None, :] * stride_pd,
                mask=o_mask, other=0.0)                                    # (BLOCK_M, BLOCK_S, BLOCK_D)
    out = tl.sum(w[:, :, None] * o, axis=1)                                # (BLOCK_M, BLOCK_D)
    tl.store(O_ptr + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
             out.to(O_ptr.dtype.element_ty), mask=(offs_m[:, None] < Tq) & (offs_d[None, :] < D))


#: Default number of splits under the interpreter (enough to exercise the merge, few programs).
INTERPRET_SPLITS = 2
#: Fewest keys per split that the automatic choice allows on GPU.
MIN_KEYS_PER_SPLIT = 256


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    """Streaming multiprocessors of CUDA device ``index`` (read once, at the first decode call)."""
    return torch.cuda.get_device_properties(index).multi_processor_count


def default_num_splits(B: int, Hq: int, Tq: int, Tk: int, block_m: int, device: torch.device) -> int:
    """Splits that bring the grid to about two programs per streaming multiprocessor, each split
    keeping at least MIN_KEYS_PER_SPLIT keys (under the interpreter: INTERPRET_SPLITS)."""
    if triton_interpreted() or device.type != "cuda":
        return max(1, min(INTERPRET_SPLITS, Tk))
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    programs = triton.cdiv(Tq, block_m) * B * Hq
    want = triton.cdiv(2 * sms, programs)
    return max(1, min(want, Tk // MIN_KEYS_PER_SPLIT, 128))


def _blocks(dtype: torch.dtype, D: int, Tq: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) of the split kernel."""
    bm, bn = fixed_blocks(dtype, D, Tq)
    return bm, bn, 4, (1 if dtype == torch.float64 or triton_interpreted() else 2)


def flash_decoding(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float,
                   num_splits: int | None = None) -> torch.Tensor:
    """Split-KV attention: q (B, Hq, Tq, D); k, v (B, Hkv, Tk, D) -> (B, Hq, Tq, D) in q's dtype.

    ``num_splits``: number of key ranges (1..Tk; larger values are capped at Tk); None chooses
    from the grid size (:func:`default_num_splits`). Raises TypeError / ValueError as the
    contract's ``validate`` does, ValueError for a bad ``num_splits`` or CPU tensors without
    the interpreter.
    """
    shape = validate(q, k, v, causal, scale)
    check_device(q)
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int)
                                   or num_splits < 1):
        raise ValueError(f"num_splits must be an int >= 1 or None, got {num_splits!r}")
    mode = dot_mode(q.dtype)
    q, scale = fold_scale(q, scale)
    BLOCK_D = block_d(shape.D)
    bm, bn, warps, stages = _blocks(q.dtype, shape.D, shape.Tq)
    if num_splits is None:
        num_splits = default_num_splits(shape.B, shape.Hq, shape.Tq, shape.Tk, bm, q.device)
    S = min(num_splits, shape.Tk)
    part_dtype = torch.float64 if mode == DOT_SUM else torch.float32
    o_part = torch.empty(shape.B * shape.Hq, shape.Tq, S, shape.D, dtype=part_dtype, device=q.device)
    lse = torch.empty(shape.B * shape.Hq, shape.Tq, S, dtype=part_dtype, device=q.device)
    grid = (triton.cdiv(shape.Tq, bm), shape.B * shape.Hq, S)
    _split_kv_kernel[grid](
        q, k, v, o_part, lse, *q.stride(), *k.stride(), *v.stride(), *o_part.stride(), *lse.stride(),
        shape.Hq, shape.Tq, shape.Tk, shape.D, shape.group, S, float(scale),
        CAUSAL=causal, EVEN_D=BLOCK_D == shape.D, DOT_MODE=mode, TWO_STAGE=two_stage(),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=BLOCK_D, num_warps=warps, num_stages=stages)
    out = torch.empty(shape.B, shape.Hq, shape.Tq, shape.D, dtype=q.dtype, device=q.device)
    BLOCK_S = triton.next_power_of_2(S)
    if triton_interpreted():
        mbm = 16
    else:
        mbm = max(2, min(16, triton.next_power_of_2(shape.Tq), 8192 // (BLOCK_S * BLOCK_D)))
        mbm = 1 << (mbm.bit_length() - 1)  # a power of two
    _merge_kernel[(triton.cdiv(shape.Tq, mbm), shape.B * shape.Hq)](
        o_part, lse, out, *o_part.stride(), *lse.stride(), *out.stride(),
        shape.Hq, shape.Tq, shape.D, S, BLOCK_M=mbm, BLOCK_S=BLOCK_S, BLOCK_D=BLOCK_D)
    return out


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float,
              num_splits: int | None = None) -> torch.Tensor:
    """The "triton_splitkv" implementation of the attention contract: always the split-KV path
    (:func:`flash_decoding`), whatever the shape; ``num_splits`` as there."""
    return flash_decoding(q, k, v, causal=causal, scale=scale, num_splits=num_splits)
