"""Vectorized PyTorch FP4 block quantization (QT-13; lecture 001 §5.4): :class:`PackedFP4`,
E2M1 codes two per byte (the even k in the low nibble, as ``optimized/quantization/packing.py``
packs 4-bit codes), block scales as their stored bytes (MXFP4: E8M0, NVFP4: E4M3fn) and NVFP4's
float32 tensor scale; the ``torch_mxfp4`` / ``torch_nvfp4`` schemes and the ``triton_*fp4``
schemes (:class:`TritonFP4Scheme`: this module's quantize, the Triton kernel's matmul, which
decodes the nibbles in registers). The formats and how each picks its scale are in
``conformance/contracts/quantization/fp4.py``; the float64 oracle in
``reference/quantization/fp4.py``.

The E2M1 code of q = w / s is found by comparison with the seven midpoints between grid values
(:func:`e2m1_codes`): a midpoint whose lower neighbour has the even code (0.25, 1.25, 2.5, 5)
sends a tie down, the others (0.75, 1.75, 3.5) up, and everything past 5 is code 7 (6, the
saturation). NVFP4's E4M3 block scale is rounded on E4M3's grid in float64 (the contract's
``round_to_grid``): torch's float64 -> float8_e4m3fn cast goes through float32 and rounds twice
(1 + 2^-4 + 2^-30 becomes 1.0, not 1.125).
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

import torch

from inference_conformance.conformance.contracts.quantization import validate_matmul, validate_quantize
from inference_conformance.conformance.contracts.quantization.fp4 import (
    E2M1_EMAX, E2M1_GRID, E2M1_MAX, E4M3_EMIN, E4M3_M, E4M3_MAX, E8M0_BIAS, E8M0_EMAX, E8M0_EMIN, fp4_format,
    round_to_grid)
from inference_conformance.optimized.quantization.packing import pack, unpack
from inference_conformance.reference.quantization.fp4 import FP4Scheme

#: (midpoint, a tie goes up) between E2M1 codes c and c + 1, c = 0..6.
MIDPOINTS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def e2m1_codes(q: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (int32, q's shape) of q (float64): the nearest value, ties to the even code,
    saturating at ±6; a value that rounds to zero keeps code 0 whatever its sign."""
    a = q.abs()
    mag = sum(((a >= m) if up else (a > m)).to(torch.int32) for m, up in MIDPOINTS)
    return torch.where((q < 0) & (mag > 0), mag + 8, mag)


def e2m1_values(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The values of E2M1 codes (any integer tensor), in ``dtype`` (exact)."""
    table = torch.tensor(E2M1_GRID + tuple(-v for v in E2M1_GRID), dtype=dtype, device=codes.device)
    return table[codes.to(torch.int64)]


@dataclass(frozen=True)
class PackedFP4:
    """The FP4 weight: ``codes`` (N, ceil(K / 2)) uint8 (two E2M1 codes a byte, even k low),
    ``scale_codes`` (N or 1, blocks) uint8 (MXFP4: E8M0, exponent + 127; NVFP4: the E4M3fn byte
    of the block scale), ``tensor_scale`` float32 () (NVFP4's s_t; 1 for MXFP4), ``fmt``,
    ``granularity``, ``group_size`` (the block along K), ``N``, ``K``, ``dtype`` (w's);
    ``kernel_scales`` (N or 1, blocks) float32, s_b * s_t rounded once, what the Triton kernel
    reads (computed at quantize; None: computed from the codes when needed)."""

    codes: torch.Tensor
    scale_codes: torch.Tensor
    tensor_scale: torch.Tensor
    fmt: str
    granularity: object
    group_size: int
    N: int
    K: int
    dtype: torch.dtype
    kernel_scales: torch.Tensor | None = None

    def block_scales(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """(N or 1, blocks) in ``dtype``: the stored block scale times the tensor scale (float64:
        exact; float32: the product rounded once)."""
        if self.fmt == "mxfp4":
            ones = torch.ones(self.scale_codes.shape, dtype=torch.float64, device=self.codes.device)
            sb = torch.ldexp(ones, self.scale_codes.to(torch.int32) - E8M0_BIAS)
        else:
            sb = self.scale_codes.view(torch.float8_e4m3fn).to(torch.float64)
        return (sb * self.tensor_scale.to(torch.float64)).to(dtype)


def quantize_fp4(w: torch.Tensor, *, bits: int, granularity, fmt: str) -> PackedFP4:
    """FP4 quantization of w (N, K) at once (the contract's scale rule per block, codes
    :func:`e2m1_codes` of w / s in float64). bits must be 4 (NotImplementedError otherwise,
    after validating). Raises as validate_quantize; ValueError naming ``number_format``."""
    shape = validate_quantize(w, bits, granularity)
    f = fp4_format(fmt)
    if shape.bits != 4:
        raise NotImplementedError(f"an FP4 scheme stores 4 bits; bits={bits} is not one of its formats")
    N, K = shape.N, shape.K
    w64 = w.detach().to(torch.float64)
    grp = w64.reshape(1, 1, N * K) if granularity == "tensor" else w64.reshape(N, K // shape.group_size, shape.group_size)
    amax = grp.abs().amax(dim=-1)
    if f.scale == "e8m0":
        _, e = torch.frexp(amax)
        x = torch.where(amax > 0, e.to(torch.int32) - 1 - E2M1_EMAX, E8M0_EMIN).clamp(E8M0_EMIN, E8M0_EMAX)
        s = torch.ldexp(torch.ones_like(amax), x)
        scale_codes = (x + E8M0_BIAS).to(torch.uint8)
        st = torch.ones((), dtype=torch.float32, device=w.device)
    else:
        f32 = torch.finfo(torch.float32)
        st = (w64.abs().amax() / (E2M1_MAX * E4M3_MAX)).clamp(f32.tiny, f32.max).to(torch.float32)
        sb = round_to_grid(amax / (E2M1_MAX * st.double()), E4M3_M, E4M3_EMIN, E4M3_MAX)
        s = sb * st.double()
        scale_codes = sb.to(torch.float32).to(torch.float8_e4m3fn).view(torch.uint8)   # exact: sb on the grid
    q = torch.where(s[..., None] > 0, grp / torch.where(s > 0, s, 1.0)[..., None], 0.0)
    codes = pack(e2m1_codes(q).reshape(N, K), 4)
    qw = PackedFP4(codes, scale_codes, st, f.name, granularity, shape.group_size, N, K, w.dtype)
    return dataclasses.replace(qw, kernel_scales=qw.block_scales(torch.float32))


def check_fp4(qw) -> PackedFP4:
    """TypeError unless ``qw`` is a :class:`PackedFP4`."""
    if not isinstance(qw, PackedFP4):
        raise TypeError(f"qw must be an inference_conformance.optimized.quantization.fp4.PackedFP4 (what quantize returned), got "
                        f"{type(qw).__name__}")
    return qw


def element_scales(qw: PackedFP4, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """(N, K): each element's block scale (:meth:`PackedFP4.block_scales`)."""
    s = qw.block_scales(dtype)
    return s.expand(qw.N, qw.K) if qw.granularity == "tensor" else s.repeat_interleave(qw.group_size, dim=1)


def dequantize_fp4(qw: PackedFP4) -> torch.Tensor:
    """(N, K) in w's dtype: code value x scale in float64 (exact), rounded once."""
    qw = check_fp4(qw)
    return (e2m1_values(unpack(qw.codes, 4, qw.K), torch.float64) * element_scales(qw)).to(qw.dtype)


def matmul_fp4(x: torch.Tensor, qw: PackedFP4) -> torch.Tensor:
    """x (M, K) @ dequantize_fp4(qw).T in x's dtype (torch.matmul; validate_matmul)."""
    qw = check_fp4(qw)
    validate_matmul(x, K=qw.K, dtype=qw.dtype, device=qw.codes.device)
    return x @ dequantize_fp4(qw).T


MXFP4 = FP4Scheme("mxfp4", sys.modules[__name__])
NVFP4 = FP4Scheme("nvfp4", sys.modules[__name__])


class TritonFP4Scheme:
    """The ``triton_mxfp4`` / ``triton_nvfp4`` implementations: quantize and dequantize as
    :func:`quantize_fp4`, matmul by the Triton kernels of
    :func:`inference_conformance.optimized.quantization.quant_matmul.quant_matmul` with number_format
    "fp4_e2m1" (each nibble decoded to its E2M1 value in registers, times the block's float32
    scale s_b * s_t). quantize and dequantize take float64 weights (they are the torch scheme's);
    matmul refuses float64 (NotImplementedError, no float64 ``tl.dot``) after validating x."""

    symmetric = True

    def __init__(self, fmt: str):
        self.number_format = fp4_format(fmt).name

    def quantize(self, w, *, bits, granularity):
        return quantize_fp4(w, bits=bits, granularity=granularity, fmt=self.number_format)

    def dequantize(self, qw):
        return dequantize_fp4(qw)

    def matmul(self, x, qw):
        from inference_conformance.optimized.quantization.quant_matmul import quant_matmul

        qw = check_fp4(qw)
        validate_matmul(x, K=qw.K, dtype=qw.dtype, device=qw.codes.device)
        if x.dtype == torch.float64:
            raise NotImplementedError("the Triton quantized matmul has no float64 path (no float64 tl.dot)")
        s = qw.kernel_scales if qw.kernel_scales is not None else qw.block_scales(torch.float32)
        return quant_matmul(x, qw.codes, s, None, bits=4, group_size=qw.group_size,
                            N=qw.N, K=qw.K, number_format="fp4_e2m1")

    def __repr__(self) -> str:
        return f"inference_conformance.optimized.quantization.fp4.TritonFP4Scheme({self.number_format!r})"


TRITON_MXFP4 = TritonFP4Scheme("mxfp4")


TRITON_NVFP4 = TritonFP4Scheme("nvfp4")
