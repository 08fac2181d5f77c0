"""Paged decode attention in Triton (the "triton" implementation of the paged_attention contract)
and the cache write that scatters new K/V into their slots by a slot mapping.

``paged_attention``: one program per (sequence, KV head, split) handles all GROUP query heads
that read that KV head (GQA: the KV tile is loaded once for the group). It walks its split's
tokens in tiles of BLOCK_N; for each token t it reads the block table,
``phys = block_table[b, t // PAGE]``, and loads K/V from slot ``t % PAGE`` of that physical block,
so any block size >= 1 works (powers of two or not, 1 and 256 included) and nothing past
``seq_lens[b]`` (neither table entries nor slots) is ever read: the loads are masked. That key
tile is :func:`inference_conformance.optimized.paged_attention.kv_tile.paged_kv_tile`, shared with the mixed-batch kernel of
chunked prefill (:mod:`inference_conformance.optimized.paged_attention.prefill`, the contract's ``paged_prefill``), which takes
query tiles of several tokens per sequence, causal; this kernel stays the decode-only path. Each
program keeps the online-softmax state (m, l, acc); with one split it writes the output, with
several it writes a partial output and its log-sum-exp, merged exactly by a second kernel (the
split-KV merge of Flash-Decoding, FA-7, shared with :mod:`inference_conformance.optimized.attention.flash_decoding` in
:mod:`inference_conformance.optimized.attention.tiles`; a split past a sequence's end weighs 0), which keeps long
contexts parallel.

``write_kv_cache``: program n writes token n's K and V (all KV heads) into slot
``slot_mapping[n]`` = physical block · PAGE + offset.

Float64 inputs are computed in float64, the others in float32 (16-bit loads are upcast);
products are broadcast multiplies and sums, not ``tl.dot``, so the kernel is exact enough for
the tolerance policy in every dtype and runs under the interpreter (TRITON_INTERPRET=1, CPU)
as compiled (CUDA). Host wrappers validate everything with the contract's ``validate`` before any
launch. The options of the attention contract (claim FA-8): a window starts each program at
its sequence's first visible token (the tokens before it are never read), the cap is applied
in the key tile, and sinks join the state after the last key (one split) or the merge, once.
Claims PA-1; source: Kwon et al. 2023 (vLLM), lecture 001 §4.2.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from inference_conformance.conformance.contracts.checks import check_num_splits
from inference_conformance.conformance.contracts.paged_attention.validate import validate
from inference_conformance.conformance.device import triton_interpreted
from inference_conformance.optimized.attention.batch_invariant import merge_in_order
from inference_conformance.optimized.attention.flash_decoding import option_args
from inference_conformance.optimized.attention.tiles import fold_scale, log_sum_exp, merge_splits, split_kv_merge_kernel
from inference_conformance.optimized.paged_attention.kv_tile import join_sinks, paged_kv_tile
from inference_conformance.optimized.paged_attention.splits import split_plan
from inference_conformance.optimized.triton_shared import check_device, flat_grid, tile_loop


@triton.jit
def _paged_decode_kernel(
        Q_ptr, K_ptr, V_ptr, BT_ptr, LENS_ptr, O_ptr, OP_ptr, LSE_ptr,
        stride_qb, stride_qh, stride_qd,
        stride_kn, stride_ks, stride_kh, stride_kd,
        stride_vn, stride_vs, stride_vh, stride_vd,
        stride_btb, stride_btm, stride_sl,
        stride_ob, stride_oh, stride_od,
        stride_pb, stride_ph, stride_ps, stride_pd,
        stride_lb, stride_lh, stride_ls,
        Hkv, D, GROUP, TOKENS_PER_SPLIT, NUM_SPLITS, scale, WINDOW, Cap_ptr, Sinks_ptr,
        PAGE: tl.constexpr, SPLIT: tl.constexpr, ACC64: tl.constexpr,
        BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr):
    """1-D grid of NUM_SPLITS · B · Hkv programs: program split + NUM_SPLITS · (b·Hkv + kvh)
    (nothing on CUDA's axes 1 and 2, which stop at 65,535). Split s covers tokens
    [s·TOKENS_PER_SPLIT, (s+1)·TOKENS_PER_SPLIT) ∩ [0, seq_len). Without SPLIT writes out
    (B, Hq, D); with SPLIT writes o_s (B, Hq, S, D) and lse_s (B, Hq, S) (o = 0, lse = -inf
    for an empty split). HAS_WINDOW: tokens before seq_len − WINDOW are skipped; HAS_SINKS
    (unsplit only: a split call leaves the sinks to the merge) joins Sinks_ptr[h] at the end."""
    pid = tl.program_id(0) // NUM_SPLITS
    split = tl.program_id(0) % NUM_SPLITS
    b = (pid // Hkv).to(tl.int64)
    kvh = (pid % Hkv).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    h = kvh * GROUP + offs_h                                                # query heads of this KV head
    h_mask = offs_h < GROUP
    d_mask = offs_d < D
    hd_mask = h_mask[:, None] & d_mask[None, :]
    q = tl.load(Q_ptr + b * stride_qb + h[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=hd_mask, other=0.0)                                    # (BLOCK_H, BLOCK_D)
    ACC: tl.constexpr = tl.float64 if ACC64 else tl.float32
    q = q.to(ACC)
    state = (tl.zeros([BLOCK_H, BLOCK_D], dtype=ACC), tl.full([BLOCK_H], float("-inf"), dtype=ACC),
             tl.zeros([BLOCK_H], dtype=ACC))                                # (acc, m, l)
    seq_len = tl.load(LENS_ptr + b * stride_sl).to(tl.int64)
    start = split * TOKENS_PER_SPLIT
    end = tl.minimum(start + TOKENS_PER_SPLIT, seq_len)
    if HAS_WINDOW:     # the one query sees the last WINDOW tokens: start there
        start = tl.maximum(start, tl.minimum(seq_len - WINDOW, end))
    cap = tl.load(Cap_ptr).to(ACC)
    bt_row = BT_ptr + b * stride_btb
    k_head = K_ptr + kvh * stride_kh
    v_head = V_ptr + kvh * stride_vh
    acc, m_i, l_i = tile_loop(state, (q, offs_h, offs_h, cap, bt_row, k_head, v_head, end, offs_n, offs_d, d_mask,
                                      scale, stride_btm, stride_kn, stride_ks, stride_kd, stride_vn, stride_vs,
                                      stride_vd),
                              start, end, BLOCK_N, paged_kv_tile, (PAGE, False, False, HAS_SOFTCAP))
    if HAS_SINKS and not SPLIT:
        acc, m_i, l_i = join_sinks(acc, m_i, l_i, Sinks_ptr, h, h_mask, ACC)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_safe[:, None]
    if SPLIT:
        lse = log_sum_exp(m_i, l_i)                                         # float64
        tl.store(OP_ptr + b * stride_pb + h[:, None] * stride_ph + split * stride_ps + offs_d[None, :] * stride_pd,
                 o.to(OP_ptr.dtype.element_ty), mask=hd_mask)
        tl.store(LSE_ptr + b * stride_lb + h * stride_lh + split * stride_ls, lse.to(LSE_ptr.dtype.element_ty),
                 mask=h_mask)
    else:
        tl.store(O_ptr + b * stride_ob + h[:, None] * stride_oh + offs_d[None, :] * stride_od,
                 o.to(O_ptr.dtype.element_ty), mask=hd_mask)


@triton.jit
def _write_kv_kernel(K_ptr, V_ptr, KC_ptr, VC_ptr, SLOT_ptr,
                     stride_kt, stride_kh, stride_kd,
                     stride_vt, stride_vh, stride_vd,
                     stride_kcn, stride_kcs, stride_kch, stride_kcd,
                     stride_vcn, stride_vcs, stride_vch, stride_vcd,
                     Hkv, D,
                     PAGE: tl.constexpr, BLOCK_HKV: tl.constexpr, BLOCK_D: tl.constexpr):
    """Grid (N,): token n's K and V, (Hkv, D), go to slot slot_mapping[n] of the caches."""
    n = tl.program_id(0).to(tl.int64)
    slot = tl.load(SLOT_ptr + n).to(tl.int64)
    blk = slot // PAGE
    off = slot % PAGE
    offs_h = tl.arange(0, BLOCK_HKV)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < Hkv) & (offs_d[None, :] < D)
    k = tl.load(K_ptr + n * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :] * stride_kd, mask=mask)
    v = tl.load(V_ptr + n * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :] * stride_vd, mask=mask)
    tl.store(KC_ptr + blk * stride_kcn + off * stride_kcs + offs_h[:, None] * stride_kch + offs_d[None, :] * stride_kcd,
             k, mask=mask)
    tl.store(VC_ptr + blk * stride_vcn + off * stride_vcs + offs_h[:, None] * stride_vch + offs_d[None, :] * stride_vcd,
             v, mask=mask)


#: The merge kernel under the name the launch-capture laws patch (launches go through
#: :func:`inference_conformance.optimized.attention.tiles.merge_splits`; no float argument reaches it).
_paged_merge_kernel = split_kv_merge_kernel

#: Tokens per tile under the interpreter (fewer, larger tiles: its cost is per operation).
INTERPRET_BLOCK_N = 128


def _tiles(dtype: torch.dtype, group: int, D: int) -> tuple[int, int, int]:
    """(BLOCK_H, BLOCK_N, BLOCK_D): the 3-D product tile BLOCK_H·BLOCK_N·BLOCK_D stays bounded."""
    BLOCK_H = triton.next_power_of_2(group)
    BLOCK_D = triton.next_power_of_2(D)
    if triton_interpreted():
        return BLOCK_H, INTERPRET_BLOCK_N, BLOCK_D
    budget = 4096 if dtype == torch.float64 else 16384
    n = budget // (BLOCK_H * BLOCK_D)
    BLOCK_N = max(4, min(64, 1 << max(0, n.bit_length() - 1)))
    return BLOCK_H, BLOCK_N, BLOCK_D


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                    seq_lens: torch.Tensor, *, scale: float, num_splits: int | None = None,
                    window: int | None = None, softcap: float | None = None,
                    sinks: torch.Tensor | None = None, batch_invariant: bool = False) -> torch.Tensor:
    """Paged decode attention: q (B, Hq, D); k_cache, v_cache (num_blocks, block_size, Hkv, D);
    block_table (B, max_blocks) int32; seq_lens (B,) int32 -> (B, Hq, D) in q's dtype.

    ``num_splits``: split each sequence's tokens into this many ranges (merged exactly; at most
    MAX_SPLITS, and never ranges shorter than a tile of BLOCK_N tokens); None chooses from the
    grid size. ``window``, ``softcap``, ``sinks``: the contract's options (FA-8).
    ``batch_invariant``: splits of a fixed size (:func:`batch_invariant.keys_per_split`), always
    merged, in split order (the "triton_invariant" implementation). Raises TypeError / ValueError
    as the contract's ``validate``, ValueError for a bad ``num_splits`` (or one given with
    ``batch_invariant``) or CPU tensors without the interpreter.
    """
    shape = validate(q, k_cache, v_cache, block_table, seq_lens, scale, window, softcap, sinks)
    check_device(q, "q")
    check_num_splits(num_splits, batch_invariant)
    win, cap, sinks = option_args(q, window, softcap, sinks)
    q, scale = fold_scale(q, scale)                                          # float64: scale into q
    max_len = int(seq_lens.max())
    BLOCK_H, BLOCK_N, BLOCK_D = _tiles(q.dtype, shape.group, shape.D)
    per, S, split = split_plan(shape.B, shape.Hkv, max_len, BLOCK_N, q.device, num_splits, batch_invariant)
    acc64 = q.dtype == torch.float64
    out = torch.empty(shape.B, shape.Hq, shape.D, dtype=q.dtype, device=q.device)
    if split:
        part_dtype = torch.float64 if acc64 else torch.float32
        o_part = torch.empty(shape.B, shape.Hq, S, shape.D, dtype=part_dtype, device=q.device)
        lse = torch.empty(shape.B, shape.Hq, S, dtype=torch.float64, device=q.device)   # log_sum_exp
    else:
        o_part = out.unsqueeze(2)                                            # unused (SPLIT is off)
        lse = torch.empty(1, 1, 1, dtype=torch.float32, device=q.device)
    _paged_decode_kernel[flat_grid(S, shape.B * shape.Hkv)](
        q, k_cache, v_cache, block_table, seq_lens, out, o_part, lse,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_table.stride(), seq_lens.stride(0),
        *out.stride(), *o_part.stride(), *lse.stride(),
        shape.Hkv, shape.D, shape.group, per, S, scale, win, cap, cap if sinks is None else sinks,
        PAGE=shape.block_size, SPLIT=split, ACC64=acc64,
        BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D,
        HAS_WINDOW=window is not None, HAS_SOFTCAP=softcap is not None, HAS_SINKS=sinks is not None)
    if split:   # the split-KV merge, with each sequence as one query row: (B·Hq, 1, S, D)
        merge = merge_in_order if batch_invariant else merge_splits
        parts = (o_part.view(shape.B * shape.Hq, 1, S, shape.D), lse.view(shape.B * shape.Hq, 1, S), out.unsqueeze(2))
        if sinks is None:
            merge(*parts)
        else:
            merge(*parts, sinks)
    return out


def paged_attention_invariant(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              block_table: torch.Tensor, seq_lens: torch.Tensor, *, scale: float,
                              window: int | None = None, softcap: float | None = None,
                              sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The decode function of "triton_invariant": :func:`paged_attention` with ``batch_invariant=True``
    (a sequence's splits and merge never depend on its batch); shapes, options, errors as there."""
    return paged_attention(q, k_cache, v_cache, block_table, seq_lens, scale=scale, window=window, softcap=softcap,
                           sinks=sinks, batch_invariant=True)


def validate_write(k_cache, v_cache, k, v, slot_mapping) -> tuple[int, int, int]:
    """Check a cache write; return (N, Hkv, D).

    k_cache, v_cache (num_blocks, block_size, Hkv, D) of one floating dtype, two buffers (not one
    tensor twice) whose slots do not share memory (no stride 0, as an expanded view has);
    k, v (N, Hkv, D) of the caches' dtype; slot_mapping (N,) int32 or int64, each slot in [0, num_blocks·block_size)
    and no slot twice. Raises TypeError / ValueError naming the argument.
    """
    for name, t, rank in (("k_cache", k_cache, 4), ("v_cache", v_cache, 4), ("k", k, 3), ("v", v, 3)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != rank:
            raise ValueError(f"{name} must have {rank} dimensions, got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor, got {t.dtype}")
    if tuple(k_cache.shape) != tuple(v_cache.shape):
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must have one shape")
    if v_cache.data_ptr() == k_cache.data_ptr():
        raise ValueError("v_cache must be a separate buffer from k_cache (they start at one address: the values "
                         "would overwrite the keys)")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        shared = [d for d in range(4) if t.shape[d] > 1 and t.stride(d) == 0]
        if shared:
            raise ValueError(f"{name} has stride 0 along dimension {shared[0]} (an expanded view, strides "
                             f"{t.stride()}): its slots share memory, so one write would land in several")
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have one shape")
    num_blocks, block_size, Hkv, D = k_cache.shape
    if tuple(k.shape[1:]) != (Hkv, D):
        raise ValueError(f"k must have shape (N, Hkv, D) = (N, {Hkv}, {D}) like the caches, got {tuple(k.shape)}")
    for name, t in (("v_cache", v_cache), ("k", k), ("v", v)):
        if t.dtype != k_cache.dtype:
            raise TypeError(f"{name} has dtype {t.dtype}, k_cache {k_cache.dtype}: one dtype for all")
    if not isinstance(slot_mapping, torch.Tensor):
        raise TypeError(f"slot_mapping must be a torch.Tensor (N,) of int32 or int64, got {type(slot_mapping).__name__}")
    if slot_mapping.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"slot_mapping must be int32 or int64, got {slot_mapping.dtype}")
    N = k.shape[0]
    if tuple(slot_mapping.shape) != (N,):
        raise ValueError(f"slot_mapping must have shape (N,) = ({N},), got {tuple(slot_mapping.shape)}")
    for name, t in (("v_cache", v_cache), ("k", k), ("v", v), ("slot_mapping", slot_mapping)):
        if t.device != k_cache.device:
            raise ValueError(f"{name} is on {t.device}, k_cache on {k_cache.device}: one device for all")
    slots = slot_mapping.detach().to("cpu", torch.int64)
    n_slots = num_blocks * block_size
    bad = ((slots < 0) | (slots >= n_slots)).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise ValueError(f"slot_mapping[{i}] = {int(slots[i])} outside [0, num_blocks * block_size) = [0, {n_slots})")
    if slots.unique().numel() != N:
        raise ValueError("slot_mapping names a slot twice: the order of the two writes would be undefined")
    return N, Hkv, D


def write_kv_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    """Scatter new tokens' K and V into the paged caches, in place: token n goes to slot
    ``slot_mapping[n]`` (block slot // block_size, offset slot % block_size). Shapes and errors
    as :func:`validate_write`; nothing is written when it raises."""
    N, Hkv, D = validate_write(k_cache, v_cache, k, v, slot_mapping)
    check_device(k_cache, "k_cache")
    if N == 0:
        return
    _write_kv_kernel[flat_grid(N)](
        k, v, k_cache, v_cache, slot_mapping, *k.stride(), *v.stride(), *k_cache.stride(), *v_cache.stride(),
        Hkv, D, PAGE=k_cache.shape[1], BLOCK_HKV=triton.next_power_of_2(Hkv), BLOCK_D=triton.next_power_of_2(D))


def write_kv_cache_torch(k_cache, v_cache, k, v, slot_mapping) -> None:
    """The same write in PyTorch (``index_copy_`` on the flattened caches): the oracle of
    :func:`write_kv_cache`."""
    validate_write(k_cache, v_cache, k, v, slot_mapping)
    num_blocks, block_size, Hkv, D = k_cache.shape
    idx = slot_mapping.to(torch.int64)
    k_cache.view(num_blocks * block_size, Hkv, D).index_copy_(0, idx, k)
    v_cache.view(num_blocks * block_size, Hkv, D).index_copy_(0, idx, v)


def implementations():
    """The Triton paged-decode kernel with the mixed-batch kernel of
    :mod:`inference_conformance.optimized.paged_attention.prefill` (the contract's ``paged_prefill``), both
    also in their batch-invariant mode ("triton_invariant", declared ``batch_invariant``), and the adapters of vLLM's
    and FlashInfer's paged decode (CUDA only) and of vLLM's CPU build (:mod:`inference_conformance.optimized.paged_attention.outside_vllm`),
    unavailable where their library is missing."""
    import sys
    import types

    from inference_conformance.conformance.registry import builtin
    from inference_conformance.optimized.paged_attention import outside_kernels as outside_adapters
    from inference_conformance.optimized.paged_attention import outside_vllm
    from inference_conformance.optimized.paged_attention import prefill as paged_prefill

    return (
        builtin("paged_attention", "triton",
                types.SimpleNamespace(paged_attention=paged_attention, paged_prefill=paged_prefill.paged_prefill),
                kernel_modules=(sys.modules[__name__], paged_prefill)),
        builtin("paged_attention", "triton_invariant",
                types.SimpleNamespace(paged_attention=paged_attention_invariant,
                                      paged_prefill=paged_prefill.paged_prefill_invariant),
                kernel_modules=(sys.modules[__name__], paged_prefill), batch_invariant=True, mode_of="triton"),
        builtin("paged_attention", "vllm", outside_adapters.vllm_paged, requires={"cuda"}, needs="vllm",
                adapter=True),
        builtin("paged_attention", "flashinfer", outside_adapters.flashinfer_paged, requires={"cuda"},
                needs="flashinfer", adapter=True),
        *outside_vllm.paged_registrations(),
    )


def compile_variants():
    """The decode kernel split (fp16) and unsplit with a float64 accumulator (GQA 16, D 64, at the
    tiles :func:`_tiles` gives that dtype on GPU), and the slot write."""
    from inference_conformance.optimized.triton_shared import CompileVariant

    out = []
    for dt, dtype, acc64, split in (("*fp16", torch.float16, False, True), ("*fp64", torch.float64, True, False)):
        block_h, block_n, block_d = _tiles(dtype, 16, 64)
        out.append(CompileVariant(
            f"paged_decode {dt[1:]} split={split}", _paged_decode_kernel,
            {"Q_ptr": dt, "K_ptr": dt, "V_ptr": dt, "BT_ptr": "*i32", "LENS_ptr": "*i32", "O_ptr": dt,
             "OP_ptr": "*fp32", "LSE_ptr": "*fp64", "scale": "fp32", "Cap_ptr": "*fp32" if not acc64 else "*fp64",
             "Sinks_ptr": "*fp32" if not acc64 else "*fp64"},
            dict(PAGE=16, SPLIT=split, ACC64=acc64, BLOCK_H=block_h, BLOCK_N=block_n, BLOCK_D=block_d,
                 HAS_WINDOW=not split, HAS_SOFTCAP=not split, HAS_SINKS=not split),   # the options unsplit
            min_for_loops=1))
    out.append(CompileVariant("paged write fp16", _write_kv_kernel,
                              {"K_ptr": "*fp16", "V_ptr": "*fp16", "KC_ptr": "*fp16", "VC_ptr": "*fp16", "SLOT_ptr": "*i64"},
                              dict(PAGE=16, BLOCK_HKV=8, BLOCK_D=64)))
    return out


def smoke_calls(device: str):
    """Decode over a shuffled block table (block size 16, lengths 300 and 5, GQA 4/2), float32,
    against the float64 reference over the same pages."""
    from inference_conformance.optimized.triton_shared import SmokeCall

    def run():
        from inference_conformance.conformance import tolerance
        from inference_conformance.conformance.contracts.paged_attention import cases
        from inference_conformance.reference.paged_attention import paged_attention as paged_ref

        (args, kw), = [c for c in cases(0, device) if c[0][0].dtype == torch.float32][:1]
        return tolerance.check_close(paged_attention(*args, **kw), paged_ref(*(a.double() if a.is_floating_point() else a
                                                                              for a in args), **kw))
    return [SmokeCall("paged_attention float32 (the contract's case)", run)]
