"""Pieces shared by the Triton attention kernels (:mod:`optimized.flash_attention`,
:mod:`optimized.flash_decoding`, and every later kernel that streams key tiles): the online-softmax
tile loop ``attn_tiles``, how tiles are multiplied per dtype (``DOT_*``), and the host-side
choices of tile sizes and loop shape. Both kernel modules import this one; it imports neither.

The tile loop (Dao et al. 2022; Dao 2023, FlashAttention-2 loop order; lecture 001 §3.2):

    s = scale · q Kᵀ,  m' = max(m, rowmax s),  p = exp(s − m'),
    acc = acc · exp(m − m') + p V,  l = l · exp(m − m') + rowsum p
"""
from __future__ import annotations

import re
import warnings

import numpy
import torch
import triton
import triton.language as tl

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


#: True: attn_tiles walks its key tiles with ``for ... in range`` (compiled code, where the loop
#: is software-pipelined, and interpreters that allow it); False: with ``while`` (see above).
RANGE_LOOP = tl.constexpr(_range_takes_runtime_bounds())


@triton.jit
def round_to_bf16(w):
    """float32 -> the nearest bfloat16 value (ties to even), kept in float32 (finite inputs).
    Triton's interpreter truncates float32 -> bfloat16 casts; kernels round by hand there."""
    bits = w.to(tl.uint32, bitcast=True)
    bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def attn_tiles(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
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
    """One key tile of :func:`attn_tiles`: keys start_n + offs_n at k_ptrs / v_ptrs."""
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


def check_device(q: torch.Tensor) -> None:
    """The kernels need CUDA tensors, or CPU tensors under the interpreter (TRITON_INTERPRET=1)."""
    if q.device.type != "cuda" and not triton_interpreted():
        raise ValueError(f"q is on {q.device}; the Triton kernels need CUDA tensors "
                         "(or TRITON_INTERPRET=1 for CPU tensors)")
