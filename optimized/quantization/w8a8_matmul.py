"""W8A8 matmul in Triton: int8 activations x int8 weights with an int32 accumulator, the scales
applied once in the epilogue (claim QT-6's W8A8 product; lecture 001 §5.3; Dettmers et al. 2022,
Xiao et al. 2023).

    out[m, n] = (sum_k x_q[m, k] * w_q[n, k]) * x_scales[m] * w_scales[n]

- Activations are quantized dynamically per token (:func:`quantize_activations`): s_m =
  max_k |x[m, k]| / 127 (1 for an all-zero row), x_q = round(x / s_m) clamped to [-127, 127],
  computed in float64 on the host so that the codes are exactly those of
  ``inference_conformance.reference.quantization.methods.fake_quantize_activations(x, 8, "token")``.
- Weights are quantized per output channel (:func:`quantize_weight`), the same formula along
  each row n of w (N, K): the codes of ``inference_conformance.reference.quantization.methods.fake_quantize_weight(w, 8)``.
- The kernel (:func:`w8a8_matmul`) multiplies (BLOCK_M, BLOCK_K) x (BLOCK_K, BLOCK_N) int8 tiles
  with ``tl.dot`` into an int32 accumulator: exact for |sum| < 2^31, i.e. for any K up to
  2^31 / 128^2 = 131072 (an int16 or float16 accumulator overflows from K = 5 at ±127 and
  rounds integers above 2048). The epilogue converts it to float32 and multiplies by the row's
  and the column's float32 scales (three roundings of 2^-24 each), then rounds once to the
  output dtype. ``out_dtype=torch.int32`` returns the accumulator itself (scales not read).

:func:`w8a8_linear` composes the two for a float x (M, K) and a quantized weight: the output is
(M, N) in x's dtype. The host wrapper validates dtypes (int8 codes, float32 scales), shapes,
scale shapes, strides (K contiguous, scales contiguous) and devices before any launch,
raising TypeError / ValueError naming the argument.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from inference_conformance.conformance.device import triton_interpreted
from inference_conformance.optimized.triton_shared import check_device, flat_grid, output_tile, round_to_bf16, tile_loop

#: Largest int8 code of the symmetric scheme (-128 is never produced by the quantizers).
QMAX = 127
#: Dtypes of x and of the scaled output.
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: Largest K whose int32 accumulator cannot overflow: K * 128 * 128 < 2^31.
MAX_K = 2 ** 31 // (128 * 128)


@triton.jit
def w8a8_matmul_kernel(xq_ptr, wq_ptr, xs_ptr, ws_ptr, out_ptr, M, N, K,
                       stride_xm, stride_xk, stride_wn, stride_wk, stride_om, stride_on,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       SCALED: tl.constexpr, ROUND_BF16: tl.constexpr):
    """out[m, n] = (sum_k xq[m, k] wq[n, k]) (int32), times xs[m] ws[n] when SCALED."""
    offs_m, offs_n, m_mask, n_mask = output_tile(M, N, BLOCK_M, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    acc = tile_loop(acc, (xq_ptr, wq_ptr, offs_m, offs_n, m_mask, n_mask, K, stride_xm, stride_xk, stride_wn,
                          stride_wk), 0, K, BLOCK_K, _int8_tile, (BLOCK_K,))
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    mask = m_mask[:, None] & n_mask[None, :]
    if SCALED:       # epilogue: the row's (token's) scale and the column's (channel's) scale
        xs = tl.load(xs_ptr + offs_m, mask=m_mask, other=0.0)
        ws = tl.load(ws_ptr + offs_n, mask=n_mask, other=0.0)
        out = acc.to(tl.float32) * xs[:, None] * ws[None, :]
        if ROUND_BF16:   # the interpreter's float32 -> bfloat16 cast truncates: round by hand
            out = round_to_bf16(out)
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(out_ptrs, acc, mask=mask)


@triton.jit
def _int8_tile(acc, args, k0, CONSTS: tl.constexpr):
    """acc += xq[offs_m, k0:k0+BLOCK_K] @ wq[offs_n, k0:k0+BLOCK_K]^T, int8 x int8 -> int32 (a
    ``tile_loop`` body; CONSTS = (BLOCK_K,))."""
    xq_ptr, wq_ptr, offs_m, offs_n, m_mask, n_mask, K, stride_xm, stride_xk, stride_wn, stride_wk = args
    BLOCK_K: tl.constexpr = CONSTS[0]
    offs_k = k0 + tl.arange(0, BLOCK_K)
    k_mask = offs_k < K
    x = tl.load(xq_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                mask=m_mask[:, None] & k_mask[None, :], other=0)
    w = tl.load(wq_ptr + offs_n[:, None] * stride_wn + offs_k[None, :] * stride_wk,
                mask=n_mask[:, None] & k_mask[None, :], other=0)
    return tl.dot(x, tl.trans(w), acc, out_dtype=tl.int32)


def _absmax_int8(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of t (R, K): codes round(t / s) in [-127, 127] int8 and s = max|row| / 127 (1 for
    an all-zero row) float32 (R,), computed in float64 (the reference's codes exactly). A row
    holding NaN or inf gets a NaN or inf scale, so its products come out non-finite, never as
    finite garbage."""
    t64 = t.detach().to(torch.float64)
    amax = t64.abs().amax(dim=-1, keepdim=True)
    s = torch.where(amax == 0, torch.ones_like(amax), amax / QMAX)
    q = torch.round(t64 / s).clamp(-QMAX, QMAX).to(torch.int8)
    return q, s[:, 0].to(torch.float32)


def _check_float2d(name: str, t, *, finite: bool) -> None:
    """Type, dtype and shape of ``t``; with ``finite``, also its values (a device round trip:
    for weights, quantized once, not for the activations of every forward)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} has dtype {t.dtype}; expected float32, float16 or bfloat16")
    if t.dim() != 2 or t.shape[0] < 1 or t.shape[1] < 1:
        raise ValueError(f"{name} must be a non-empty 2-D tensor, got shape {tuple(t.shape)}")
    if finite and not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} must be finite (no NaN or inf)")


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token int8 quantization of x (M, K) float32/float16/bfloat16: returns (x_q
    (M, K) int8, x_scales (M,) float32). Raises TypeError / ValueError naming ``x``. Its values
    are not checked (no device round trip per forward): a token row with NaN or inf gets a
    non-finite scale, and its output row is non-finite, as a float matmul's would be."""
    _check_float2d("x", x, finite=False)
    return _absmax_int8(x)


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel int8 quantization of a Linear weight w (N, K): returns (w_q (N, K)
    int8, w_scales (N,) float32). Raises TypeError / ValueError naming ``w``."""
    _check_float2d("w", w, finite=True)
    return _absmax_int8(w)


def validate(x_q, x_scales, w_q, w_scales, out_dtype) -> tuple[int, int, int]:
    """Check a :func:`w8a8_matmul` call; return (M, N, K). TypeError: a non-tensor, codes not
    int8, scales not float32, out_dtype outside int32/float32/float16/bfloat16. ValueError:
    codes not 2-D or empty, K differing or above :data:`MAX_K`, scales not of shape (M,) / (N,),
    codes whose K is not contiguous (stride 1), scales not contiguous, tensors on different
    devices. Each message names the argument."""
    for name, t in (("x_q", x_q), ("x_scales", x_scales), ("w_q", w_q), ("w_scales", w_scales)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if out_dtype not in FLOAT_DTYPES + (torch.int32,):
        raise TypeError(f"out_dtype must be torch.int32 (the accumulator) or float32/float16/bfloat16, got {out_dtype}")
    for name, t in (("x_q", x_q), ("w_q", w_q)):
        if t.dtype != torch.int8:
            raise TypeError(f"{name} must be int8 codes, got {t.dtype}")
        if t.dim() != 2 or t.shape[0] < 1 or t.shape[1] < 1:
            raise ValueError(f"{name} must be a non-empty 2-D tensor, got shape {tuple(t.shape)}")
        if t.stride(1) != 1 and t.shape[1] > 1:
            raise ValueError(f"{name} must be contiguous along K (stride(1) == 1), got strides {t.stride()}; "
                             "call .contiguous()")
    (M, K), (N, Kw) = x_q.shape, w_q.shape
    if Kw != K:
        raise ValueError(f"w_q has K = {Kw} columns; x_q has K = {K}")
    if K > MAX_K:
        raise ValueError(f"K = {K} exceeds {MAX_K}: the int32 accumulator could overflow")
    for name, t, rows in (("x_scales", x_scales, M), ("w_scales", w_scales, N)):
        if t.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {t.dtype}")
        if tuple(t.shape) != (rows,):
            raise ValueError(f"{name} must have shape ({rows},) (one scale per "
                             f"{'token' if name == 'x_scales' else 'output channel'}), got {tuple(t.shape)}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous, got stride {t.stride()}")
    for name, t in (("x_scales", x_scales), ("w_q", w_q), ("w_scales", w_scales)):
        if t.device != x_q.device:
            raise ValueError(f"{name} is on {t.device}, x_q on {x_q.device}")
    return int(M), int(N), int(K)


def _blocks(M: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K): 16 rows for decode, 64 beyond; K tiles of 64 int8 values."""
    return (16, 64, 64) if M <= 16 else (64, 64, 64)


def w8a8_matmul(x_q: torch.Tensor, x_scales: torch.Tensor, w_q: torch.Tensor, w_scales: torch.Tensor, *,
                out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x_q (M, K) int8 @ w_q (N, K) int8 ^T with an int32 accumulator -> (M, N): the accumulator
    itself for ``out_dtype=torch.int32``, else acc * x_scales[:, None] * w_scales[None, :] in
    ``out_dtype`` (float32, float16 or bfloat16). x_scales (M,) and w_scales (N,) float32.
    Raises TypeError / ValueError (:func:`validate`) before any launch."""
    M, N, K = validate(x_q, x_scales, w_q, w_scales, out_dtype)
    check_device(x_q)
    out = torch.empty(M, N, dtype=out_dtype, device=x_q.device)
    bm, bn, bk = _blocks(M)
    grid = flat_grid(triton.cdiv(M, bm), triton.cdiv(N, bn))
    w8a8_matmul_kernel[grid](
        x_q, w_q, x_scales, w_scales, out, M, N, K,
        x_q.stride(0), x_q.stride(1), w_q.stride(0), w_q.stride(1), out.stride(0), out.stride(1),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SCALED=out_dtype != torch.int32,
        ROUND_BF16=out_dtype == torch.bfloat16 and triton_interpreted())
    return out


def w8a8_linear(x: torch.Tensor, w_q: torch.Tensor, w_scales: torch.Tensor) -> torch.Tensor:
    """W8A8 Linear: x (M, K) float32/float16/bfloat16 quantized per token, times the int8
    weight (w_q, w_scales) of :func:`quantize_weight`; returns (M, N) in x's dtype. Raises as
    :func:`quantize_activations` and :func:`w8a8_matmul`."""
    x_q, x_scales = quantize_activations(x)
    return w8a8_matmul(x_q, x_scales, w_q, w_scales, out_dtype=x.dtype)


def w8a8_matmul_torch(x_q, x_scales, w_q, w_scales, *, out_dtype=torch.float32) -> torch.Tensor:
    """The same product in PyTorch (the accumulator in float64, exact for K <= 2^53 / 128^2; the
    epilogue in float32 as the kernel's), for comparisons and the CPU benchmark."""
    validate(x_q, x_scales, w_q, w_scales, out_dtype)
    acc = (x_q.to(torch.float64) @ w_q.to(torch.float64).T).to(torch.int32)
    if out_dtype == torch.int32:
        return acc
    return (acc.to(torch.float32) * x_scales[:, None] * w_scales[None, :]).to(out_dtype)


class Product:
    """A W8A8 product as the laws of ``properties/quantization/test_quant_kernels.py`` call it:
    ``quantize_activations(x)``, ``quantize_weight(w)`` and ``w8a8_matmul(x_q, x_scales, w_q,
    w_scales, *, out_dtype)``, the last one the Triton kernel or its PyTorch twin."""

    def __init__(self, name: str, matmul):
        self.name, self._matmul = name, matmul

    quantize_activations = staticmethod(quantize_activations)
    quantize_weight = staticmethod(quantize_weight)

    def w8a8_matmul(self, x_q, x_scales, w_q, w_scales, *, out_dtype=torch.float32):
        return self._matmul(x_q, x_scales, w_q, w_scales, out_dtype=out_dtype)

    def __repr__(self) -> str:
        return f"inference_conformance.optimized.quantization.w8a8_matmul.Product({self.name!r})"


TRITON = Product("triton", w8a8_matmul)
TORCH = Product("torch", w8a8_matmul_torch)


def compile_variants():
    """The int32 accumulator output and the scaled bfloat16 output."""
    from inference_conformance.optimized.triton_shared import CompileVariant

    return [CompileVariant(f"w8a8_matmul out {out[1:]} BLOCK_M={bm}", w8a8_matmul_kernel,
                           {"xq_ptr": "*i8", "wq_ptr": "*i8", "xs_ptr": "*fp32", "ws_ptr": "*fp32", "out_ptr": out},
                           dict(BLOCK_M=bm, BLOCK_N=64, BLOCK_K=64, SCALED=out != "*i32", ROUND_BF16=False), min_for_loops=1)
            for out, bm in (("*i32", 16), ("*bf16", 64))]


def smoke_calls(device: str):
    """The int32 accumulator exactly against the int64 product at K = 300, and the bfloat16
    W8A8 Linear against the float64 fake-quantized product."""
    from inference_conformance.optimized.triton_shared import SmokeCall

    def accumulator():
        from inference_conformance.conformance import tolerance

        g = torch.Generator().manual_seed(0)
        x_q = torch.randint(-127, 128, (3, 300), generator=g, dtype=torch.int8).to(device)
        w_q = torch.randint(-127, 128, (40, 300), generator=g, dtype=torch.int8).to(device)
        ones = torch.ones(40, device=device)
        acc = w8a8_matmul(x_q, ones[:3], w_q, ones, out_dtype=torch.int32)
        return tolerance.check_exact(acc.cpu().long(), x_q.cpu().long() @ w_q.cpu().long().T)

    def linear():
        from inference_conformance.conformance import tolerance
        from inference_conformance.reference.quantization.methods import fake_quantize_activations, fake_quantize_weight

        g = torch.Generator().manual_seed(0)
        x = torch.randn(3, 96, generator=g).to(device, torch.bfloat16)
        w = torch.randn(40, 96, generator=g).to(device, torch.bfloat16)
        out = w8a8_linear(x, *quantize_weight(w))
        return tolerance.check_close(out, fake_quantize_activations(x.double(), 8, "token")
                                     @ fake_quantize_weight(w.double(), 8).T)
    return [SmokeCall("w8a8_matmul int32 accumulator M=3 K=300", accumulator),
            SmokeCall("w8a8_matmul bfloat16 M=3", linear)]
