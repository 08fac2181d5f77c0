"""Weight-only quantized matmul in Triton: out = x @ dequantize(W).T with W dequantized in
registers, tile by tile, never written to memory (the ``triton`` implementation of the
``quantization`` contract; claim QT-9, and QT-10's kernel; lecture 001 §5.1–5.2).

The weight is the packed layout of ``optimized/quantization/__init__.py`` (:class:`PackedWeight`): codes
(N, ceil(K / per)) uint8, two 4-bit codes per byte (low nibble = the even k), four 2-bit codes,
or one code per byte for the other widths (int8 per channel is bits=8, granularity "channel");
scales (N, groups) float32 and zero points (N, groups) uint8 per group along K (one row (1, 1)
broadcast for "tensor"). Each program computes a (BLOCK_M, BLOCK_N) tile of out: for each
BLOCK_K slice of K it loads x's tile, the packed bytes of W's tile, shifts and masks out the
codes, subtracts the zero points and multiplies by the scales of each element's group (float32,
exact: code x scale has at most 24 significant bits), rounds to x's dtype (to nearest, as
``dequantize`` does; Triton's interpreter truncates float32 -> bfloat16 casts, so there the
rounding is done by hand) and accumulates ``tl.dot`` in float32.

Act-order (GPTQ, Frantar et al. 2023, checkpoints with ``desc_act=True``; claims QT-1, QT-9):
with ``g_idx`` (K,) int32/int64, column k belongs to group g_idx[k] instead of k // group_size.
The codes stay in column order; for each K tile both launches load g_idx for the tile's rows and
gather each row's scale and zero point by its group (one computed pointer per element, as vLLM's
GPTQ kernels do). The switch is the constexpr ``HAS_G_IDX``: without g_idx the kernels compile
the plain k // group_size path, unchanged.

Two launches, chosen by M in :func:`quant_matmul` (``path``):

- ``"gemv"`` (decode, M <= :data:`GEMV_MAX_M`): :func:`quant_gemv_kernel`. Each program owns a
  block of BLOCK_N outputs for all M rows (one 16-row tile) and streams one range of K (split-K:
  N / BLOCK_N column blocks x splits programs, on one grid axis, so that a product with few column blocks still fills the
  device: about four programs per SM on a GPU); it writes float32 partial sums (splits, M, N)
  that the host adds and rounds once to x's dtype.
- ``"tiled"`` (larger M): :func:`quant_matmul_kernel`, (BLOCK_M, BLOCK_N) tiles of 32 or 64 rows
  over all of K.

Both grids are 1-D (:func:`inference_conformance.optimized.triton_shared.flat_grid`): a count of column blocks on
CUDA's axis 1 would stop at 65,535 (N past 2M columns).

Supported: w float32 / float16 / bfloat16 (float64 raises NotImplementedError: no float64
``tl.dot``), bits 2..8, every granularity, symmetric (``SYMMETRIC``) or zero point
(``ASYMMETRIC``), with or without ``g_idx``; FP8 codes (E4M3fn, E5M2: ``number_format``, the
constexpr ``FP8``), one byte per weight bitcast to the format and scaled per group (QT-11;
the interpreter of Triton 3.6 and 3.9 handles the bitcast and the FP8 -> float32 cast); FP4 E2M1
codes (MXFP4, NVFP4: ``number_format`` "fp4_e2m1", FP8 = 3; QT-13), two nibbles a byte, each
decoded in registers from its bits (S EE M: (2 + M) 2^(EE - 2), or M / 2 for EE = 0) and
multiplied by its block's float32 scale (NVFP4: s_b s_t). The host wrapper :func:`quant_matmul` validates
x, the packed tensors' dtypes and shapes, the scales against the groups, bits, the group size
and g_idx before any launch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from inference_conformance.conformance.contracts.quantization import validate_bits, validate_matmul
from inference_conformance.conformance.device import triton_interpreted
from inference_conformance.optimized.triton_shared import (DOT_IEEE, DOT_NATIVE, DOT_UPCAST, dot_mode, flat_grid, output_tile,
                                                            round_to_bf16,
                                     sm_count, tile_loop)
from inference_conformance.reference.quantization import codes_per_byte

#: Dtypes the kernel takes for x (and w).
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: Rows up to which the decode launch (``path="gemv"``, split-K) runs; larger M is tiled.
GEMV_MAX_M = 16
#: (BLOCK_N, BLOCK_K) of the decode launch; its BLOCK_M is GEMV_MAX_M (the smallest tl.dot tile).
GEMV_BLOCKS = (64, 64)
#: number_format -> the kernels' FP8 constexpr (0: integer codes).
FP8_MODES = {"int": 0, "fp8_e4m3fn": 1, "fp8_e5m2": 2, "fp4_e2m1": 3}
#: Programs the decode launch aims for: per SM on a GPU, in all under the interpreter.
GEMV_PROGRAMS_PER_SM = 4
GEMV_PROGRAMS_INTERPRETED = 4


@triton.jit
def _wq_tile(acc, args, k0, CONSTS: tl.constexpr):
    """One BLOCK_K slice (a ``tile_loop`` body; CONSTS = (BITS, PER, BLOCK_K, DOT_MODE,
    HAS_G_IDX, FP8)): dequantize W's (BLOCK_N, BLOCK_K) tile in registers, acc += x W^T. Row k of the
    tile reads the scale and zero point of group g_idx[k] (act-order, HAS_G_IDX) or k // group_size.
    FP8 (1: E4M3fn, 2: E5M2) reads each byte as an FP8 number (bitcast), times its group's scale,
    no zero point."""
    (x_ptr, codes_ptr, scales_ptr, zeros_ptr, g_idx_ptr, offs_m, offs_n, m_mask, n_mask, K, group_size,
     stride_xm, stride_xk, stride_cn, stride_ck, stride_sn, stride_sg, stride_zn, stride_zg) = args
    BITS: tl.constexpr = CONSTS[0]
    PER: tl.constexpr = CONSTS[1]
    BLOCK_K: tl.constexpr = CONSTS[2]
    DOT_MODE: tl.constexpr = CONSTS[3]
    HAS_G_IDX: tl.constexpr = CONSTS[4]
    FP8: tl.constexpr = CONSTS[5]
    offs_k = k0 + tl.arange(0, BLOCK_K)
    k_mask = offs_k < K
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                mask=m_mask[:, None] & k_mask[None, :], other=0.0)
    nk = n_mask[:, None] & k_mask[None, :]
    byte = tl.load(codes_ptr + offs_n[:, None] * stride_cn + (offs_k // PER)[None, :] * stride_ck,
                   mask=nk, other=0)
    if HAS_G_IDX:          # act-order (GPTQ desc_act): gather each row's group, QT-1/QT-9
        g = tl.load(g_idx_ptr + offs_k, mask=k_mask, other=0).to(tl.int32)
    else:
        g = offs_k // group_size
    s = tl.load(scales_ptr + offs_n[:, None] * stride_sn + g[None, :] * stride_sg, mask=nk, other=0.0)
    if FP8 == 1:           # E4M3fn codes (QT-11): the byte is the number, times the group's scale
        w = byte.to(tl.float8e4nv, bitcast=True).to(tl.float32) * s
    elif FP8 == 2:         # E5M2 codes
        w = byte.to(tl.float8e5, bitcast=True).to(tl.float32) * s
    elif FP8 == 3:         # FP4 E2M1 nibbles (QT-13), low nibble = even k: S EE M
        nib = (byte.to(tl.int32) >> ((offs_k % 2) * 4)[None, :]) & 15
        e = (nib >> 1) & 3
        mag = tl.where(e == 0, nib & 1, (2 + (nib & 1)) << tl.maximum(e - 1, 0)).to(tl.float32) * 0.5
        w = tl.where(nib >= 8, -mag, mag) * s
    else:
        u = (byte.to(tl.int32) >> ((offs_k % PER) * BITS)[None, :]) & ((1 << BITS) - 1)  # low bits = first code
        z = tl.load(zeros_ptr + offs_n[:, None] * stride_zn + g[None, :] * stride_zg, mask=nk, other=0).to(tl.int32)
        w = (u - z).to(tl.float32) * s                                        # (BLOCK_N, BLOCK_K), exact
    if DOT_MODE == 0:      # DOT_NATIVE: 16-bit tiles (rounded to nearest), float32 accumulation
        acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc)
    elif DOT_MODE == 1:    # DOT_UPCAST: 16-bit under the interpreter, whose float32 -> bfloat16
        if x.dtype == tl.bfloat16:    # cast truncates: round to nearest even by hand instead
            w = round_to_bf16(w)
        else:
            w = w.to(x.dtype).to(tl.float32)
        acc = tl.dot(x.to(tl.float32), tl.trans(w), acc, input_precision="ieee")
    else:                  # DOT_IEEE: float32
        acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
    return acc


@triton.jit
def quant_matmul_kernel(x_ptr, codes_ptr, scales_ptr, zeros_ptr, g_idx_ptr, out_ptr, M, N, K, group_size,
                        stride_xm, stride_xk, stride_cn, stride_ck, stride_sn, stride_sg,
                        stride_zn, stride_zg, stride_om, stride_on,
                        BITS: tl.constexpr, PER: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, DOT_MODE: tl.constexpr, HAS_G_IDX: tl.constexpr,
                        FP8: tl.constexpr):
    """out[m, n] = sum_k x[m, k] * (u[n, k] - z[n, g(k)]) * s[n, g(k)], g(k) = g_idx[k] with
    HAS_G_IDX, else k // group_size (FP8: fp8(byte[n, k]) * s[n, g(k)])."""
    offs_m, offs_n, m_mask, n_mask = output_tile(M, N, BLOCK_M, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc = tile_loop(acc, (x_ptr, codes_ptr, scales_ptr, zeros_ptr, g_idx_ptr, offs_m, offs_n, m_mask, n_mask, K,
                          group_size, stride_xm, stride_xk, stride_cn, stride_ck, stride_sn, stride_sg, stride_zn,
                          stride_zg), 0, K, BLOCK_K, _wq_tile, (BITS, PER, BLOCK_K, DOT_MODE, HAS_G_IDX, FP8))
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on,
             acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def quant_gemv_kernel(x_ptr, codes_ptr, scales_ptr, zeros_ptr, g_idx_ptr, part_ptr, M, N, K, group_size, k_per_split,
                      stride_xm, stride_xk, stride_cn, stride_ck, stride_sn, stride_sg,
                      stride_zn, stride_zg, stride_ps, stride_pm, stride_pn,
                      BITS: tl.constexpr, PER: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, DOT_MODE: tl.constexpr, HAS_G_IDX: tl.constexpr,
                      FP8: tl.constexpr):
    """Decode (M <= BLOCK_M): program pid_n + tiles_n · pid_s of the 1-D grid writes
    part[pid_s, m, n] = sum over k in [pid_s * k_per_split, (pid_s + 1) * k_per_split) of
    x[m, k] * w[n, k], for all M rows and its BLOCK_N columns (k_per_split a multiple of
    BLOCK_K)."""
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid_n = tl.program_id(0) % tiles_n
    pid_s = tl.program_id(0) // tiles_n
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    k_lo = pid_s * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc = tile_loop(acc, (x_ptr, codes_ptr, scales_ptr, zeros_ptr, g_idx_ptr, offs_m, offs_n, m_mask, n_mask, K,
                          group_size, stride_xm, stride_xk, stride_cn, stride_ck, stride_sn, stride_sg, stride_zn,
                          stride_zg), k_lo, k_hi, BLOCK_K, _wq_tile, (BITS, PER, BLOCK_K, DOT_MODE, HAS_G_IDX, FP8))
    tl.store(part_ptr + pid_s * stride_ps + offs_m[:, None] * stride_pm + offs_n[None, :] * stride_pn,
             acc, mask=m_mask[:, None] & n_mask[None, :])


def _blocks(M: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) of the tiled launch: 32 rows up to M = 32, else 64."""
    return (32 if M <= 32 else 64), 32, 64


def gemv_splits(N: int, K: int, device: torch.device) -> tuple[int, int]:
    """(splits, k_per_split) of the decode launch: enough K ranges that N / BLOCK_N column
    blocks times the splits reach the target program count (GEMV_PROGRAMS_PER_SM per SM on a
    GPU, GEMV_PROGRAMS_INTERPRETED under the interpreter), each range whole BLOCK_K tiles."""
    bn, bk = GEMV_BLOCKS
    k_tiles = triton.cdiv(K, bk)
    if device.type == "cuda" and not triton_interpreted():
        target = GEMV_PROGRAMS_PER_SM * sm_count(device.index if device.index is not None else 0)
    else:
        target = GEMV_PROGRAMS_INTERPRETED
    want = max(1, min(k_tiles, triton.cdiv(target, triton.cdiv(N, bn))))
    k_per_split = triton.cdiv(k_tiles, want) * bk
    return triton.cdiv(K, k_per_split), k_per_split


def validate_g_idx(g_idx, *, K: int, groups: int, device: torch.device) -> None:
    """The kernel's check of an act-order ``g_idx``: a (K,) int32 or int64 tensor on the codes'
    device with every value in [0, groups). TypeError / ValueError naming ``g_idx`` (the values
    are read on the host: one device sync per call that passes a g_idx). That every group holds
    exactly group_size columns is quantize's check (the contract's ``validate_g_idx``); the
    kernel needs only the indices in range."""
    if not isinstance(g_idx, torch.Tensor):
        raise TypeError(f"g_idx must be a torch.Tensor (K,) of group indices or None, got {type(g_idx).__name__}")
    if g_idx.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"g_idx must be int32 or int64, got {g_idx.dtype}")
    if tuple(g_idx.shape) != (K,):
        raise ValueError(f"g_idx must have shape (K,) = ({K},), got {tuple(g_idx.shape)}")
    if g_idx.device != device:
        raise ValueError(f"g_idx is on {g_idx.device}, codes on {device}")
    lo, hi = (int(v) for v in torch.aminmax(g_idx))
    if lo < 0 or hi >= groups:
        raise ValueError(f"g_idx values must lie in [0, {groups}) (K // group_size groups), got {lo}..{hi}")


def quant_matmul(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, *,
                 bits: int, group_size: int, N: int, K: int, g_idx: torch.Tensor | None = None,
                 path: str | None = None, number_format: str = "int") -> torch.Tensor:
    """x (M, K) @ W.T for the packed W (N, K): codes (N, ceil(K / per)) uint8, scales (N or 1,
    K // group_size) float32, zeros the same shape uint8. Returns (M, N) in x's dtype.
    ``g_idx``: GPTQ's act-order group index (Frantar et al. 2023, ``desc_act``; claims QT-1,
    QT-9), (K,) int32/int64: column k uses the scale and zero point of group g_idx[k] (the
    kernels gather them per K row); None: group k // group_size (the plain path, unchanged).
    ``path``: "gemv" (decode launch, M <= GEMV_MAX_M), "tiled", or None: "gemv" when
    M <= GEMV_MAX_M, else "tiled". ``number_format`` "fp8_e4m3fn" / "fp8_e5m2" (QT-11): codes
    (N, K) uint8 are the bit patterns of that FP8 format (``inference_conformance.optimized.quantization.fp8.PackedFP8``),
    bits must be 8 and zeros None (no zero point); "fp4_e2m1" (QT-13): codes (N, ceil(K / 2))
    E2M1 nibbles, bits 4, zeros None, scales the blocks' float32 scales; "int" (the default).

    Raises TypeError (x's dtype outside float32/float16/bfloat16 (float64: NotImplementedError),
    codes or zeros not uint8, scales not float32, g_idx not an int32/int64 tensor) or ValueError
    (bits outside 2..8, group_size not dividing K, codes of the wrong shape, scales or zeros not
    matching the groups, x of the wrong shape or K, g_idx not (K,) or out of [0, K // group_size),
    tensors on different devices, an unknown path or "gemv" for M > GEMV_MAX_M), naming the
    argument, before any launch."""
    if path not in (None, "gemv", "tiled"):
        raise ValueError(f"path must be None, 'gemv' or 'tiled', got {path!r}")
    b = validate_bits(bits)
    if number_format not in FP8_MODES:
        raise ValueError(f"number_format must be one of {list(FP8_MODES)}, got {number_format!r}")
    fp8 = FP8_MODES[number_format]
    if fp8:
        if b != (4 if fp8 == 3 else 8):
            raise ValueError(f"bits must be {4 if fp8 == 3 else 8} for the format {number_format}, got {b}")
        if zeros is not None:
            raise ValueError(f"zeros must be None for the format {number_format} (no zero point)")
        zeros = torch.zeros(scales.shape if isinstance(scales, torch.Tensor) else (1, 1), dtype=torch.uint8,
                            device=codes.device if isinstance(codes, torch.Tensor) else "cpu")
    if not isinstance(group_size, int) or group_size < 1 or K % group_size:
        raise ValueError(f"group_size must be an int >= 1 dividing K = {K}, got {group_size!r}")
    for name, t in (("codes", codes), ("scales", scales), ("zeros", zeros)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if isinstance(x, torch.Tensor) and x.dtype == torch.float64:
        raise NotImplementedError("the Triton quantized matmul has no float64 path")
    if isinstance(x, torch.Tensor) and x.dtype not in KERNEL_DTYPES:
        raise TypeError(f"x has dtype {x.dtype}; the kernel takes float32, float16, bfloat16")
    validate_matmul(x, K=K, dtype=x.dtype if isinstance(x, torch.Tensor) else None, device=codes.device)
    if codes.dtype != torch.uint8:
        raise TypeError(f"codes must be uint8 (packed), got {codes.dtype}")
    if zeros.dtype != torch.uint8:
        raise TypeError(f"zeros must be uint8, got {zeros.dtype}")
    if scales.dtype != torch.float32:
        raise TypeError(f"scales must be float32, got {scales.dtype}")
    per = codes_per_byte(b)
    if tuple(codes.shape) != (N, -(-K // per)):
        raise ValueError(f"codes must have shape (N, ceil(K / {per})) = ({N}, {-(-K // per)}) for {b} bits, "
                         f"got {tuple(codes.shape)}")
    groups = K // group_size
    if scales.dim() != 2 or scales.shape[0] not in (1, N) or scales.shape[1] != groups:
        raise ValueError(f"scales must have shape (N, K // group_size) = ({N}, {groups}) or (1, 1) for one "
                         f"tensor-wide scale, got {tuple(scales.shape)}")
    if scales.shape[0] == 1 and N != 1 and groups != 1:
        raise ValueError(f"scales of one row (shape {tuple(scales.shape)}) need one group per row (group_size = K)")
    if tuple(zeros.shape) != tuple(scales.shape):
        raise ValueError(f"zeros must have the scales' shape {tuple(scales.shape)}, got {tuple(zeros.shape)}")
    for name, t in (("scales", scales), ("zeros", zeros)):
        if t.device != codes.device:
            raise ValueError(f"{name} is on {t.device}, codes on {codes.device}")
    if g_idx is not None:
        validate_g_idx(g_idx, K=K, groups=groups, device=codes.device)
    M = x.shape[0]
    path = path or ("gemv" if M <= GEMV_MAX_M else "tiled")
    if path == "gemv" and M > GEMV_MAX_M:
        raise ValueError(f"path 'gemv' takes M <= {GEMV_MAX_M} rows, x has M = {M}")
    mode = dot_mode(x.dtype)
    assert mode in (DOT_NATIVE, DOT_UPCAST, DOT_IEEE)
    row = 0 if scales.shape[0] == 1 else 1
    weight_args = (x.stride(0), x.stride(1), codes.stride(0), codes.stride(1),
                   scales.stride(0) * row, scales.stride(1), zeros.stride(0) * row, zeros.stride(1))
    # without g_idx the kernel never reads g_idx_ptr (HAS_G_IDX=False): codes stand in for it
    packed = (x, codes, scales, zeros, codes if g_idx is None else g_idx.contiguous())
    consts = dict(BITS=b, PER=per, DOT_MODE=mode, HAS_G_IDX=g_idx is not None, FP8=fp8)
    if path == "gemv":
        splits, k_per_split = gemv_splits(N, K, x.device)
        bn, bk = GEMV_BLOCKS
        part = torch.empty(splits, M, N, dtype=torch.float32, device=x.device)
        quant_gemv_kernel[flat_grid(triton.cdiv(N, bn), splits)](
            *packed, part, M, N, K, group_size, k_per_split, *weight_args,
            part.stride(0), part.stride(1), part.stride(2), BLOCK_M=GEMV_MAX_M, BLOCK_N=bn, BLOCK_K=bk, **consts)
        return (part[0] if splits == 1 else part.sum(dim=0)).to(x.dtype)
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    bm, bn, bk = _blocks(M)
    quant_matmul_kernel[flat_grid(triton.cdiv(M, bm), triton.cdiv(N, bn))](
        *packed, out, M, N, K, group_size, *weight_args, out.stride(0), out.stride(1),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, **consts)
    return out


def compile_variants():
    """The tiled launch at each dtype and bit width (act-order's int32 g_idx once), and the decode
    (split-K) launch; without g_idx the wrapper passes the codes as g_idx_ptr."""
    from inference_conformance.optimized.triton_shared import DOT_IEEE, DOT_NATIVE, CompileVariant

    out = []
    for dt, bits, per, bm, mode, act in (("*fp16", 4, 2, 16, DOT_NATIVE, False), ("*bf16", 8, 1, 64, DOT_NATIVE, False),
                                         ("*fp32", 4, 2, 32, DOT_IEEE, False), ("*fp16", 4, 2, 64, DOT_NATIVE, True)):
        out.append(CompileVariant(
            f"quant_matmul {dt[1:]} int{bits} BLOCK_M={bm}" + " g_idx" * act, quant_matmul_kernel,
            {"x_ptr": dt, "codes_ptr": "*u8", "scales_ptr": "*fp32", "zeros_ptr": "*u8",
             "g_idx_ptr": "*i32" if act else "*u8", "out_ptr": dt},
            dict(BITS=bits, PER=per, BLOCK_M=bm, BLOCK_N=64 if bm == 16 else 32, BLOCK_K=64, DOT_MODE=mode,
                 HAS_G_IDX=act, FP8=0), min_for_loops=1))
    for fp8, name in ((1, "fp8 e4m3"), (2, "fp8 e5m2"), (3, "fp4 e2m1")):
        out.append(CompileVariant(
            f"quant_matmul bf16 {name} BLOCK_M=32", quant_matmul_kernel,
            {"x_ptr": "*bf16", "codes_ptr": "*u8", "scales_ptr": "*fp32", "zeros_ptr": "*u8", "g_idx_ptr": "*u8",
             "out_ptr": "*bf16"},
            dict(BITS=4 if fp8 == 3 else 8, PER=2 if fp8 == 3 else 1, BLOCK_M=32, BLOCK_N=32, BLOCK_K=64,
                 DOT_MODE=DOT_NATIVE, HAS_G_IDX=False, FP8=fp8), min_for_loops=1))
    for dt, bits, per, act in (("*fp16", 4, 2, False), ("*bf16", 8, 1, False), ("*fp16", 4, 2, True)):
        out.append(CompileVariant(
            f"quant_gemv {dt[1:]} int{bits}" + " g_idx" * act, quant_gemv_kernel,
            {"x_ptr": dt, "codes_ptr": "*u8", "scales_ptr": "*fp32", "zeros_ptr": "*u8",
             "g_idx_ptr": "*i32" if act else "*u8", "part_ptr": "*fp32"},
            dict(BITS=bits, PER=per, BLOCK_M=GEMV_MAX_M, BLOCK_N=GEMV_BLOCKS[0], BLOCK_K=GEMV_BLOCKS[1],
                 DOT_MODE=DOT_NATIVE, HAS_G_IDX=act, FP8=0), min_for_loops=1))
    for fp8, name in ((1, "fp8 e4m3"), (3, "fp4 e2m1")):
        out.append(CompileVariant(
            f"quant_gemv bf16 {name}", quant_gemv_kernel,
            {"x_ptr": "*bf16", "codes_ptr": "*u8", "scales_ptr": "*fp32", "zeros_ptr": "*u8", "g_idx_ptr": "*u8",
             "part_ptr": "*fp32"},
            dict(BITS=4 if fp8 == 3 else 8, PER=2 if fp8 == 3 else 1, BLOCK_M=GEMV_MAX_M, BLOCK_N=GEMV_BLOCKS[0],
                 BLOCK_K=GEMV_BLOCKS[1], DOT_MODE=DOT_NATIVE, HAS_G_IDX=False, FP8=fp8), min_for_loops=1))
    return out


def smoke_calls(device: str):
    """int4 in groups of 32 at M = 1 (the decode launch) in bfloat16, int8 per channel at M = 20
    (tiled) in float32, FP8 E4M3 and FP4 (MXFP4 at M = 1, NVFP4 at M = 20), judged by the
    contract's quant-matmul rule."""
    from inference_conformance.optimized.triton_shared import SmokeCall

    def quant(bits, granularity, dtype, M):
        def run():
            from inference_conformance.conformance import tolerance
            from inference_conformance.reference import quantization as ref

            g = torch.Generator().manual_seed(0)
            w = torch.randn(40, 96, generator=g).to(device, dtype)
            x = torch.randn(M, 96, generator=g).to(device, dtype)
            qw = ref.quantize(w, bits=bits, granularity=granularity)   # the same packed codes
            zeros = ref.unpack(qw.zeros, bits, qw.groups).to(torch.uint8)
            out = quant_matmul(x, qw.codes, qw.scales.float(), zeros, bits=bits, group_size=qw.group_size,
                               N=qw.N, K=qw.K)
            d = ref.dequantize(qw)
            return tolerance.check_close(out, x.double() @ ref.dequantize64(qw).T, out_pt=x @ d.T,
                                         rule="quant-matmul")
        return run
    def fp8(M):
        def run():
            from inference_conformance.conformance import tolerance
            from inference_conformance.reference.quantization import fp8 as ref

            g = torch.Generator().manual_seed(0)
            w = torch.randn(40, 96, generator=g).to(device, torch.bfloat16)
            x = torch.randn(M, 96, generator=g).to(device, torch.bfloat16)
            qw = ref.quantize_fp8(w, bits=8, granularity="channel", fmt="fp8_e4m3fn")
            codes = qw.values.float().to(torch.float8_e4m3fn).view(torch.uint8)   # exact: values on the grid
            out = quant_matmul(x, codes, qw.scales.float(), None, bits=8, group_size=qw.group_size, N=qw.N, K=qw.K,
                               number_format="fp8_e4m3fn")
            d = ref.dequantize_fp8(qw)
            return tolerance.check_close(out, x.double() @ (qw.values * qw.scales).T, out_pt=x @ d.T,
                                         rule="quant-matmul")
        return run
    def fp4(fmt, M):   # QT-13: E2M1 nibbles decoded in registers, MXFP4 blocks of 32 / NVFP4 of 16
        def run():
            from inference_conformance.conformance import tolerance
            from inference_conformance.reference.quantization.fp4 import dequantize_fp4, element_scales, quantize_fp4

            g = torch.Generator().manual_seed(0)
            w, x = torch.randn(40, 96, generator=g), torch.randn(M, 96, generator=g)
            w, x = w.to(device, torch.bfloat16), x.to(device, torch.bfloat16)
            qw = quantize_fp4(w, bits=4, granularity=32 if fmt == "mxfp4" else 16, fmt=fmt)
            scales = element_scales(qw)[:, ::qw.group_size].float().to(device)        # (N, blocks): s_b * s_t
            out = quant_matmul(x, qw.codes, scales, None, bits=4, group_size=qw.group_size, N=40, K=96,
                               number_format="fp4_e2m1")
            d = dequantize_fp4(qw)
            return tolerance.check_close(out, x.double() @ d.double().T, out_pt=x @ d.T, rule="quant-matmul")
        return run
    return [SmokeCall("quant_matmul bfloat16 int4 g32 M=1", quant(4, 32, torch.bfloat16, 1)),
            SmokeCall("quant_matmul float32 int8 per channel M=20", quant(8, "channel", torch.float32, 20)),
            SmokeCall("quant_matmul bfloat16 fp8 e4m3 per channel M=1", fp8(1)),
            SmokeCall("quant_matmul bfloat16 mxfp4 M=1", fp4("mxfp4", 1)),
            SmokeCall("quant_matmul bfloat16 nvfp4 M=20", fp4("nvfp4", 20))]
