"""Split-KV attention (Flash-Decoding) in Triton: the "triton_splitkv" implementation of the
attention contract.

At decode time Tq is 1 (or a few draft tokens) and the KV cache is long: the FlashAttention grid
(query tiles × heads) then has only B·Hq programs, too few to fill the GPU. Flash-Decoding
(Dao, Haziza, Massa, Sizov 2023) also splits the keys into ``num_splits`` ranges: each program
streams one range and writes a partial output o_s, normalised over its own keys, and the
log-sum-exp lse_s = m_s + log l_s of its scores (in float64: at logits of ~1e3 a float32 lse
rounds by ~1e-4, which the weights below would carry); a second kernel merges the partials exactly:

    out = sum_s w_s o_s,   w_s = exp(lse_s − max_s lse_s) / sum_s exp(lse_s − max_s lse_s)

(claim FA-7; lecture 001 §3.4). Any Tq, causal or not, GQA, D 1..256 are supported: the split
kernel shares the work of a program (``attend_q_tile``) with FlashAttention, and the merge
(``split_kv_merge_kernel``, which weighs a split that saw no key 0) with paged attention, all
in :mod:`inference_conformance.optimized.attention.tiles`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from inference_conformance.conformance.contracts.attention import validate
from inference_conformance.conformance.contracts.checks import check_num_splits
from inference_conformance.conformance.device import triton_interpreted
from inference_conformance.optimized.attention.batch_invariant import keys_per_split, merge_in_order
from inference_conformance.optimized.attention.tiles import (MAX_SPLITS, attend_q_tile, block_d, fixed_blocks, fold_scale, merge_splits,
                                       split_kv_merge_kernel, two_stage)
from inference_conformance.optimized.triton_shared import DOT_SUM, check_device, dot_mode, flat_grid, sm_count


@triton.jit
def _split_kv_kernel(
        Q_ptr, K_ptr, V_ptr, OP_ptr, LSE_ptr,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_pbh, stride_pm, stride_ps, stride_pd,
        stride_lbh, stride_lm, stride_ls,
        Hq, Tq, Tk, D, GROUP, NUM_SPLITS, scale, WINDOW, Cap_ptr,
        CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, DOT_MODE: tl.constexpr, TWO_STAGE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr):
    """1-D grid of cdiv(Tq, BLOCK_M) · NUM_SPLITS · B · Hq programs: program
    pid_m + cdiv(Tq, BLOCK_M) · (split + NUM_SPLITS · pid_bh) (nothing on CUDA's axes 1 and 2,
    which stop at 65,535). Split s covers keys [s·Tk // NUM_SPLITS, (s+1)·Tk // NUM_SPLITS).
    Writes o_s (B·Hq, Tq, S, D) and lse_s (B·Hq, Tq, S); a split with no visible key for a row
    writes o = 0, lse = -inf. The window and the cap as in ``attend_q_tile`` (a split wholly
    before a tile's window reads no key); sinks are left to the merge (FA-8)."""
    tiles_m = tl.cdiv(Tq, BLOCK_M)
    rest = tl.program_id(0) // tiles_m
    split = rest % NUM_SPLITS
    pid_bh = rest // NUM_SPLITS
    b, h, offs_m, offs_d, io_mask, o, lse = attend_q_tile(
        Q_ptr, K_ptr, V_ptr, tl.program_id(0) % tiles_m, pid_bh,
        (split * Tk) // NUM_SPLITS, ((split + 1) * Tk) // NUM_SPLITS,
        stride_qb, stride_qh, stride_qm, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd, Hq, Tq, Tk, D, GROUP, scale, WINDOW, Cap_ptr, Cap_ptr,
        CAUSAL, EVEN_D, DOT_MODE, TWO_STAGE, BLOCK_M, BLOCK_N, BLOCK_D, (HAS_WINDOW, HAS_SOFTCAP, False))
    op_ptrs = OP_ptr + pid_bh * stride_pbh + offs_m[:, None] * stride_pm + split * stride_ps + offs_d[None, :] * stride_pd
    tl.store(op_ptrs, o.to(OP_ptr.dtype.element_ty), mask=io_mask)
    tl.store(LSE_ptr + pid_bh * stride_lbh + offs_m * stride_lm + split * stride_ls,
             lse.to(LSE_ptr.dtype.element_ty), mask=offs_m < Tq)


#: The merge kernel under the name the launch-capture laws patch (launches go through
#: :func:`inference_conformance.optimized.attention.tiles.merge_splits`; no float argument reaches it).
_merge_kernel = split_kv_merge_kernel

#: Default number of splits under the interpreter (enough to exercise the merge, few programs).
INTERPRET_SPLITS = 2
#: Fewest keys per split that the automatic choice allows on GPU.
MIN_KEYS_PER_SPLIT = 256


def default_num_splits(B: int, Hq: int, Tq: int, Tk: int, block_m: int, device: torch.device) -> int:
    """Splits that bring the grid to about two programs per streaming multiprocessor, each split
    keeping at least MIN_KEYS_PER_SPLIT keys (under the interpreter: INTERPRET_SPLITS)."""
    if triton_interpreted() or device.type != "cuda":
        return max(1, min(INTERPRET_SPLITS, Tk))
    return gpu_num_splits(B, Hq, Tq, Tk, block_m, sm_count(device.index if device.index is not None
                                                          else torch.cuda.current_device()))


def gpu_num_splits(B: int, Hq: int, Tq: int, Tk: int, block_m: int, sms: int) -> int:
    """The GPU's automatic split count for a GPU of ``sms`` multiprocessors: about two programs
    per SM over the cdiv(Tq, block_m)·B·Hq query tiles, each split at least MIN_KEYS_PER_SPLIT
    keys, at most MAX_SPLITS. It depends on B: the batch decides a request's splits."""
    want = triton.cdiv(2 * sms, triton.cdiv(Tq, block_m) * B * Hq)
    return max(1, min(want, Tk // MIN_KEYS_PER_SPLIT, MAX_SPLITS))


def _blocks(dtype: torch.dtype, D: int, Tq: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) of the split kernel."""
    bm, bn = fixed_blocks(dtype, D, Tq)
    return bm, bn, 4, (1 if dtype == torch.float64 or triton_interpreted() else 2)


def option_args(q: torch.Tensor, window, softcap, sinks) -> tuple:
    """(WINDOW, cap tensor, sinks tensor or None) the kernels take for the contract's options:
    WINDOW = 0 without a window; the cap as a one-element tensor in the accumulator's dtype
    (float64 for float64 q: a Python float argument would be float32 once compiled), 1.0 when
    off; sinks contiguous in that dtype."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    cap = torch.tensor([1.0 if softcap is None else float(softcap)], dtype=acc, device=q.device)
    return (0 if window is None else int(window), cap,
            None if sinks is None else sinks.to(device=q.device, dtype=acc).contiguous())


def flash_decoding(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float,
                   num_splits: int | None = None, window: int | None = None, softcap: float | None = None,
                   sinks: torch.Tensor | None = None, batch_invariant: bool = False) -> torch.Tensor:
    """Split-KV attention: q (B, Hq, Tq, D); k, v (B, Hkv, Tk, D) -> (B, Hq, Tq, D) in q's dtype.

    ``num_splits``: number of key ranges (larger values are capped at min(Tk, MAX_SPLITS)); None chooses
    from the grid size (:func:`default_num_splits`). ``window``, ``softcap``, ``sinks``: the
    contract's options (FA-8; sinks join the merge once). ``batch_invariant``: ceil(Tk /
    keys_per_split) splits, a split size that depends on no batch size, merged in split order
    (:mod:`inference_conformance.optimized.attention.batch_invariant`); not with ``num_splits``.
    Raises TypeError / ValueError as the contract's ``validate`` does, ValueError for a bad
    ``num_splits`` (or one given with ``batch_invariant``) or CPU tensors without the interpreter.
    """
    shape = validate(q, k, v, causal, scale, window, softcap, sinks)
    check_device(q)
    check_num_splits(num_splits, batch_invariant)
    mode = dot_mode(q.dtype)
    win, cap, sinks = option_args(q, window, softcap, sinks)
    q, scale = fold_scale(q, scale)
    BLOCK_D = block_d(shape.D)
    bm, bn, warps, stages = _blocks(q.dtype, shape.D, shape.Tq)
    if batch_invariant:   # the split count from Tk alone; the ordered merge takes any count
        S = max(1, -(-shape.Tk // keys_per_split(bn, q.device)))
    else:
        if num_splits is None:
            num_splits = default_num_splits(shape.B, shape.Hq, shape.Tq, shape.Tk, bm, q.device)
        S = min(num_splits, shape.Tk, MAX_SPLITS)
    part_dtype = torch.float64 if mode == DOT_SUM else torch.float32
    o_part = torch.empty(shape.B * shape.Hq, shape.Tq, S, shape.D, dtype=part_dtype, device=q.device)
    lse = torch.empty(shape.B * shape.Hq, shape.Tq, S, dtype=torch.float64, device=q.device)   # log_sum_exp
    grid = flat_grid(triton.cdiv(shape.Tq, bm), S, shape.B * shape.Hq)
    _split_kv_kernel[grid](
        q, k, v, o_part, lse, *q.stride(), *k.stride(), *v.stride(), *o_part.stride(), *lse.stride(),
        shape.Hq, shape.Tq, shape.Tk, shape.D, shape.group, S, float(scale), win, cap,
        CAUSAL=causal, EVEN_D=BLOCK_D == shape.D, DOT_MODE=mode, TWO_STAGE=two_stage(),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=BLOCK_D, HAS_WINDOW=window is not None, HAS_SOFTCAP=softcap is not None,
        num_warps=warps, num_stages=stages)
    out = torch.empty(shape.B, shape.Hq, shape.Tq, shape.D, dtype=q.dtype, device=q.device)
    merge = merge_in_order if batch_invariant else merge_splits
    return merge(o_part, lse, out) if sinks is None else merge(o_part, lse, out, sinks)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float,
              num_splits: int | None = None, window: int | None = None, softcap: float | None = None,
              sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The "triton_splitkv" implementation of the attention contract: always the split-KV path
    (:func:`flash_decoding`), whatever the shape; ``num_splits`` and the options as there."""
    return flash_decoding(q, k, v, causal=causal, scale=scale, num_splits=num_splits, window=window,
                          softcap=softcap, sinks=sinks)


def attention_invariant(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float,
                        window: int | None = None, softcap: float | None = None,
                        sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The "triton_splitkv_invariant" implementation of the attention contract: the split-KV path
    in its batch-invariant mode (:func:`flash_decoding` with ``batch_invariant=True``: a request's
    bits do not depend on B); shapes, options and errors as there."""
    return flash_decoding(q, k, v, causal=causal, scale=scale, window=window, softcap=softcap, sinks=sinks,
                          batch_invariant=True)


def compile_variants():
    """The split-KV partials (fp16, causal, two-stage: two key-tile loops)."""
    from inference_conformance.optimized.triton_shared import DOT_NATIVE, CompileVariant

    return [CompileVariant("split_kv fp16 causal", _split_kv_kernel,
                           {"Q_ptr": "*fp16", "K_ptr": "*fp16", "V_ptr": "*fp16", "OP_ptr": "*fp32", "LSE_ptr": "*fp64",
                            "scale": "fp32", "Cap_ptr": "*fp32"},
                           dict(CAUSAL=True, EVEN_D=True, DOT_MODE=DOT_NATIVE, TWO_STAGE=True, BLOCK_M=16, BLOCK_N=64,
                                BLOCK_D=64, HAS_WINDOW=False, HAS_SOFTCAP=False), min_for_loops=2),
            CompileVariant("split_kv fp16 window softcap", _split_kv_kernel,
                           {"Q_ptr": "*fp16", "K_ptr": "*fp16", "V_ptr": "*fp16", "OP_ptr": "*fp32", "LSE_ptr": "*fp64",
                            "scale": "fp32", "Cap_ptr": "*fp32"},
                           dict(CAUSAL=True, EVEN_D=True, DOT_MODE=DOT_NATIVE, TWO_STAGE=True, BLOCK_M=16, BLOCK_N=64,
                                BLOCK_D=64, HAS_WINDOW=True, HAS_SOFTCAP=True), min_for_loops=1)]


def smoke_calls(device: str):
    """bfloat16 decode over three splits, against the float64 reference."""
    from inference_conformance.optimized.triton_shared import SmokeCall

    return [SmokeCall("flash_decoding bfloat16 causal Tq=1 Tk=70 num_splits=3",
                      attention_smoke(flash_decoding, device, torch.bfloat16, 1, 70, True, num_splits=3)),
            SmokeCall("flash_decoding float32 Tq=2 Tk=90 window=20 softcap=5 sinks num_splits=3",
                      attention_smoke(flash_decoding, device, torch.float32, 2, 90, True, num_splits=3,
                                      window=20, softcap=5.0, sinks=torch.linspace(-1, 2, 4, device=device)))]


def attention_smoke(fn, device: str, dtype: torch.dtype, Tq: int, Tk: int, causal: bool, **kw):
    """A smoke call of an attention kernel ``fn`` (B=1, Hq=4, Hkv=2, D=40, seeded inputs) judged
    by the tolerance policy against the float64 reference (``scripts/kernel_smoke.py``)."""
    def run():
        from inference_conformance.conformance import tolerance
        from inference_conformance.reference.attention import attention as attention_ref
        from inference_conformance.reference.attention import attention_naive

        g = torch.Generator().manual_seed(0)
        q = torch.randn(1, 4, Tq, 40, generator=g).to(device, dtype)
        k = torch.randn(1, 2, Tk, 40, generator=g).to(device, dtype)
        v = torch.randn(1, 2, Tk, 40, generator=g).to(device, dtype)
        scale = 40 ** -0.5
        opts = {o: kw[o] for o in ("window", "softcap", "sinks") if o in kw}
        out = fn(q, k, v, causal=causal, scale=scale, **kw)
        out_ref = attention_ref(q, k, v, causal=causal, scale=scale, **opts)
        half = dtype in (torch.float16, torch.bfloat16)
        out_pt = attention_naive(q, k, v, causal=causal, scale=scale, **opts) if half else None
        return tolerance.check_close(out, out_ref, out_pt=out_pt)
    return run

