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

Small Tq with a long Tk is dispatched to the split-KV kernel of :mod:`inference_conformance.optimized.attention.flash_decoding`.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from inference_conformance.conformance.contracts.attention import validate
from inference_conformance.conformance.device import triton_interpreted
from inference_conformance.optimized.attention.tiles import attend_q_tile, block_d, fixed_blocks, fold_scale, two_stage
from inference_conformance.optimized.attention.flash_decoding import flash_decoding, option_args
from inference_conformance.optimized.triton_shared import DOT_NATIVE, DOT_SUM, check_device, dot_mode, flat_grid

@triton.jit
def _flash_attn_fwd_kernel(
        Q_ptr, K_ptr, V_ptr, O_ptr,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_ob, stride_oh, stride_om, stride_od,
        Hq, Tq, Tk, D, GROUP, scale, LEN_BUCKET, WINDOW, Cap_ptr, Sinks_ptr,
        CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, DOT_MODE: tl.constexpr, TWO_STAGE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr):
    """1-D grid of cdiv(Tq, BLOCK_M) · B · Hq programs: program pid_m + cdiv(Tq, BLOCK_M) · pid_bh
    (query tiles vary fastest; nothing on CUDA's axes 1 and 2, which stop at 65,535). LEN_BUCKET
    only keys the autotuner's cache. TWO_STAGE: first stream the whole visible tiles without
    masks, then the masked rest (on GPU); without it one masked pass (the interpreter, where each
    stage costs a nested call). The options (window, cap, sinks; FA-8) as in ``attend_q_tile``."""
    tiles_m = tl.cdiv(Tq, BLOCK_M)
    b, h, offs_m, offs_d, io_mask, out, _ = attend_q_tile(
        Q_ptr, K_ptr, V_ptr, tl.program_id(0) % tiles_m, tl.program_id(0) // tiles_m, 0, Tk,
        stride_qb, stride_qh, stride_qm, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd, Hq, Tq, Tk, D, GROUP, scale, WINDOW, Cap_ptr, Sinks_ptr,
        CAUSAL, EVEN_D, DOT_MODE, TWO_STAGE, BLOCK_M, BLOCK_N, BLOCK_D, (HAS_WINDOW, HAS_SOFTCAP, HAS_SINKS))
    o_ptrs = O_ptr + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    tl.store(o_ptrs, out.to(O_ptr.dtype.element_ty), mask=io_mask)


# ----------------------------------------------------------------------------------------------
# host side
# ----------------------------------------------------------------------------------------------

#: Below this max(Tq, Tk) CUDA calls use fixed_blocks instead of autotuning (every autotuned
#: shape class compiles every config: fine for benchmarks, slow for property tests).
AUTOTUNE_MIN_LEN = 1024


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
                           key=["LEN_BUCKET", "CAUSAL", "EVEN_D", "DOT_MODE", "TWO_STAGE", "BLOCK_D",
                                "HAS_WINDOW", "HAS_SOFTCAP", "HAS_SINKS"],
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
                    scale: float, block_m: int | None = None, block_n: int | None = None,
                    window: int | None = None, softcap: float | None = None,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """FlashAttention forward (no split-KV): q (B, Hq, Tq, D); k, v (B, Hkv, Tk, D) -> (B, Hq,
    Tq, D) in q's dtype. ``block_m`` / ``block_n`` fix the tile sizes (powers of two, >= 16 except
    for float64); by default CUDA autotunes 16-bit calls with max(Tq, Tk) >= AUTOTUNE_MIN_LEN
    and uses :func:`fixed_blocks` otherwise (and always under the interpreter). ``window``,
    ``softcap``, ``sinks``: the contract's options (FA-8; a window skips the key tiles it hides).

    Raises TypeError / ValueError as the attention contract's ``validate`` does, ValueError for
    CPU tensors without the interpreter and for bad block sizes.
    """
    shape = validate(q, k, v, causal, scale, window, softcap, sinks)
    check_device(q)
    mode = dot_mode(q.dtype)
    _check_blocks(block_m, block_n, mode)
    win, cap, sinks_t = option_args(q, window, softcap, sinks)
    q, scale = fold_scale(q, scale)
    out = torch.empty(shape.B, shape.Hq, shape.Tq, shape.D, dtype=q.dtype, device=q.device)
    BLOCK_D = block_d(shape.D)
    args = (q, k, v, out, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
            shape.Hq, shape.Tq, shape.Tk, shape.D, shape.group, float(scale),
            triton.next_power_of_2(max(shape.Tq, shape.Tk)), win, cap, cap if sinks_t is None else sinks_t)
    consts = dict(CAUSAL=causal, EVEN_D=BLOCK_D == shape.D, DOT_MODE=mode, TWO_STAGE=two_stage(), BLOCK_D=BLOCK_D,
                  HAS_WINDOW=window is not None, HAS_SOFTCAP=softcap is not None, HAS_SINKS=sinks is not None)
    fixed = (block_m is not None or block_n is not None or triton_interpreted() or mode != DOT_NATIVE
             or max(shape.Tq, shape.Tk) < AUTOTUNE_MIN_LEN)
    if fixed:
        bm, bn = fixed_blocks(q.dtype, shape.D, shape.Tq)
        bm, bn = block_m or bm, block_n or bn
        grid = flat_grid(triton.cdiv(shape.Tq, bm), shape.B * shape.Hq)
        _flash_attn_fwd_kernel[grid](*args, **consts, BLOCK_M=bm, BLOCK_N=bn)
    else:
        grid = lambda meta: flat_grid(triton.cdiv(shape.Tq, meta["BLOCK_M"]), shape.B * shape.Hq)  # noqa: E731
        _autotuned_kernel()[grid](*args, **consts)
    return out


#: Dispatch rule of :func:`attention`: split-KV when Tq <= this and Tk >= SPLIT_MIN_TK.
SPLIT_MAX_TQ = 16
SPLIT_MIN_TK = 1024


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
              scale: float, window: int | None = None, softcap: float | None = None,
              sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The "triton" implementation of the attention contract.

    q (B, Hq, Tq, D); k, v (B, Hkv, Tk, D) -> (B, Hq, Tq, D) in q's dtype. Decoding-shaped
    calls (Tq <= 16, Tk >= 1024) go to the split-KV kernel
    (:func:`inference_conformance.optimized.attention.flash_decoding.flash_decoding`); the rest to :func:`flash_attention`.
    The options (``window``, ``softcap``, ``sinks``; FA-8) go to either. Raises as the
    contract's ``validate`` does.
    """
    shape = validate(q, k, v, causal, scale, window, softcap, sinks)
    opts = dict(window=window, softcap=softcap, sinks=sinks)
    if shape.Tq <= SPLIT_MAX_TQ and shape.Tk >= SPLIT_MIN_TK:
        return flash_decoding(q, k, v, causal=causal, scale=scale, **opts)
    return flash_attention(q, k, v, causal=causal, scale=scale, **opts)


def compile_variants():
    """Each dtype's tile products; both masks on 16-bit, where the autotuned benchmarks run
    (the two-stage causal path: two key-tile loops)."""
    from inference_conformance.optimized.triton_shared import DOT_IEEE, DOT_NATIVE, DOT_SUM, CompileVariant

    out = []
    for dt, mode, bm, bn, bd, causal in (("*fp16", DOT_NATIVE, 64, 64, 64, True), ("*fp16", DOT_NATIVE, 64, 64, 64, False),
                                         ("*fp32", DOT_IEEE, 64, 32, 64, True), ("*fp64", DOT_SUM, 16, 16, 16, True)):
        out.append(CompileVariant(
            f"flash_attn {dt[1:]} causal={causal}", _flash_attn_fwd_kernel,
            {"Q_ptr": dt, "K_ptr": dt, "V_ptr": dt, "O_ptr": dt, "scale": "fp32", "Cap_ptr": "*fp32", "Sinks_ptr": "*fp32"},
            dict(CAUSAL=causal, EVEN_D=False, DOT_MODE=mode, TWO_STAGE=True, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd,
                 HAS_WINDOW=False, HAS_SOFTCAP=False, HAS_SINKS=False),
            min_for_loops=2))
    out.append(CompileVariant(  # the options: one masked pass over the window's tiles
        "flash_attn fp16 causal window softcap sinks", _flash_attn_fwd_kernel,
        {"Q_ptr": "*fp16", "K_ptr": "*fp16", "V_ptr": "*fp16", "O_ptr": "*fp16", "scale": "fp32", "Cap_ptr": "*fp32",
         "Sinks_ptr": "*fp32"},
        dict(CAUSAL=True, EVEN_D=False, DOT_MODE=DOT_NATIVE, TWO_STAGE=True, BLOCK_M=64, BLOCK_N=64, BLOCK_D=64,
             HAS_WINDOW=True, HAS_SOFTCAP=True, HAS_SINKS=True), min_for_loops=1))
    return out


def smoke_calls(device: str):
    """float16 causal, float32 with Tq != Tk, float64 causal, against the float64 reference."""
    from inference_conformance.optimized.attention.flash_decoding import attention_smoke
    from inference_conformance.optimized.triton_shared import SmokeCall

    return [SmokeCall("flash_attention float16 causal Tq=Tk=50", attention_smoke(flash_attention, device, torch.float16, 50, 50, True)),
            SmokeCall("flash_attention float32 Tq=7 Tk=33", attention_smoke(flash_attention, device, torch.float32, 7, 33, False)),
            SmokeCall("flash_attention float64 causal Tq=5 Tk=21", attention_smoke(flash_attention, device, torch.float64, 5, 21, True)),
            SmokeCall("flash_attention bfloat16 Tq=40 Tk=200 window=40 softcap=5 sinks",
                      attention_smoke(flash_attention, device, torch.bfloat16, 40, 200, True, window=40, softcap=5.0,
                                      sinks=torch.linspace(-1, 2, 4, device=device)))]
