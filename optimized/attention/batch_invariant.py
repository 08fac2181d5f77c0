"""The batch-invariant mode of the suite's split-KV kernels: a request's bits do not depend on
what is batched with it (vLLM's ``VLLM_BATCH_INVARIANT``, SGLang's deterministic mode).

The default split-KV launches size their key ranges from the batch (``flash_decoding``: a split
count from B·Hq on GPU; the paged kernels: a split size from the batch's longest sequence), and
the merge reduces each row's splits in a tile whose width follows the batch's split count: a
request's partial sums, and the order they are added in, change with its batch-mates (float32
rounding makes that a few ulps). The invariant mode fixes both per sequence:

- :func:`keys_per_split`: KEYS_PER_SPLIT keys (INTERPRET_KEYS_PER_SPLIT under the interpreter),
  rounded up to the kernel's key tile, a constant. The paged kernels cut every sequence into
  splits of exactly that many keys from its start, so sequence b always has the same
  ceil(L_b / keys_per_split) splits at the same boundaries whatever the batch, and a batch's
  longer sequences only add splits past its end, which are empty (lse = -inf); the dense kernel,
  whose requests share one Tk, cuts Tk into ceil(Tk / keys_per_split) even splits, a function
  of the request's Tk alone;
- :func:`merge_in_order`: the split-KV merge (claim FA-7) walking each row's splits one at a
  time in split order, skipping the empty ones: the row's result is the same sum in
  the same order for any number of trailing empty splits and any tile of rows.

Used by ``flash_decoding(..., batch_invariant=True)`` (attention "triton_splitkv_invariant") and
``paged_attention`` / ``paged_prefill(..., batch_invariant=True)`` (paged_attention
"triton_invariant"); ``properties/test_batch_invariance.py`` enforces the declaration.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from inference_conformance.conformance.device import triton_interpreted
from inference_conformance.optimized.attention.tiles import block_d
from inference_conformance.optimized.triton_shared import flat_grid, tile_loop

#: Keys per split of the invariant mode on GPU (long enough that a split's key loop dominates
#: its merge).
KEYS_PER_SPLIT = 256
#: Keys per split under the interpreter or on the CPU (the default mode's threshold for a second
#: split, so that the laws' drawn lengths reach several splits).
INTERPRET_KEYS_PER_SPLIT = 128


def keys_per_split(block_n: int, device: torch.device) -> int:
    """Keys per split of the invariant mode: KEYS_PER_SPLIT on CUDA, INTERPRET_KEYS_PER_SPLIT
    under the interpreter or on the CPU, rounded up to a multiple of the key tile ``block_n``
    (>= 1). Depends on no batch size or length. Raises ValueError naming ``block_n``."""
    if isinstance(block_n, bool) or not isinstance(block_n, int) or block_n < 1:
        raise ValueError(f"block_n must be an int >= 1, got {block_n!r}")
    per = INTERPRET_KEYS_PER_SPLIT if triton_interpreted() or device.type != "cuda" else KEYS_PER_SPLIT
    return -(-per // block_n) * block_n


@triton.jit
def _max_step(state, args, s, CONSTS: tl.constexpr):
    (mx,) = state
    lse_row, stride_ls, row_ok = args
    lse = tl.load(lse_row + s * stride_ls, mask=row_ok, other=float("-inf")).to(tl.float64)
    return (tl.maximum(mx, lse),)


@triton.jit
def _sum_step(state, args, s, CONSTS: tl.constexpr):
    acc, w_sum = state
    lse_row, op_row, stride_ls, stride_ps, offs_d, row_ok, od_mask, mx = args
    lse = tl.load(lse_row + s * stride_ls, mask=row_ok, other=float("-inf")).to(tl.float64)
    o = tl.load(op_row[:, None] + s * stride_ps + offs_d[None, :], mask=od_mask, other=0.0)
    seen = lse != float("-inf")                                             # an empty split adds nothing
    w = tl.where(seen, tl.exp(lse - mx), 0.0)                               # float64
    return (tl.where(seen[:, None], acc + w.to(o.dtype)[:, None] * o, acc),
            tl.where(seen, w_sum + w, w_sum))


@triton.jit
def ordered_merge_kernel(OP_ptr, LSE_ptr, O_ptr,
                         stride_pbh, stride_pm, stride_ps, stride_pd,
                         stride_lbh, stride_lm, stride_ls,
                         stride_ob, stride_oh, stride_om, stride_od,
                         Hq, Tq, D, NUM_SPLITS, ROWS, Sinks_ptr,
                         BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, HAS_SINKS: tl.constexpr):
    """1-D grid of cdiv(ROWS, BLOCK_M) programs over the ROWS = B·Hq·Tq output rows (row
    r = (b·Hq + h)·Tq + m), from o_s (B·Hq, Tq, S, D) and lse_s (B·Hq, Tq, S) into out
    (B, Hq, Tq, D): out = sum_s exp(lse_s − mx) o_s / (sum_s exp(lse_s − mx) [+ exp(sink − mx)]),
    mx the row's largest lse (and sink), both sums taken split by split in order (the weights in
    float64, the outputs' sum in the partials' dtype), skipping splits with lse = -inf; a row
    with none gets 0. No reduction spans rows or splits."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    row_ok = rows < ROWS
    bh = rows // Tq
    m = rows % Tq
    b = bh // Hq
    h = bh % Hq
    offs_d = tl.arange(0, BLOCK_D)
    od_mask = row_ok[:, None] & (offs_d[None, :] < D)
    lse_row = LSE_ptr + bh * stride_lbh + m * stride_lm
    op_row = OP_ptr + bh * stride_pbh + m * stride_pm
    (mx,) = tile_loop((tl.full([BLOCK_M], float("-inf"), dtype=tl.float64),), (lse_row, stride_ls, row_ok),
                      0, NUM_SPLITS, 1, _max_step, (0,))
    if HAS_SINKS:
        sink = tl.load(Sinks_ptr + h, mask=row_ok, other=0.0).to(tl.float64)  # (BLOCK_M,)
        mx = tl.maximum(mx, sink)
    mx = tl.where(mx == float("-inf"), 0.0, mx)                            # every split empty
    acc, w_sum = tile_loop((tl.zeros([BLOCK_M, BLOCK_D], dtype=OP_ptr.dtype.element_ty),
                            tl.zeros([BLOCK_M], dtype=tl.float64)),
                           (lse_row, op_row, stride_ls, stride_ps, offs_d * stride_pd, row_ok, od_mask, mx),
                           0, NUM_SPLITS, 1, _sum_step, (0,))
    if HAS_SINKS:
        w_sum = w_sum + tl.exp(sink - mx)
    out = acc / tl.where(w_sum == 0.0, 1.0, w_sum).to(acc.dtype)[:, None]   # in the partials' dtype
    tl.store(O_ptr + (b * stride_ob + h * stride_oh + m * stride_om)[:, None] + offs_d[None, :] * stride_od,
             out.to(O_ptr.dtype.element_ty), mask=od_mask)


#: Rows per merge program (a constant: the tile of rows never depends on the batch).
MERGE_BLOCK_M = 16


def merge_in_order(o_part: torch.Tensor, lse: torch.Tensor, out: torch.Tensor,
                   sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The split-KV merge of the invariant mode (:func:`ordered_merge_kernel`), in place into
    ``out``: o_part (B·Hq, Tq, S, D) float32 or float64, lse (B·Hq, Tq, S) float64 or float32
    (-inf: an empty split, weighing 0), out (B, Hq, Tq, D) any floating dtype (strided views
    welcome), ``sinks`` (Hq,) float (FA-8: joins the denominator once). Returns ``out``.
    ValueError when the shapes disagree."""
    B, Hq, Tq, D = out.shape
    if tuple(o_part.shape[:2]) != (B * Hq, Tq) or o_part.shape[3] != D or tuple(lse.shape) != tuple(o_part.shape[:3]):
        raise ValueError(f"merge_in_order: o_part {tuple(o_part.shape)} and lse {tuple(lse.shape)} do not fit "
                         f"out {tuple(out.shape)} (expected (B·Hq, Tq, S, D) and (B·Hq, Tq, S))")
    rows = B * Hq * Tq
    ordered_merge_kernel[flat_grid(triton.cdiv(rows, MERGE_BLOCK_M))](
        o_part, lse, out, *o_part.stride(), *lse.stride(), *out.stride(),
        Hq, Tq, D, o_part.shape[2], rows, lse if sinks is None else sinks,
        BLOCK_M=MERGE_BLOCK_M, BLOCK_D=block_d(D), HAS_SINKS=sinks is not None)
    return out


def compile_variants():
    """The ordered merge, float32 partials into float16, with and without sinks."""
    from inference_conformance.optimized.triton_shared import CompileVariant

    types = {"OP_ptr": "*fp32", "LSE_ptr": "*fp64", "O_ptr": "*fp16"}
    return [CompileVariant("ordered merge fp32", ordered_merge_kernel, types,
                           dict(BLOCK_M=16, BLOCK_D=64, HAS_SINKS=False), min_for_loops=2),
            CompileVariant("ordered merge fp32 sinks", ordered_merge_kernel, {**types, "Sinks_ptr": "*fp32"},
                           dict(BLOCK_M=16, BLOCK_D=128, HAS_SINKS=True), min_for_loops=2)]


def smoke_calls(device: str):
    """The ordered merge of three float32 splits, one empty (lse = -inf), against the exact
    float64 softmax-weighted sum, and bit for bit the same row with three more empty splits."""
    from inference_conformance.optimized.triton_shared import SmokeCall

    def run():
        from inference_conformance.conformance import tolerance

        g = torch.Generator().manual_seed(0)
        o_part = torch.randn(2, 3, 3, 40, generator=g, dtype=torch.float64)
        lse = torch.randn(2, 3, 3, generator=g, dtype=torch.float64)
        lse[:, :, 1], o_part[:, :, 1] = float("-inf"), 0.0
        want = (torch.softmax(lse, dim=-1)[..., None] * o_part).sum(dim=2).reshape(1, 2, 3, 40)
        out = torch.empty(1, 2, 3, 40, dtype=torch.float32, device=device)
        merge_in_order(o_part.to(device, torch.float32), lse.to(device), out)
        padded = torch.cat([o_part, torch.zeros(2, 3, 3, 40, dtype=torch.float64)], dim=2)
        lse_padded = torch.cat([lse, torch.full((2, 3, 3), float("-inf"), dtype=torch.float64)], dim=2)
        again = merge_in_order(padded.to(device, torch.float32), lse_padded.to(device), torch.empty_like(out))
        if not torch.equal(out.view(torch.int32), again.view(torch.int32)):
            raise AssertionError("merge_in_order: three trailing empty splits changed the bits")
        return tolerance.check_close(out, want)
    return [SmokeCall("merge_in_order float32 S=3 one empty split, then 3 more empty", run)]
