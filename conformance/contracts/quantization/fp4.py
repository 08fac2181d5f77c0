"""FP4 block formats of the ``quantization`` contract (QT-13; lecture 001 §5.4, "FP4 on
Blackwell"): E2M1 values with a scale per block, MXFP4 (OCP Microscaling Formats (MX)
Specification v1.0, 2023, §5 and §6.3) and NVFP4 (NVIDIA's Blackwell format, as TensorRT Model
Optimizer, compressed-tensors and the CUDA 12.8 PTX ISA describe it). The scheme's call, shapes
and errors are in ``conformance/contracts/quantization/contract.py``.

E2M1 (:data:`E2M1_GRID`): 1 sign, 2 exponent bits (bias 1), 1 mantissa bit; the values 0, 0.5,
1, 1.5, 2, 3, 4, 6 and their negatives (code ``S EE M``, codes 0..7 in that order, +8 negative).
Grid spacing 0.5 below 2, 1 in [2, 4), 2 in [4, 6]: :func:`e2m1_half_spacing`.

The scale of a block (:func:`fp4_scales`; the block is the group of the granularity; the formats'
own blocks are 32 values for MXFP4 and 16 for NVFP4), with amax = max |w| over the block:

- MXFP4: an E8M0 scale (a power of two, exponent -127..127 stored with bias 127), the shared
  exponent of the MX spec §6.3: X = 2^(floor(log2 amax) - emax_elem), emax_elem = 2 (E2M1's
  largest value 6 = 1.5 * 2^2), clamped to E8M0's range [2^-127, 2^127]; an all-zero block gets
  2^-127. amax / X then lies in [4, 8): the block's largest values above 6 X saturate to 6 X (the
  spec's clipping).
- NVFP4: a float32 tensor scale s_t = amax_tensor / (6 * 448) rounded to float32, clamped to
  float32's normal range [2^-126, 3.4e38], and an E4M3 (E4M3fn) block scale s_b =
  e4m3(amax_block / (6 s_t)), the quotient computed in float64 and rounded to nearest even on
  E4M3's grid, saturating at 448; the block's scale is s = s_b * s_t (exact in float64). A block
  whose s_b rounds to 0 comes back as zeros.

A value is then q = e2m1(w / s) (w / s in float64: exact where w has at most 24 significant
bits), rounded to the nearest grid point, ties to the even code (mantissa bit 0), saturating at
±6; the reconstruction is q * s in float64, rounded once to w's dtype. So every element lies
within half the grid spacing at w / s times s of w, and where |w| > 6 s it comes back as ±6 s
(:func:`fp4_bound`). Two codes are packed per byte, the even k in the low nibble.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from inference_conformance.conformance.contracts.quantization.contract import validate_quantize

#: E2M1's non-negative values, code 0..7 (code + 8: the negative).
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
#: E2M1's largest value (the saturation point, in units of the block scale).
E2M1_MAX = 6.0
#: emax_elem of the MX spec for FP4 (E2M1): the exponent of its largest normal value.
E2M1_EMAX = 2
#: E8M0's exponent range (0xFF is NaN) and bias.
E8M0_EMIN, E8M0_EMAX, E8M0_BIAS = -127, 127, 127
#: E4M3fn's largest value, mantissa bits, smallest normal exponent (NVFP4's block scale).
E4M3_MAX, E4M3_M, E4M3_EMIN = 448.0, 3, -6


@dataclass(frozen=True)
class FP4Format:
    """One FP4 block format: ``name``, ``block`` (the format's own block size along K),
    ``scale`` ("e8m0" or "e4m3") and whether it has a float32 ``tensor_scale``."""

    name: str
    block: int
    scale: str
    tensor_scale: bool


#: The FP4 formats of QT-13.
FP4_FORMATS = {"mxfp4": FP4Format("mxfp4", 32, "e8m0", False),
               "nvfp4": FP4Format("nvfp4", 16, "e4m3", True)}


def fp4_format(name) -> FP4Format:
    """The :class:`FP4Format` of ``name``; ValueError naming ``number_format`` otherwise."""
    if name not in FP4_FORMATS:
        raise ValueError(f"number_format must be one of {list(FP4_FORMATS)}, got {name!r}")
    return FP4_FORMATS[name]


def round_to_grid(x: torch.Tensor, m: int, emin: int, top: float) -> torch.Tensor:
    """x (float64) rounded to nearest, ties to even, on the grid of a float format with m
    mantissa bits, smallest normal exponent emin and largest value top (saturating at ±top):
    spacing 2^(max(e, emin) - m) for 2^e <= |x| < 2^(e+1). E2M1: (1, 0, 6); E4M3fn: (3, -6, 448)."""
    _, e = torch.frexp(x)
    exp = torch.clamp(e.to(torch.int64) - 1, min=emin)
    spacing = torch.ldexp(torch.ones_like(x), (exp - m).to(torch.int32))
    return torch.clamp(torch.round(x / spacing) * spacing, -top, top)


def nvfp4_tensor_scale(w: torch.Tensor) -> float:
    """NVFP4's float32 tensor scale: max|w| / (6 * 448) rounded to float32, clamped to float32's
    normal range (a Python float)."""
    f32 = torch.finfo(torch.float32)
    s = torch.tensor(float(w.detach().abs().max()) / (E2M1_MAX * E4M3_MAX), dtype=torch.float64)
    return float(s.clamp(f32.tiny, f32.max).to(torch.float32))


def fp4_block_scales(w: torch.Tensor, fmt: str, granularity) -> tuple[torch.Tensor, float]:
    """(block scales, tensor scale): the block scales (N or 1, blocks) float64 of an FP4 scheme
    as the module docstring states (MXFP4: the power of two X; NVFP4: s_b, the E4M3 value) and
    the tensor scale (1.0 for MXFP4). Raises as validate_quantize (bits 4)."""
    f = fp4_format(fmt)
    shape = validate_quantize(w, 4, granularity)
    w64 = w.detach().to(torch.float64)
    groups = w64.reshape(1, -1) if granularity == "tensor" else w64.reshape(shape.N * shape.groups_per_row,
                                                                            shape.group_size)
    amax = groups.abs().amax(dim=-1)
    rows = 1 if granularity == "tensor" else shape.N
    if f.scale == "e8m0":
        _, e = torch.frexp(amax)                                 # amax = m 2^e, m in [0.5, 1): floor(log2) = e - 1
        x = torch.where(amax > 0, e.to(torch.int64) - 1 - E2M1_EMAX, E8M0_EMIN).clamp(E8M0_EMIN, E8M0_EMAX)
        return torch.ldexp(torch.ones_like(amax), x.to(torch.int32)).reshape(rows, -1), 1.0
    st = nvfp4_tensor_scale(w64)
    sb = round_to_grid(amax / (E2M1_MAX * st), E4M3_M, E4M3_EMIN, E4M3_MAX)
    return sb.reshape(rows, -1), st


def fp4_scales(w: torch.Tensor, fmt: str, granularity) -> torch.Tensor:
    """Every element's block scale s, (N, K) float64 (MXFP4: X; NVFP4: s_b * s_t, exact)."""
    sb, st = fp4_block_scales(w, fmt, granularity)
    N, K = w.shape
    s = sb * st
    if granularity == "tensor":
        return s.expand(N, K)
    return s.repeat_interleave(K // s.shape[1], dim=1)


def e2m1_half_spacing(q: torch.Tensor) -> torch.Tensor:
    """Half E2M1's grid spacing at |q| (q in units of the block scale): 0.25 below 2, 0.5 in
    [2, 4), 1 from 4 (float64 of q's shape)."""
    a = q.abs()
    return torch.where(a < 2, 0.25, torch.where(a < 4, 0.5, 1.0)).to(torch.float64)


def fp4_bound(w: torch.Tensor, fmt: str, granularity) -> torch.Tensor:
    """QT-13's per-element bound for an FP4 scheme's dequantize(quantize(w)), (N, K) float64:
    half the grid spacing at w / s times s where |w| <= 6 s, |w| - 6 s beyond (saturation), |w|
    where s = 0, plus the output dtype's rounding (half an ulp at |w| + the bound, half its
    subnormal spacing)."""
    s = fp4_scales(w, fmt, granularity)
    a = w.detach().to(torch.float64).abs()
    q = torch.where(s > 0, a / torch.where(s > 0, s, 1.0), 0.0)
    b = torch.where(q <= E2M1_MAX, e2m1_half_spacing(q) * s, a - E2M1_MAX * s)
    b = torch.where(s > 0, b, a)
    fin = torch.finfo(w.dtype)
    return b + fin.eps / 2 * (a + b) + fin.tiny * fin.eps / 2
