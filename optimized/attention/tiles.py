"""Pieces shared by the Triton attention kernels (:mod:`inference_conformance.optimized.attention.flash_attention`,
:mod:`inference_conformance.optimized.attention.flash_decoding`, :mod:`inference_conformance.optimized.paged_attention`,
:mod:`inference_conformance.optimized.paged_attention.prefill`):
the whole work of one program of the dense kernels (``attend_q_tile``: its prologue, the
online-softmax key-tile loop ``_attn_tile``, two-stage or masked, and the normalisation), the
split-KV merge kernel with its
host wrapper ``merge_splits``, and the host-side choices of tile sizes and loop shape. The
kernel modules import this one; it imports none of them. Pieces that are not about attention
(the loop over tiles, the dtype modes, the device checks) are in :mod:`inference_conformance.optimized.triton_shared`.

The tile loop (Dao et al. 2022; Dao 2023, FlashAttention-2 loop order; lecture 001 §3.2):

    s = scale · q Kᵀ,  m' = max(m, rowmax s),  p = exp(s − m'),
    acc = acc · exp(m − m') + p V,  l = l · exp(m − m') + rowsum p

The split-KV merge (Flash-Decoding, Dao, Haziza, Massa, Sizov 2023; claim FA-7): split s of a
row wrote o_s, normalised over its own keys, and lse_s = m_s + log l_s (−inf when it saw no key):

    out = sum_s w_s o_s,   w_s = exp(lse_s − max_s lse_s) / sum_s exp(lse_s − max_s lse_s)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from inference_conformance.conformance.device import triton_interpreted
from inference_conformance.optimized.triton_shared import flat_grid, tile_loop


@triton.jit
def attend_q_tile(Q_ptr, K_ptr, V_ptr, pid_m, pid_bh, start, end,
                  stride_qb, stride_qh, stride_qm, stride_qd,
                  stride_kb, stride_kh, stride_kn, stride_kd,
                  stride_vb, stride_vh, stride_vn, stride_vd,
                  Hq, Tq, Tk, D, GROUP, scale, WINDOW, Cap_ptr, Sinks_ptr,
                  CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, DOT_MODE: tl.constexpr, TWO_STAGE: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, OPTS: tl.constexpr):
    """The work of one program of the dense attention kernels: query rows [pid_m·BLOCK_M,
    (pid_m+1)·BLOCK_M) of (batch, query head) pid_bh = b·Hq + h of q (B, Hq, Tq, D) attend to
    keys [start, end) of KV head h // GROUP of k, v (B, Hkv, Tk, D).

    Loads the Q tile, streams the key tiles by the online softmax (float64 state for DOT_SUM,
    else float32) and normalises. CAUSAL: bottom-right aligned (row r sees keys <= r + Tk − Tq);
    key tiles past the tile's last visible key are skipped. TWO_STAGE: first the whole tiles
    that every row sees, without masks, then the masked rest (on GPU); without it one masked
    pass (the interpreter, where each stage costs a nested call).

    OPTS = (HAS_WINDOW, HAS_SOFTCAP, HAS_SINKS), claim FA-8: a left window of WINDOW keys (row r
    sees keys > r + Tk − Tq − WINDOW; key tiles before the tile's first visible key are never
    read; one masked pass), scores capped to c·tanh(s/c), c = Cap_ptr[0] in the accumulator's
    dtype, and the sink Sinks_ptr[h] joined to the state after the last key (split-KV: merge).

    Returns (b, h, offs_m, offs_d, io_mask, o, lse): b and h as int64, the tile's rows and head
    dims, its (BLOCK_M, BLOCK_D) in-bounds mask, o = acc / l (BLOCK_M, BLOCK_D) and lse = m + log l
    (BLOCK_M,) in float64 (:func:`log_sum_exp`); a row that saw no key gets o = 0 and lse = −inf (which the merge weighs 0)."""
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
    ACC: tl.constexpr = tl.float64 if DOT_MODE == 2 else tl.float32
    HAS_WINDOW: tl.constexpr = OPTS[0]
    HAS_SINKS: tl.constexpr = OPTS[2]
    cap = tl.load(Cap_ptr).to(ACC)                                         # 1.0 when unused
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=ACC)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=ACC)
    l_i = tl.zeros([BLOCK_M], dtype=ACC)
    offset = Tk - Tq
    row_lim = offs_m + offset                                              # last visible key per row
    row_lo = row_lim - WINDOW + 1                                          # first one, with a window
    if CAUSAL:
        hi = tl.minimum(end, (pid_m + 1) * BLOCK_M + offset)
    else:
        hi = end
    hi = tl.maximum(hi, start)
    offs_n = tl.arange(0, BLOCK_N)
    UNMASKED_STAGE: tl.constexpr = TWO_STAGE and not HAS_WINDOW
    if UNMASKED_STAGE:
        # keys [start, lo) are visible to every row of the tile and form whole tiles: no masks
        if CAUSAL:
            lo = tl.maximum(tl.minimum(pid_m * BLOCK_M + offset + 1, hi), start)
        else:
            lo = hi
        lo = start + ((lo - start) // BLOCK_N) * BLOCK_N
        acc, m_i, l_i, _, _ = tile_loop(
            (acc, m_i, l_i, k_base + (start + offs_n)[:, None] * stride_kn + offs_d[None, :] * stride_kd,
             v_base + (start + offs_n)[:, None] * stride_vn + offs_d[None, :] * stride_vd),
            (q, offs_n, offs_d, row_lim, row_lo, cap, lo, D, scale, stride_kn, stride_vn), start, lo,
            BLOCK_N, _attn_tile, (False, CAUSAL, EVEN_D, DOT_MODE, BLOCK_N, False, OPTS[1]))
    elif HAS_WINDOW:   # the window's first key tile: its first row's first key, rounded down to a tile
        lo = tl.maximum(start, tl.minimum(pid_m * BLOCK_M + offset - WINDOW + 1, hi))
        lo = start + ((lo - start) // BLOCK_N) * BLOCK_N
    else:
        lo = start
    acc, m_i, l_i, _, _ = tile_loop(
        (acc, m_i, l_i, k_base + (lo + offs_n)[:, None] * stride_kn + offs_d[None, :] * stride_kd,
         v_base + (lo + offs_n)[:, None] * stride_vn + offs_d[None, :] * stride_vd),
        (q, offs_n, offs_d, row_lim, row_lo, cap, hi, D, scale, stride_kn, stride_vn), lo, hi,
        BLOCK_N, _attn_tile, (True, CAUSAL, EVEN_D, DOT_MODE, BLOCK_N, HAS_WINDOW, OPTS[1]))
    if HAS_SINKS:      # one more logit in the denominator, weighing no value
        sink = tl.load(Sinks_ptr + h).to(ACC)
        m_new = tl.maximum(m_i, sink)
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.exp(sink - m_new)
        acc = acc * alpha[:, None]
        m_i = m_new
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_safe[:, None]
    return b, h, offs_m, offs_d, io_mask, o, log_sum_exp(m_i, l_i)


@triton.jit
def log_sum_exp(m_i, l_i):
    """lse = m + log l of an online-softmax state, in float64 (−inf where l = 0: no key). In
    float32 the sum would round at m's size: at logits of ~1,600 its ulp is 1.2e-4, and the
    merge's weights exp(lse_s − max lse) would carry that error, 10x the float32 rule."""
    l64 = l_i.to(tl.float64)
    return tl.where(l64 == 0.0, float("-inf"), m_i.to(tl.float64) + tl.log(tl.where(l64 == 0.0, 1.0, l64)))


@triton.jit
def _attn_tile(state, args, start_n, CONSTS: tl.constexpr):
    """One key tile of :func:`attend_q_tile` (a ``tile_loop`` body): keys start_n + offs_n at the
    state's k_ptrs / v_ptrs, which it advances by one tile. CONSTS = (MASKED, CAUSAL, EVEN_D,
    DOT_MODE, BLOCK_N, WINDOWED, SOFTCAP). MASKED: apply the bounds (col < end), with CAUSAL the
    causal mask (col <= row_lim) and with WINDOWED the window (col >= row_lo); unmasked calls
    must cover whole visible tiles only. SOFTCAP: s = cap·tanh(s/cap), before the masks."""
    acc, m_i, l_i, k_ptrs, v_ptrs = state
    q, offs_n, offs_d, row_lim, row_lo, cap, end, D, scale, stride_kn, stride_vn = args
    MASKED: tl.constexpr = CONSTS[0]
    CAUSAL: tl.constexpr = CONSTS[1]
    EVEN_D: tl.constexpr = CONSTS[2]
    DOT_MODE: tl.constexpr = CONSTS[3]
    BLOCK_N: tl.constexpr = CONSTS[4]
    WINDOWED: tl.constexpr = CONSTS[5]
    SOFTCAP: tl.constexpr = CONSTS[6]
    if MASKED:
        cols = start_n + offs_n                                        # (BLOCK_N,)
        kv_mask = (cols[:, None] < end) & (offs_d[None, :] < D)
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0)                   # (BLOCK_N, BLOCK_D)
        v = tl.load(v_ptrs, mask=kv_mask, other=0.0)
    elif EVEN_D:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    else:
        k = tl.load(k_ptrs, mask=offs_d[None, :] < D, other=0.0)
        v = tl.load(v_ptrs, mask=offs_d[None, :] < D, other=0.0)
    # (tile products inline: under the interpreter every nested jit call is costly)
    if DOT_MODE == 2:
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)              # (BLOCK_M, BLOCK_N)
    elif DOT_MODE == 1:
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    elif DOT_MODE == 3:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = s * scale
    if SOFTCAP:        # tanh(x) = (1 − e^{−2|x|}) / (1 + e^{−2|x|}) · sign(x): no overflow, any Triton
        e = tl.exp(-2.0 * tl.abs(s) / cap)
        s = tl.where(s < 0, -cap, cap) * ((1.0 - e) / (1.0 + e))
    if MASKED:
        valid = cols[None, :] < end
        if CAUSAL:
            valid = valid & (cols[None, :] <= row_lim[:, None])
        if WINDOWED:
            valid = valid & (cols[None, :] >= row_lo[:, None])
        s = tl.where(valid, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))                              # (BLOCK_M,)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)              # rows with no key yet
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])                                    # (BLOCK_M, BLOCK_N)
    l_i = l_i * alpha + tl.sum(p, 1)
    if DOT_MODE == 2:
        pv = tl.sum(p[:, :, None] * v[None, :, :], axis=1)            # (BLOCK_M, BLOCK_D)
    elif DOT_MODE == 1:
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    elif DOT_MODE == 3:
        pv = tl.dot(p, v, input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    acc = acc * alpha[:, None] + pv
    m_i = m_new
    k_ptrs += BLOCK_N * stride_kn
    v_ptrs += BLOCK_N * stride_vn
    return acc, m_i, l_i, k_ptrs, v_ptrs


@triton.jit
def split_kv_merge_kernel(OP_ptr, LSE_ptr, O_ptr,
                          stride_pbh, stride_pm, stride_ps, stride_pd,
                          stride_lbh, stride_lm, stride_ls,
                          stride_ob, stride_oh, stride_om, stride_od,
                          Hq, Tq, D, NUM_SPLITS, ROWS, Sinks_ptr,
                          BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
                          HAS_SINKS: tl.constexpr):
    """1-D grid of cdiv(ROWS, BLOCK_M) programs over the ROWS = B·Hq·Tq output rows (row
    r = (b·Hq + h)·Tq + m; a tile may span heads, so a decode merge with Tq = 1 fills its tiles and
    no count reaches CUDA's axes 1 and 2, which stop at 65,535): out = sum_s softmax_s(lse) o_s,
    exactly, from o_s (B·Hq, Tq, S, D) and lse_s (B·Hq, Tq, S) into out (B, Hq, Tq, D). A split
    with lse = -inf (no key) weighs 0; a row whose splits all saw no key gets 0, never NaN.
    HAS_SINKS: the sink logit Sinks_ptr[h] joins the weights' denominator once (claim FA-8):
    out = sum_s exp(lse_s) o_s / (exp(sink) + sum_s exp(lse_s))."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    row_ok = rows < ROWS
    bh = rows // Tq
    m = rows % Tq
    b = bh // Hq
    h = bh % Hq
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    ls_mask = row_ok[:, None] & (offs_s[None, :] < NUM_SPLITS)
    lse = tl.load(LSE_ptr + (bh * stride_lbh + m * stride_lm)[:, None] + offs_s[None, :] * stride_ls,
                  mask=ls_mask, other=float("-inf"))                       # (BLOCK_M, BLOCK_S)
    lse = lse.to(tl.float64)                                               # (float32 callers too)
    mx = tl.max(lse, 1)
    if HAS_SINKS:
        sink = tl.load(Sinks_ptr + h, mask=row_ok, other=0.0).to(tl.float64)  # (BLOCK_M,)
        mx = tl.maximum(mx, sink)
    mx = tl.where(mx == float("-inf"), 0.0, mx)                            # every split empty
    w = tl.exp(lse - mx[:, None])
    w_sum = tl.sum(w, 1)
    if HAS_SINKS:
        w_sum = w_sum + tl.exp(sink - mx)
    w = (w / tl.where(w_sum == 0.0, 1.0, w_sum)[:, None]).to(OP_ptr.dtype.element_ty)  # (and rows past ROWS)
    o_mask = ls_mask[:, :, None] & (offs_d[None, None, :] < D)
    o = tl.load(OP_ptr + (bh * stride_pbh + m * stride_pm)[:, None, None]
                + offs_s[None, :, None] * stride_ps + offs_d[None, None, :] * stride_pd,
                mask=o_mask, other=0.0)                                    # (BLOCK_M, BLOCK_S, BLOCK_D)
    out = tl.sum(w[:, :, None] * o, axis=1)                                # (BLOCK_M, BLOCK_D)
    tl.store(O_ptr + (b * stride_ob + h * stride_oh + m * stride_om)[:, None] + offs_d[None, :] * stride_od,
             out.to(O_ptr.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < D))


# ----------------------------------------------------------------------------------------------
# host side
# ----------------------------------------------------------------------------------------------

#: Most splits a split-KV call makes (a larger ``num_splits`` is capped here): the merge holds
#: all splits of a row in one (BLOCK_M, BLOCK_S, BLOCK_D) tile, which a compiled kernel must keep
#: within Triton's 2^20 elements and the registers (at 128 splits and D = 256: 2 x 128 x 256).
MAX_SPLITS = 128

#: Block sizes under the interpreter (each program instance costs ~10 ms there, each key tile ~3 ms).
INTERPRET_BLOCK_M = 16
INTERPRET_BLOCK_N = 32


#: Force (True/False) the two-stage tile loop (unmasked whole tiles, then the masked rest); None:
#: two stages on GPU, one masked stage under the interpreter. Tests set it to check the GPU path.
TWO_STAGE_OVERRIDE: bool | None = None


def two_stage() -> bool:
    """Whether kernels stream whole visible tiles without masks first (see TWO_STAGE_OVERRIDE)."""
    return (not triton_interpreted()) if TWO_STAGE_OVERRIDE is None else TWO_STAGE_OVERRIDE


def block_d(D: int) -> int:
    """Head dim padded to a power of two, at least 16 (tl.dot's minimum)."""
    return max(16, triton.next_power_of_2(D))


def float64_blocks(D: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) of the float64 path: its 3-D product tile is BLOCK_M·BLOCK_N·BLOCK_D."""
    if triton_interpreted():
        return INTERPRET_BLOCK_M, INTERPRET_BLOCK_N
    n = max(4, min(16, 2048 // block_d(D)))
    return n, n


def fixed_blocks(dtype: torch.dtype, D: int, Tq: int | None = None) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) used without autotuning, sized for registers and shared memory."""
    if dtype == torch.float64:
        return float64_blocks(D)
    if triton_interpreted():
        return INTERPRET_BLOCK_M, INTERPRET_BLOCK_N
    bd = block_d(D)
    if dtype == torch.float32:
        bm, bn = (64, 32) if bd <= 64 else (32, 32)
    else:
        bm, bn = (64, 64) if bd <= 128 else (32, 32)
    if Tq is not None and Tq <= 16:
        bm = 16
    return bm, bn


def fold_scale(q: torch.Tensor, scale: float) -> tuple[torch.Tensor, float]:
    """(q, scale) to hand the kernels. Compiled Triton types a Python float argument as float32,
    so for float64 inputs the scale is folded into q on the host, in float64 (q · scale, then a
    kernel scale of exactly 1.0); other dtypes compute their scores in float32 anyway and keep
    ``float(scale)``."""
    if q.dtype == torch.float64:
        return q * float(scale), 1.0
    return q, float(scale)


def merge_splits(o_part: torch.Tensor, lse: torch.Tensor, out: torch.Tensor,
                 sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The split-KV merge (claim FA-7) of :func:`split_kv_merge_kernel`, in place into ``out``.

    o_part (B·Hq, Tq, S, D) float32 or float64 and lse (B·Hq, Tq, S), float64 (the kernels write
    it so: :func:`log_sum_exp`) or float32 (the weights are computed in float64 either way);
    lse = -inf marks a split that saw no key: it weighs 0; a row with every split empty gets 0;
    out (B, Hq, Tq, D), any
    floating dtype (strided views welcome: decode callers pass (B, Hq, 1, D) views of
    (B, Hq, D)); ``sinks`` (Hq,) float: each head's sink logit joins the denominator once (FA-8).
    Returns ``out``. ValueError when the shapes disagree."""
    B, Hq, Tq, D = out.shape
    if tuple(o_part.shape[:2]) != (B * Hq, Tq) or o_part.shape[3] != D or tuple(lse.shape) != tuple(o_part.shape[:3]):
        raise ValueError(f"merge_splits: o_part {tuple(o_part.shape)} and lse {tuple(lse.shape)} do not fit "
                         f"out {tuple(out.shape)} (expected (B·Hq, Tq, S, D) and (B·Hq, Tq, S))")
    S = o_part.shape[2]
    BLOCK_S = triton.next_power_of_2(S)
    BLOCK_D = block_d(D)
    rows = B * Hq * Tq
    if triton_interpreted():
        bm = min(16, triton.next_power_of_2(rows))
    else:
        bm = max(2, min(16, triton.next_power_of_2(rows), 8192 // (BLOCK_S * BLOCK_D)))
        bm = 1 << (bm.bit_length() - 1)  # a power of two
    split_kv_merge_kernel[flat_grid(triton.cdiv(rows, bm))](
        o_part, lse, out, *o_part.stride(), *lse.stride(), *out.stride(),
        Hq, Tq, D, S, rows, lse if sinks is None else sinks, BLOCK_M=bm, BLOCK_S=BLOCK_S, BLOCK_D=BLOCK_D,
        HAS_SINKS=sinks is not None)
    return out


def compile_variants():
    """The merge at 16 rows a tile and at 2 (many splits of a wide head: the wrapper keeps
    BLOCK_M · BLOCK_S · BLOCK_D within 8192)."""
    from inference_conformance.optimized.triton_shared import CompileVariant

    types = {"OP_ptr": "*fp32", "LSE_ptr": "*fp64", "O_ptr": "*fp16"}
    return [CompileVariant("merge fp32", split_kv_merge_kernel, types, dict(BLOCK_M=16, BLOCK_S=8, BLOCK_D=64, HAS_SINKS=False)),
            CompileVariant("merge fp32 BLOCK_M=2 sinks", split_kv_merge_kernel, {**types, "Sinks_ptr": "*fp32"},
                           dict(BLOCK_M=2, BLOCK_S=8, BLOCK_D=64, HAS_SINKS=True))]


def smoke_calls(device: str):
    """The merge of three float32 splits, one of them empty (lse = -inf), against the exact
    float64 softmax-weighted sum."""
    from inference_conformance.optimized.triton_shared import SmokeCall

    def run():
        from inference_conformance.conformance import tolerance

        g = torch.Generator().manual_seed(0)
        o_part = torch.randn(2, 3, 3, 40, generator=g, dtype=torch.float64)
        lse = torch.randn(2, 3, 3, generator=g, dtype=torch.float64)
        lse[:, :, 2], o_part[:, :, 2] = float("-inf"), 0.0
        want = (torch.softmax(lse, dim=-1)[..., None] * o_part).sum(dim=2).reshape(1, 2, 3, 40)
        out = torch.empty(1, 2, 3, 40, dtype=torch.float32, device=device)
        merge_splits(o_part.to(device, torch.float32), lse.to(device, torch.float32), out)
        return tolerance.check_close(out, want)
    return [SmokeCall("split_kv_merge float32 S=3 one empty split", run)]
