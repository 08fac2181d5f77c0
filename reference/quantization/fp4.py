"""Reference FP4 block quantization (QT-13; lecture 001 §5.4): E2M1 values with a scale per
block, MXFP4 and NVFP4, computed in float64 block by block. The FP4 oracle of the
``quantization`` contract (``conformance/contracts/quantization/fp4.py`` states the formats).

How each format picks its block scale (amax = max |w| over the block):

- MXFP4 (OCP Microscaling Formats (MX) Specification v1.0, 2023, §6.3, the conversion of a
  block of 32 to MX): the shared exponent floor(log2(amax)) - emax_elem, emax_elem = 2 for FP4
  E2M1, clamped to E8M0's -127..127 (an all-zero block: -127); the scale X = 2^exponent is
  stored as the E8M0 byte exponent + 127. Values above 6 X saturate (the spec's clipping).
- NVFP4 (NVIDIA's Blackwell format, blocks of 16; the recipe of TensorRT Model Optimizer and
  compressed-tensors): a float32 tensor scale s_t = float32(amax_tensor / (6 * 448)) (clamped to
  float32's normal range), and an E4M3fn block scale s_b = e4m3(amax_block / (6 s_t)) (quotient
  in float64, rounded to nearest even by :func:`inference_conformance.reference.quantization.fp8.fp8_cast`,
  saturating at 448), stored as its E4M3fn byte; the block's scale is s_b * s_t.

Each value w / s (float64) goes to the nearest of E2M1's 15 values (:func:`e2m1_round`, by
distance to every grid value: ties to the code whose mantissa bit is 0, saturating at ±6 as the
nearest value past 6); codes ``S EE M`` packed two per byte, the even k in the low nibble
(:func:`pack_nibbles`, the 4-bit layout of the integer schemes). dequantize: code value
x s in float64, rounded once to w's dtype.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from inference_conformance.conformance.contracts.quantization import validate_matmul, validate_quantize
from inference_conformance.conformance.contracts.quantization.fp4 import (
    E2M1_EMAX, E2M1_GRID, E2M1_MAX, E4M3_MAX, E8M0_BIAS, E8M0_EMAX, E8M0_EMIN, fp4_format)
from inference_conformance.reference.quantization.fp8 import FormatScheme, fp8_cast

#: E2M1's 16 codes' values (code 8 is -0).
E2M1_VALUES = torch.tensor(E2M1_GRID + tuple(-v for v in E2M1_GRID), dtype=torch.float64)


def pack_nibbles(u: torch.Tensor) -> torch.Tensor:
    """Codes (R, L) in 0..15 -> (R, ceil(L / 2)) uint8: element 2i in the low nibble of byte i,
    2i + 1 in the high one (odd L: the last high nibble is 0)."""
    u = torch.nn.functional.pad(u.to(torch.int64), (0, u.shape[1] % 2))
    return (u[:, 0::2] | (u[:, 1::2] << 4)).to(torch.uint8)


def unpack_nibbles(packed: torch.Tensor, L: int) -> torch.Tensor:
    """Inverse of :func:`pack_nibbles`: (R, ceil(L / 2)) uint8 -> (R, L) int64."""
    p = packed.to(torch.int64)
    return torch.stack((p & 15, p >> 4), dim=-1).reshape(p.shape[0], -1)[:, :L]


def e4m3_value(code: int) -> float:
    """The E4M3fn byte's value (0x7F / 0xFF are NaN): 2^(e - 7) (1 + m / 8), or m / 8 * 2^-6
    for e = 0."""
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 0xF, code & 0x7
    if e == 15 and m == 7:
        return float("nan")
    return sign * (m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))


#: E4M3fn's non-negative finite values, index = code (0..126).
E4M3_POSITIVE = [e4m3_value(c) for c in range(127)]


def e2m1_round(q: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (int64, q's shape) of q (float64, in units of the block scale): the nearest
    of the 15 values; at equal distance the code with mantissa bit 0 (ties to even); past ±6
    the nearest is ±6 (saturation: q is clamped to ±6 first, as the distances to a q of 1e300
    would all round to one float64). NaN is not an input (the contract's w is finite)."""
    codes = torch.tensor([c for c in range(16) if c != 8])                 # one zero
    q = q.to(torch.float64).clamp(-E2M1_MAX, E2M1_MAX)
    d = (q[..., None] - E2M1_VALUES[codes]).abs()                          # (..., 15), exact
    best = d.min(dim=-1, keepdim=True).values
    even = (codes & 1) == 0
    pick = torch.where((d == best) & even, 0, torch.where(d == best, 1, 2))  # nearest, even first
    return codes[pick.argmin(dim=-1)]


@dataclass(frozen=True)
class FP4Weight:
    """The reference's FP4 weight: ``codes`` (N, ceil(K / 2)) uint8, two E2M1 codes per byte
    (even k low); ``scale_codes`` (N or 1, blocks) uint8 (MXFP4: E8M0, the exponent + 127;
    NVFP4: the E4M3fn byte of s_b); ``tensor_scale`` (float, the float32 s_t; 1.0 for MXFP4);
    ``fmt``, ``granularity``, ``group_size`` (the block along K; K for "channel" and "tensor"),
    ``N``, ``K``, ``dtype`` (w's)."""

    codes: torch.Tensor
    scale_codes: torch.Tensor
    tensor_scale: float
    fmt: str
    granularity: object
    group_size: int
    N: int
    K: int
    dtype: torch.dtype


def block_scale(v: torch.Tensor, fmt: str, tensor_scale: float) -> tuple[float, int]:
    """(scale s, its stored byte) of one block v (float64) as the module docstring states."""
    amax = float(v.abs().max())
    if fmt == "mxfp4":
        e = E8M0_EMIN if amax == 0 else min(max(math.frexp(amax)[1] - 1 - E2M1_EMAX, E8M0_EMIN), E8M0_EMAX)
        return 2.0 ** e, e + E8M0_BIAS
    sb = float(fp8_cast(torch.tensor(amax / (E2M1_MAX * tensor_scale), dtype=torch.float64), "fp8_e4m3fn"))
    return sb * tensor_scale, E4M3_POSITIVE.index(sb)


def quantize_fp4(w: torch.Tensor, *, bits: int, granularity, fmt: str) -> FP4Weight:
    """FP4 quantization of w (N, K) (QT-13): per block, the scale of the module docstring, codes
    e2m1_round(w / s) (zero where s = 0). bits must be 4 (NotImplementedError otherwise, after
    validating the call). Raises TypeError/ValueError as the contract's validate_quantize, and
    ValueError naming ``number_format`` for an unknown format."""
    shape = validate_quantize(w, bits, granularity)
    f = fp4_format(fmt)
    if shape.bits != 4:
        raise NotImplementedError(f"an FP4 scheme stores 4 bits; bits={bits} is not one of its formats")
    w64 = w.detach().to("cpu", torch.float64)
    N, K, g = shape.N, shape.K, shape.group_size
    st = 1.0
    if f.tensor_scale:
        amax = float(w64.abs().max()) / (E2M1_MAX * E4M3_MAX)
        st = float(torch.tensor(amax, dtype=torch.float64).clamp(torch.finfo(torch.float32).tiny,
                                                               torch.finfo(torch.float32).max).float())
    blocks = [w64.reshape(-1)] if granularity == "tensor" else [w64[n, j * g:(j + 1) * g] for n in range(N)
                                                                 for j in range(K // g)]
    u = torch.zeros(len(blocks), blocks[0].numel(), dtype=torch.int64)
    sc = torch.zeros(len(blocks), dtype=torch.int64)
    for i, v in enumerate(blocks):
        s, sc[i] = block_scale(v, f.name, st)
        if s > 0:
            u[i] = e2m1_round(v / s)
    rows = 1 if granularity == "tensor" else N
    return FP4Weight(pack_nibbles(u.reshape(N, K)).to(w.device), sc.reshape(rows, -1).to(torch.uint8).to(w.device),
                     st, f.name, granularity, g, N, K, w.dtype)


def _check_fp4(qw) -> FP4Weight:
    if not isinstance(qw, FP4Weight):
        raise TypeError(f"qw must be a inference_conformance.reference.quantization.fp4.FP4Weight (what quantize returned), got "
                        f"{type(qw).__name__}")
    return qw


def element_scales(qw: FP4Weight) -> torch.Tensor:
    """Every element's scale (N, K) float64: the block's stored scale (E8M0: 2^(code - 127);
    E4M3: the byte's value) times the tensor scale."""
    c = qw.scale_codes.to("cpu", torch.int64)
    if qw.fmt == "mxfp4":
        s = torch.ldexp(torch.ones(c.shape, dtype=torch.float64), (c - E8M0_BIAS).to(torch.int32))
    else:
        s = torch.tensor(E4M3_POSITIVE, dtype=torch.float64)[c] * qw.tensor_scale
    return s.expand(qw.N, qw.K) if qw.granularity == "tensor" else s.repeat_interleave(qw.group_size, dim=1)


def dequantize64(qw: FP4Weight) -> torch.Tensor:
    """(N, K) float64 on the CPU: code value x scale (exact)."""
    qw = _check_fp4(qw)
    return E2M1_VALUES[unpack_nibbles(qw.codes.cpu(), qw.K)] * element_scales(qw)


def dequantize_fp4(qw: FP4Weight) -> torch.Tensor:
    """(N, K) in w's dtype on w's device: :func:`dequantize64` rounded once."""
    return dequantize64(qw).to(qw.dtype).to(_check_fp4(qw).codes.device)


def matmul_fp4(x: torch.Tensor, qw: FP4Weight) -> torch.Tensor:
    """x (M, K) @ dequantize_fp4(qw).T in float64, rounded once to x's dtype (validate_matmul)."""
    qw = _check_fp4(qw)
    validate_matmul(x, K=qw.K, dtype=qw.dtype, device=qw.codes.device)
    return (x.to(torch.float64) @ dequantize_fp4(qw).to(torch.float64).T).to(x.dtype)


class FP4Scheme(FormatScheme):
    """An FP4 scheme of the contract (``number_format`` "mxfp4" or "nvfp4") over a module's
    ``quantize_fp4``, ``dequantize_fp4`` and ``matmul_fp4`` (this module's by default)."""

    kind = "fp4"
    format_of = staticmethod(fp4_format)


MXFP4 = FP4Scheme("mxfp4")


NVFP4 = FP4Scheme("nvfp4")
