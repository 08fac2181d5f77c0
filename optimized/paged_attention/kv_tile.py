"""The key tile over a paged cache that both paged kernels share: the decode kernel
(:mod:`inference_conformance.optimized.paged_attention`) and the mixed-batch kernel
(:mod:`inference_conformance.optimized.paged_attention.prefill`). A ``tile_loop`` body
(:func:`inference_conformance.optimized.triton_shared.tile_loop`); no kernel of its own.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def paged_kv_tile(state, args, t0, CONSTS: tl.constexpr):
    """One tile of BLOCK_N token positions t0 + offs_n of a sequence in a paged cache (state
    (acc, m_i, l_i) of the online softmax of the program's BLOCK_M query rows, CONSTS = (PAGE,
    CAUSAL, WINDOWED, SOFTCAP)): look each token's block up in the table (``phys = bt_row[t //
    PAGE]``), load its K/V slot ``t % PAGE`` of the program's KV head, cap the scores to
    cap·tanh(s/cap) with SOFTCAP (claim FA-8), mask tokens at or past ``end``, with CAUSAL tokens
    past each row's last visible position ``row_lim`` (BLOCK_M,) and with WINDOWED those before
    its first, ``row_lo``, and update the online softmax. Products are broadcast multiplies and
    sums in the accumulator dtype of q (float64 or float32)."""
    acc, m_i, l_i = state
    (q, row_lim, row_lo, cap, bt_row, k_head, v_head, end, offs_n, offs_d, d_mask, scale,
     stride_btm, stride_kn, stride_ks, stride_kd, stride_vn, stride_vs, stride_vd) = args
    PAGE: tl.constexpr = CONSTS[0]
    CAUSAL: tl.constexpr = CONSTS[1]
    WINDOWED: tl.constexpr = CONSTS[2]
    SOFTCAP: tl.constexpr = CONSTS[3]
    offs_t = t0 + offs_n                                                # (BLOCK_N,) token positions
    t_mask = offs_t < end
    phys = tl.load(bt_row + (offs_t // PAGE) * stride_btm, mask=t_mask, other=0).to(tl.int64)
    slot = offs_t % PAGE
    kv_mask = t_mask[:, None] & d_mask[None, :]
    k = tl.load(k_head + phys[:, None] * stride_kn + slot[:, None] * stride_ks + offs_d[None, :] * stride_kd,
                mask=kv_mask, other=0.0).to(q.dtype)                   # (BLOCK_N, BLOCK_D)
    s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale           # (BLOCK_M, BLOCK_N)
    if SOFTCAP:        # tanh(x) = (1 − e^{−2|x|}) / (1 + e^{−2|x|}) · sign(x)
        e = tl.exp(-2.0 * tl.abs(s) / cap)
        s = tl.where(s < 0, -cap, cap) * ((1.0 - e) / (1.0 + e))
    valid = t_mask[None, :]
    if CAUSAL:
        valid = valid & (offs_t[None, :] <= row_lim[:, None])
    if WINDOWED:
        valid = valid & (offs_t[None, :] >= row_lo[:, None])
    s = tl.where(valid, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])                                     # (BLOCK_M, BLOCK_N)
    v = tl.load(v_head + phys[:, None] * stride_vn + slot[:, None] * stride_vs + offs_d[None, :] * stride_vd,
                mask=kv_mask, other=0.0).to(q.dtype)                   # (BLOCK_N, BLOCK_D)
    acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
    l_i = l_i * alpha + tl.sum(p, 1)
    m_i = m_new
    return acc, m_i, l_i


@triton.jit
def join_sinks(acc, m_i, l_i, Sinks_ptr, h, h_ok, ACC: tl.constexpr):
    """The online-softmax state (acc, m_i, l_i) of rows of query heads ``h`` (those with
    ``h_ok``) with each head's sink logit Sinks_ptr[h] joined to the denominator (it weighs no
    value; claim FA-8)."""
    sink = tl.load(Sinks_ptr + h, mask=h_ok, other=0.0).to(ACC)
    m_new = tl.maximum(m_i, sink)
    alpha = tl.exp(m_i - m_new)
    return acc * alpha[:, None], m_new, l_i * alpha + tl.exp(sink - m_new)
