"""FP4 block formats of outside libraries under the ``quantization`` contract (QT-13; registered
with ``needs`` their package, peer set "libs"). Each takes bits=4 and its format's own block
(32 for MXFP4, 16 for NVFP4) as the granularity, and refuses the rest (NotImplementedError):

- ``torchao_mxfp4``: ``torchao.prototype.mx_formats.MXTensor.to_mx(w, float4_e2m1fn_x2, 32)``
  (scaling mode FLOOR, the OCP spec's shared exponent), ``dequantize`` its ``dequantize``;
  float32 and bfloat16 weights.
- ``torchao_nvfp4``: ``NVFP4Tensor.to_nvfp4(w, 16, per_tensor_scale=per_tensor_amax_to_scale(
  max|w|))``; float32 and bfloat16. torchao rounds the block scale (max|w_block| / 6) / s_t from
  float32 and scales the values by the float32 reciprocal (1 / s_t) / s_b (its Triton kernel's
  numerics), and dequantizes in float32: where that moves a value across a midpoint or the
  scale across an E4M3 tie, it differs from the contract's float64 rule, and QT-13's exact
  comparison reports it.
- ``gguf_mxfp4``: llama.cpp's MXFP4 through ``gguf.quants.quantize`` / ``dequantize`` (numpy,
  float32; the same shared exponent floor(log2 amax) - 2); its rounding takes the first of the
  nearest values in its table (numpy ``argmin``), so a tie goes to the smaller magnitude (0.75 s
  -> 0.5 s), not to the even code, and QT-13's exact comparison rejects it there.

None has a weight-only product of its own on a CPU (``matmul`` refuses after validating x).
"""
from __future__ import annotations

import importlib

import torch

from inference_conformance.conformance.contracts.quantization import validate_quantize
from inference_conformance.conformance.contracts.quantization.fp4 import fp4_format
from inference_conformance.optimized.quantization.outside import OutsideWeight, _Adapter, _refuse


class _FP4Adapter(_Adapter):
    """The checks every FP4 adapter shares (bits 4, the format's block, the dtypes it takes)."""

    dtypes = (torch.float32, torch.bfloat16)
    no_matmul = "its FP4 products need Blackwell kernels; the CPU path dequantizes"

    def __init__(self, name: str, fmt: str):
        self.name, self.number_format = name, fmt

    def _checked(self, w, bits, granularity):
        shape = validate_quantize(w, bits, granularity)
        block = fp4_format(self.number_format).block
        _refuse(self.name, shape.bits == 4, f"stores 4 bits, not {bits}")
        _refuse(self.name, granularity == block, f"takes blocks of {block} along K, not granularity {granularity!r}")
        _refuse(self.name, w.dtype in self.dtypes, f"takes {[str(d) for d in self.dtypes]}, not {w.dtype}")
        return shape

    def __repr__(self) -> str:
        return f"inference_conformance.optimized.quantization.outside_fp4.{self.name}"


class TorchaoFP4(_FP4Adapter):
    """torchao's MXTensor / NVFP4Tensor (module docstring)."""

    def quantize(self, w, *, bits, granularity):
        shape = self._checked(w, bits, granularity)
        mx = importlib.import_module("torchao.prototype.mx_formats.mx_tensor")
        nv = importlib.import_module("torchao.prototype.mx_formats.nvfp4_tensor")
        wc = w.detach().contiguous()
        if self.number_format == "mxfp4":
            t = mx.MXTensor.to_mx(wc, torch.float4_e2m1fn_x2, 32)
        else:
            t = nv.NVFP4Tensor.to_nvfp4(wc, 16, per_tensor_scale=nv.per_tensor_amax_to_scale(wc.abs().max().float()))
        return OutsideWeight(t, shape.N, shape.K, w.dtype, w.device, self)

    def dequantize(self, qw):
        qw = self._check(qw)
        return qw.data.dequantize(qw.dtype).reshape(qw.N, qw.K)


class GgufMXFP4(_FP4Adapter):
    """llama.cpp's MXFP4 blocks through gguf-py (module docstring); float16 weights too (exact
    in float32)."""

    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    no_matmul = "gguf-py quantizes and dequantizes; ggml's kernels are not in the package"

    def quantize(self, w, *, bits, granularity):
        shape = self._checked(w, bits, granularity)
        gguf = importlib.import_module("gguf")
        qtype = gguf.GGMLQuantizationType.MXFP4
        blocks = gguf.quants.quantize(w.detach().float().cpu().numpy(), qtype)
        return OutsideWeight((blocks, qtype), shape.N, shape.K, w.dtype, w.device, self)

    def dequantize(self, qw):
        qw = self._check(qw)
        gguf = importlib.import_module("gguf")
        blocks, qtype = qw.data
        return torch.from_numpy(gguf.quants.dequantize(blocks, qtype).copy()).to(device=qw.device, dtype=qw.dtype)


torchao_mxfp4 = TorchaoFP4("torchao_mxfp4", "mxfp4")
torchao_nvfp4 = TorchaoFP4("torchao_nvfp4", "nvfp4")
gguf_mxfp4 = GgufMXFP4("gguf_mxfp4", "mxfp4")
