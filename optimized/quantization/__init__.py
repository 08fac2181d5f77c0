"""Vectorized PyTorch weight quantization (the ``torch`` and ``torch_asym`` implementations of the
``quantization`` contract), the packed layout the Triton kernel reads
(``optimized/quantization/quant_matmul.py``), and the ``triton`` / ``triton_asym`` schemes (this module's
quantize, the kernel's matmul: :class:`TritonScheme`). Same arithmetic as the reference (``reference/quantization/__init__.py``:
w_hat = (u - z) * s, scale rounded up to 16 significant bits, codes packed along K low bits
first), computed on whole tensors at once; claims QT-1, QT-2, QT-9 (lecture 001 §5.1–5.2).

Layout of :class:`PackedWeight`: ``codes`` (N, ceil(K / per)) uint8, per = 2 for 4 bits, 4 for
2 bits, else 1, element k of a row in byte k // per at bit offset (k % per) * bits;
``scales`` (N, groups) float32 (float64 for float64 weights), (1, 1) for "tensor" (a step
below float32's normal range is stored rounded up, and the codes use the stored scale);
``zeros`` (N, groups) uint8, unpacked (one zero point per group, the stored value is z);
``g_idx`` (K,) int32, the group of every column under GPTQ's act-order (None: k // group_size).

FP8 (QT-11) is in ``optimized/quantization/fp8.py``, FP4 (QT-13) in ``optimized/quantization/fp4.py``; the KV-cache formats (QT-12) and
:class:`QuantizedKVCache` in ``optimized/quantization/kv.py``.
"""
from __future__ import annotations

from dataclasses import dataclass

import types

import torch

from inference_conformance.conformance.contracts.quantization import (
    levels,
    validate_g_idx,
    validate_matmul,
    validate_quantize,
)
from inference_conformance.optimized.quantization.packing import pack, round_scale, storable, unpack
from inference_conformance.reference.quantization import Scheme


@dataclass(frozen=True)
class PackedWeight:
    """The packed weight (see the module docstring); ``dtype`` is w's, ``group_size`` K for
    "channel" and "tensor"."""

    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    bits: int
    group_size: int
    granularity: object
    N: int
    K: int
    dtype: torch.dtype
    symmetric: bool
    g_idx: torch.Tensor | None = None


def quantize(w: torch.Tensor, *, bits: int, granularity, symmetric: bool = True,
             g_idx: torch.Tensor | None = None) -> PackedWeight:
    """Quantize w (N, K) at once: groups reshaped to (rows, groups, group size), scales and
    zero points per group; with ``g_idx`` (act-order, an int granularity) the columns are first
    sorted by group, quantized, and the codes put back in column order. Raises
    TypeError/ValueError as the contract's validate_quantize and validate_g_idx."""
    shape = validate_quantize(w, bits, granularity)
    if g_idx is not None:
        idx = validate_g_idx(g_idx, shape.K, granularity).to(w.device)
        order = torch.argsort(idx, stable=True)
        qw = quantize(w[:, order], bits=bits, granularity=granularity, symmetric=symmetric)
        u = torch.empty(shape.N, shape.K, dtype=torch.int32, device=w.device)
        u[:, order] = unpack(qw.codes, qw.bits, qw.K)
        return PackedWeight(pack(u, qw.bits), qw.scales, qw.zeros, qw.bits, qw.group_size, granularity,
                            qw.N, qw.K, qw.dtype, symmetric, idx.to(torch.int32))
    N, K, b = shape.N, shape.K, shape.bits
    w64 = w.detach().to(torch.float64)
    grp = w64.reshape(1, 1, N * K) if granularity == "tensor" else w64.reshape(N, K // shape.group_size, shape.group_size)
    sdt = torch.float64 if w.dtype == torch.float64 else torch.float32
    if symmetric:
        s = storable(round_scale(grp.abs().amax(dim=-1) / levels(b, True)), sdt)
        z = torch.full_like(s, 2 ** (b - 1))
        lo, hi = 1, 2 ** b - 1
    else:
        lo_w, hi_w = grp.amin(dim=-1).clamp(max=0), grp.amax(dim=-1).clamp(min=0)
        s = storable(round_scale((hi_w - lo_w) / levels(b, False)), sdt)
        z = torch.where(s > 0, torch.round(-lo_w / torch.where(s > 0, s, 1.0)), 0.0).clamp(0, 2 ** b - 1)
        lo, hi = 0, 2 ** b - 1
    safe = torch.where(s > 0, s, 1.0)[..., None]
    u = torch.where(s[..., None] > 0, (torch.round(grp / safe) + z[..., None]).clamp(lo, hi), z[..., None])
    u = u.reshape(N, K).to(torch.int32)
    return PackedWeight(pack(u, b), s.to(sdt), z.to(torch.uint8), b, shape.group_size, granularity, N, K,
                        w.dtype, symmetric)


def check_packed(qw) -> PackedWeight:
    """TypeError unless ``qw`` is a :class:`PackedWeight`."""
    if not isinstance(qw, PackedWeight):
        raise TypeError(f"qw must be an inference_conformance.optimized.quantization.PackedWeight (what quantize returned), "
                        f"got {type(qw).__name__}")
    return qw


def dequantize(qw: PackedWeight) -> torch.Tensor:
    """(N, K) in w's dtype: (u - z) * s in the scales' dtype (exact: 8 + 16 bits), rounded once."""
    qw = check_packed(qw)
    u = unpack(qw.codes, qw.bits, qw.K)
    if qw.granularity == "tensor":
        z, s = qw.zeros.expand(qw.N, qw.K), qw.scales.expand(qw.N, qw.K)
    elif qw.g_idx is not None:                    # act-order: column k reads group g_idx[k]
        idx = qw.g_idx.to(torch.int64)
        z, s = qw.zeros[:, idx], qw.scales[:, idx]
    else:
        z = qw.zeros.repeat_interleave(qw.group_size, dim=1)
        s = qw.scales.repeat_interleave(qw.group_size, dim=1)
    return ((u - z.to(torch.int32)).to(s.dtype) * s).to(qw.dtype)


def matmul(x: torch.Tensor, qw: PackedWeight) -> torch.Tensor:
    """x (M, K) @ dequantize(qw).T in x's dtype (torch.matmul). Raises TypeError/ValueError for
    an x of the wrong K, dtype or device."""
    qw = check_packed(qw)
    validate_matmul(x, K=qw.K, dtype=qw.dtype, device=qw.codes.device)
    return x @ dequantize(qw).T


#: This module's functions for :class:`Scheme`, held apart from the module: importing the submodule
#: ``matmul`` (the Triton kernel) sets the package's attribute ``matmul`` to that module, which
#: would shadow the function of the same name.
OPS = types.SimpleNamespace(__name__=__name__, quantize=quantize, dequantize=dequantize, matmul=matmul)
SYMMETRIC = Scheme(True, OPS)
ASYMMETRIC = Scheme(False, OPS)


class TritonScheme:
    """The ``triton`` implementation: quantize and dequantize as this module (float32 scales;
    with GPTQ's act-order ``g_idx`` (K,), an int group size, stored in the packed weight as
    int32), matmul by the Triton kernels of :func:`inference_conformance.optimized.quantization.quant_matmul.quant_matmul` (with the
    stored g_idx). Refuses float64 weights (NotImplementedError) after validating the call."""

    def __init__(self, symmetric: bool):
        self.symmetric = symmetric

    def quantize(self, w, *, bits, granularity, g_idx=None):
        qw = quantize(w, bits=bits, granularity=granularity, symmetric=self.symmetric, g_idx=g_idx)
        if qw.dtype == torch.float64:
            raise NotImplementedError("the Triton quantized matmul has no float64 path (float32 scales)")
        return qw

    def dequantize(self, qw):
        return dequantize(qw)

    def matmul(self, x, qw):
        from inference_conformance.optimized.quantization.quant_matmul import quant_matmul

        qw = check_packed(qw)
        validate_matmul(x, K=qw.K, dtype=qw.dtype, device=qw.codes.device)
        return quant_matmul(x, qw.codes, qw.scales, qw.zeros, bits=qw.bits, group_size=qw.group_size,
                            N=qw.N, K=qw.K, g_idx=qw.g_idx)

    def __repr__(self) -> str:
        return f"inference_conformance.optimized.quantization.TritonScheme(symmetric={self.symmetric})"


TRITON_SYMMETRIC = TritonScheme(True)
TRITON_ASYMMETRIC = TritonScheme(False)


def implementations():
    """The vectorized PyTorch schemes (integer, FP8 and FP4), the Triton quantized matmul (same
    quantize, Triton matmul), torchao's weight-only quantization and the CPU libraries of
    optimized/quantization/outside.py (unavailable where their package is missing)."""
    from inference_conformance.conformance.registry import builtin
    from inference_conformance.optimized.quantization import outside_torchao
    from inference_conformance.optimized.quantization import outside as oq
    from inference_conformance.optimized.quantization import outside_fp4 as ofp4
    from inference_conformance.optimized.quantization import quant_matmul
    from inference_conformance.optimized.quantization.fp8 import FP8_E4M3, FP8_E5M2, TRITON_FP8_E4M3, TRITON_FP8_E5M2
    from inference_conformance.optimized.quantization.fp4 import MXFP4, NVFP4, TRITON_MXFP4, TRITON_NVFP4

    return (
        builtin("quantization", "torch", SYMMETRIC),
        builtin("quantization", "torch_asym", ASYMMETRIC),
        builtin("quantization", "triton", TRITON_SYMMETRIC, kernel_modules=(quant_matmul,)),
        builtin("quantization", "triton_asym", TRITON_ASYMMETRIC, kernel_modules=(quant_matmul,)),
        builtin("quantization", "torch_fp8_e4m3", FP8_E4M3),
        builtin("quantization", "torch_fp8_e5m2", FP8_E5M2),
        builtin("quantization", "triton_fp8_e4m3", TRITON_FP8_E4M3, kernel_modules=(quant_matmul,)),
        builtin("quantization", "triton_fp8_e5m2", TRITON_FP8_E5M2, kernel_modules=(quant_matmul,)),
        builtin("quantization", "torch_mxfp4", MXFP4),
        builtin("quantization", "torch_nvfp4", NVFP4),
        builtin("quantization", "triton_mxfp4", TRITON_MXFP4, kernel_modules=(quant_matmul,)),
        builtin("quantization", "triton_nvfp4", TRITON_NVFP4, kernel_modules=(quant_matmul,)),
        builtin("quantization", "torchao_int8", outside_torchao.torchao_int8, needs="torchao", adapter=True),
        builtin("quantization", "torchao_intx", outside_torchao.torchao_intx, needs="torchao", adapter=True),
        builtin("quantization", "torchao_mxfp4", ofp4.torchao_mxfp4, needs="torchao", adapter=True),
        builtin("quantization", "torchao_nvfp4", ofp4.torchao_nvfp4, needs="torchao", adapter=True),
        # CPU libraries (optimized/quantization/outside.py; requirements/peers-libs.txt, tox -e peers-libs)
        builtin("quantization", "bnb_int8", oq.bnb_int8, needs="bitsandbytes", adapter=True, peer="libs"),
        builtin("quantization", "compressed_tensors", oq.ct, needs="compressed_tensors", adapter=True, peer="libs"),
        builtin("quantization", "compressed_tensors_asym", oq.ct_asym, needs="compressed_tensors", adapter=True, peer="libs"),
        builtin("quantization", "quanto_int8", oq.quanto_int8, needs="optimum.quanto", adapter=True, peer="libs"),
        builtin("quantization", "quanto_intx", oq.quanto_intx, needs="optimum.quanto", adapter=True, peer="libs"),
        builtin("quantization", "gguf_q8_0", oq.gguf_q8_0, needs="gguf", adapter=True, peer="libs"),
        builtin("quantization", "gguf_q4_0", oq.gguf_q4_0, needs="gguf", adapter=True, peer="libs"),
        builtin("quantization", "gguf_mxfp4", ofp4.gguf_mxfp4, needs="gguf", adapter=True, peer="libs"),
    )
