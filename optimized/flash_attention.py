"""FlashAttention forward pass in Triton (the "triton" implementation of the attention contract).

One program owns a tile of BLOCK_M query rows of one (batch, query head): the Q tile stays on
chip while K and V stream past in tiles of BLOCK_N keys, and an online softmax keeps, per row,
the running maximum m, the running sum l and the unnormalised output acc (Dao et al. 2022,
Dao 2023 "FlashAttention-2" loop order; lecture 001 §3.2):

    s = scale · q Kᵀ,  m' = max(m, rowmax s),  p = exp(s − m'),
    acc = acc · exp(m − m') + p V,  l = l · exp(m − m') + rowsum p,   out = acc / l

Neither the (Tq, Tk) scores nor the probabilities ever reach global memory (claims FA-3, FA-6).
Grouped-query attention reads KV head h // (Hq // Hkv) directly, without repeating K/V. Any
lengths and head dims 1..256 (D is padded to the power of two BLOCK_D inside the kernel and
masked); causal masks are bottom-right aligned. Accumulation is float32 for 16-bit and float32
inputs, float64 for float64 inputs (float64 uses sums of products instead of ``tl.dot``).

Small Tq with a long Tk is dispatched to the split-KV kernel of :mod:`optimized.flash_decoding`.
"""
from __future__ import annotations

import functools
import re
import warnings

import numpy

import torch
import triton
import triton.language as tl

from conformance.contracts.attention import validate
from conformance.device import triton_interpreted

# DOT_MODE values (a constexpr of the kernels)
DOT_NATIVE = 0   # 16-bit on GPU: tl.dot on the input dtype, float32 accumulation, P cast to it
DOT_UPCAST = 1   # 16-bit under the interpreter: cast tiles to float32 first (its bf16 tl.dot is wrong)
DOT_SUM = 2      # float64: broadcast multiply and tl.sum (no reliance on a float64 tl.dot)
DOT_IEEE = 3     # float32: tl.dot with input_precision="ieee" (TF32 would cost ~1e-3 relative)


def _range_takes_runtime_bounds() -> bool:
    """Whether ``range(start, end, step)`` in a kernel may have run-time (non-constexpr) bounds.

    Always true for compiled kernels. Triton < 3.7's interpreter holds every scalar as a
    1-element numpy array and turns a loop bound into ``int(array)``, which numpy >= 2.4 refuses
    ("only 0-dimensional arrays can be converted to Python scalars"); there a ``while`` loop
    walks the tiles instead (``bool(array)`` still works). Decided when the kernels are defined,
    like the interpreter itself (``TRITON_INTERPRET`` is read by ``triton.jit``)."""
    if not triton_interpreted():
        return True
    if tuple(int(x) for x in re.findall(r"\d+", triton.__version__)[:2]) >= (3, 7):
        return True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            int(numpy.ones(1))
        except TypeError:
            return False
    return True


#: True: _attn_tiles walks its key tiles with ``for ... in range`` (compiled code, where the loop
#: is software-pipelined, and interpreters that allow it); False: with ``while`` (see above).
RANGE_LOOP = tl.constexpr(_range_takes_runtime_bounds())


@triton.jit
def _attn_tiles(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                row_lim, start, end, D, scale,
                MASKED: tl.constexpr, CAUSAL: tl.constexpr, EVEN_D: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_MODE: tl.constexpr):
    """Stream key tiles [start, end) past one Q tile, updating (acc, m_i, l_i) by the online
    softmax. MASKED: apply the bounds (col < end) and, with CAUSAL, the bottom-right causal
    mask (col <= row_lim = row + Tk - Tq); unmasked calls must cover whole visible tiles only."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k_ptrs = k_base + (start + offs_n)[:, None] * stride_kn + offs_d[None, :] * stride_kd
    v_ptrs = v_base + (start + offs_n)[:, None] * stride_vn + offs_d[None, :] * stride_vd
    if RANGE_LOOP:
        for start_n in range(start, end, BLOCK_N):
            acc, m_i, l_i = _attn_tile(acc, m_i, l_i, q, k_ptrs, v_ptrs, offs_n, offs_d, row_lim,
                                       start_n, end, D, scale, MASKED, CAUSAL, EVEN_D, DOT_MODE)
            k_ptrs += BLOCK_N * stride_kn
            v_ptrs += BLOCK_N * stride_vn
    else:
        start_n = start
        while start_n < end:
            acc, m_i, l_i = _attn_tile(acc, m_i, l_i, q, k_ptrs, v_ptrs, offs_n, offs_d, row_lim,
                                       start_n, end, D, scale, MASKED, CAUSAL, EVEN_D, DOT_MODE)
            k_ptrs += BLOCK_N * stride_kn
            v_ptrs += BLOCK_N * stride_vn
            start_n += BLOCK_N
    return acc, m_i, l_i


@triton.jit
def _attn_tile(acc, m_i, l_i, q, k_ptrs, v_ptrs, offs_n, offs_d, row_lim, start_n, end, D, scale,
               MASKED: tl.constexpr, CAUSAL: tl.constexpr, EVEN_D: tl.constexpr,
               DOT_MODE: tl.constexpr):
    """One key tile of :func:`_attn_tiles`: keys start_n + offs_n at k_ptrs / v_ptrs."""
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
    if MASKED:
        valid = cols[None, :] < end
        if CAUSAL:
            valid = valid & (cols[None, :] <= row_lim[:, None])
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
    return acc, m_i, l_i


@triton.jit
def _flash_attn_fwd_kernel(
        Q_ptr, K_ptr, V_ptr, O_ptr,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_ob, stride_oh, stride_om, stride_od,
        Hq, Tq, Tk, D, GROUP, scale, LEN_BUCKET,
        CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, DOT_MODE: tl.constexpr, TWO_STAGE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Grid (cdiv(Tq, BLOCK_M), B * Hq). LEN_BUCKET only keys the autotuner's cache.
    TWO_STAGE: first stream the whole visible tiles without masks, then the masked rest (on
    GPU); without it one masked pass (the interpreter, where each stage costs a nested call)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
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
    offset = Tk - Tq
    row_lim = offs_m + offset                                              # last visible key per row
    if CAUSAL:
        hi = tl.minimum(Tk, (pid_m + 1) * BLOCK_M + offset)
    else:
        hi = Tk
    if TWO_STAGE:
        # keys [0, lo) are visible to every row of the tile and form whole tiles: no masks there
        if CAUSAL:
            lo = tl.maximum(tl.minimum(pid_m * BLOCK_M + offset + 1, hi), 0)
        else:
            lo = hi
        lo = (lo // BLOCK_N) * BLOCK_N
        acc, m_i, l_i = _attn_tiles(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_kd,
                                    stride_vn, stride_vd, row_lim, 0, lo, D, scale,
                                    False, CAUSAL, EVEN_D, BLOCK_N, BLOCK_D, DOT_MODE)
    else:
        lo = 0
    acc, m_i, l_i = _attn_tiles(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn,
                                stride_vd, row_lim, lo, hi, D, scale,
                                True, CAUSAL, EVEN_D, BLOCK_N, BLOCK_D, DOT_MODE)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    o_ptrs = O_ptr + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    tl.store(o_ptrs, out.to(O_ptr.dtype.element_ty), mask=io_mask)


# ----------------------------------------------------------------------------------------------
# host side
# ----------------------------------------------------------------------------------------------

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


def dot_mode(dtype: torch.dtype) -> int:
    """How the kernels multiply tiles of ``dtype`` (see DOT_* above); decided per call."""
    if dtype == torch.float64:
        return DOT_SUM
    if dtype == torch.float32:
        return DOT_IEEE
    return DOT_UPCAST if triton_interpreted() else DOT_NATIVE


def float64_blocks(D: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) of the float64 path: its 3-D product tile is BLOCK_M·BLOCK_N·BLOCK_D."""
    if triton_interpreted():
        return INTERPRET_BLOCK_M, INTERPRET_BLOCK_N
    n = max(4, min(16, 2048 // block_d(D)))
    return n, n


#: Below this max(Tq, Tk) CUDA calls use fixed_blocks instead of autotuning (every autotuned
#: shape class compiles every config: fine for benchmarks, slow for property tests).
AUTOTUNE_MIN_LEN = 1024


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


def check_device(q: torch.Tensor) -> None:
    """The kernels need CUDA tensors, or CPU tensors under the interpreter (TRITON_INTERPRET=1)."""
    if q.device.type != "cuda" and not triton_interpreted():
        raise ValueError(f"q is on {q.device}; the Triton kernels need CUDA tensors "
                         "(or TRITON_INTERPRET=1 for CPU tensors)")


def _cuda_configs():
    cfgs = []
    for bm, bn, warps, stages in ((128, 64, 8, 3), (128, 64, 4, 3), (128, 32, 4, 3), (64, 64, 4, 3),
                                  (64, 64, 4, 2), (128, 128, 8, 2), (64, 32, 4, 2), (32, 32, 4, 1),
                                  (16, 16, 4, 1)):
        cfgs.append(triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=stages))
    return cfgs


def _prune(configs, named_args, **kwargs):
    """Drop configs whose tiles are far larger than the problem, and big tiles at large D."""
    Tq = named_args["Tq"]
    bd = kwargs.get("BLOCK_D", 128)
    keep = [c for c in configs if c.kwargs["BLOCK_M"] <= max(16, triton.next_power_of_2(Tq))
            and c.kwargs["BLOCK_M"] * bd <= 128 * 128 and c.kwargs["BLOCK_N"] * bd <= 128 * 128]
    return keep or [configs[-1]]


@functools.lru_cache(maxsize=None)
def _autotuned_kernel():
    """The autotuned kernel, built at the first CUDA call (never at import time)."""
    return triton.autotune(configs=_cuda_configs(),
                           key=["LEN_BUCKET", "CAUSAL", "EVEN_D", "DOT_MODE", "TWO_STAGE", "BLOCK_D"],
                           prune_configs_by={"early_config_prune": _prune})(_flash_attn_fwd_kernel)


def _check_blocks(block_m, block_n, mode):
    for name, val in (("block_m", block_m), ("block_n", block_n)):
        if val is None:
            continue
        if not isinstance(val, int) or val < 1 or val & (val - 1):
            raise ValueError(f"{name} must be a power of two, got {val!r}")
        if mode != DOT_SUM and val < 16:
            raise ValueError(f"{name} must be >= 16 for tl.dot, got {val}")


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                    scale: float, block_m: int | None = None, block_n: int | None = None) -> torch.Tensor:
    """FlashAttention forward (no split-KV): q (B, Hq, Tq, D); k, v (B, Hkv, Tk, D) -> (B, Hq,
    Tq, D) in q's dtype. ``block_m`` / ``block_n`` fix the tile sizes (powers of two, >= 16 except
    for float64); by default CUDA autotunes 16-bit calls with max(Tq, Tk) >= AUTOTUNE_MIN_LEN
    and uses :func:`fixed_blocks` otherwise (and always under the interpreter).

    Raises TypeError / ValueError as the attention contract's ``validate`` does, ValueError for
    CPU tensors without the interpreter and for bad block sizes.
    """
    shape = validate(q, k, v, causal, scale)
    check_device(q)
    mode = dot_mode(q.dtype)
    _check_blocks(block_m, block_n, mode)
    out = torch.empty(shape.B, shape.Hq, shape.Tq, shape.D, dtype=q.dtype, device=q.device)
    BLOCK_D = block_d(shape.D)
    args = (q, k, v, out, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
            shape.Hq, shape.Tq, shape.Tk, shape.D, shape.group, float(scale),
            triton.next_power_of_2(max(shape.Tq, shape.Tk)))
    consts = dict(CAUSAL=causal, EVEN_D=BLOCK_D == shape.D, DOT_MODE=mode,
                  TWO_STAGE=two_stage(), BLOCK_D=BLOCK_D)
    fixed = (block_m is not None or block_n is not None or triton_interpreted() or mode != DOT_NATIVE
             or max(shape.Tq, shape.Tk) < AUTOTUNE_MIN_LEN)
    if fixed:
        bm, bn = fixed_blocks(q.dtype, shape.D, shape.Tq)
        bm, bn = block_m or bm, block_n or bn
        grid = (triton.cdiv(shape.Tq, bm), shape.B * shape.Hq)
        _flash_attn_fwd_kernel[grid](*args, **consts, BLOCK_M=bm, BLOCK_N=bn)
    else:
        grid = lambda meta: (triton.cdiv(shape.Tq, meta["BLOCK_M"]), shape.B * shape.Hq)  # noqa: E731
        _autotuned_kernel()[grid](*args, **consts)
    return out


#: Dispatch rule of :func:`attention`: split-KV when Tq <= this and Tk >= SPLIT_MIN_TK.
SPLIT_MAX_TQ = 16
SPLIT_MIN_TK = 1024


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
              scale: float) -> torch.Tensor:
    """The "triton" implementation of the attention contract.

    q (B, Hq, Tq, D); k, v (B, Hkv, Tk, D) -> (B, Hq, Tq, D) in q's dtype. Decoding-shaped
    calls (Tq <= 16, Tk >= 1024) go to the split-KV kernel
    (:func:`optimized.flash_decoding.flash_decoding`); the rest to :func:`flash_attention`.
    Raises as the contract's ``validate`` does.
    """
    shape = validate(q, k, v, causal, scale)
    if shape.Tq <= SPLIT_MAX_TQ and shape.Tk >= SPLIT_MIN_TK:
        from optimized.flash_decoding import flash_decoding

        return flash_decoding(q, k, v, causal=causal, scale=scale)
    return flash_attention(q, k, v, causal=causal, scale=scale)
