"""torchao's weight-only quantization under the ``quantization`` contract (``needs="torchao"``;
requirements/peers-libs.txt, ``tox -e peers-libs``): Int8WeightOnlyConfig and IntxWeightOnlyConfig
on a Linear layer's weight.
"""
from __future__ import annotations

import importlib

import torch


class TorchaoWeightOnly:
    """The quantization contract through torchao's weight-only quantization on a Linear layer
    (``torchao.quantization.quantize_``): ``"int8"`` is ``Int8WeightOnlyConfig`` (8 bits, one
    scale per output channel), ``"intx"`` is ``IntxWeightOnlyConfig(weight_dtype=torch.int<b>,
    granularity=PerGroup(g) | PerAxis(0))`` (2..8 bits, per channel or in groups; its CPU
    path). Both are symmetric (absmax with the range [-2^(b-1), 2^(b-1) - 1], a step of
    max|w| / (2^(b-1) - 1/2), within the contract's). QW is the quantized Linear; ``dequantize``
    is its weight's ``dequantize()``, ``matmul`` the Linear's forward. torchao's int4 path
    (``Int4WeightOnlyConfig``) needs CUDA kernels and is not adapted here. Refused
    (NotImplementedError): float64, granularity "tensor", and for ``"int8"`` anything but 8
    bits per channel."""

    symmetric = True

    def __init__(self, kind: str):
        self.kind = kind

    def _config(self, bits: int, granularity):
        from torchao.quantization import Int8WeightOnlyConfig, IntxWeightOnlyConfig
        from torchao.quantization.granularity import PerAxis, PerGroup

        if self.kind == "int8":
            if bits != 8 or granularity != "channel":
                raise NotImplementedError(f"torchao Int8WeightOnlyConfig is 8 bits per channel, not {bits} bits, "
                                          f"granularity {granularity!r}")
            return Int8WeightOnlyConfig()
        # PerGroup(1) is not refused: torchao 0.18 crashes on it inside choose_qparams (RuntimeError,
        # a reshape), which the laws report as the crash it is (expectations/quantization-torchao_intx.toml)
        gran = PerAxis(0) if granularity == "channel" else PerGroup(int(granularity))
        return IntxWeightOnlyConfig(weight_dtype=getattr(torch, f"int{bits}"), granularity=gran,
                                    scale_dtype=torch.float32)

    def quantize(self, w, *, bits, granularity):
        from inference_conformance.conformance.contracts.quantization import validate_quantize

        shape = validate_quantize(w, bits, granularity)
        if w.dtype == torch.float64:
            raise NotImplementedError("torchao's weight-only quantization takes float32, float16, bfloat16, not float64")
        if granularity == "tensor":
            raise NotImplementedError("torchao's weight-only quantization has no per-tensor granularity")
        ao = importlib.import_module("torchao.quantization")
        lin = torch.nn.Linear(shape.K, shape.N, bias=False, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            lin.weight.copy_(w)
        ao.quantize_(lin, self._config(shape.bits, granularity))
        lin.contract_shape = (shape.N, shape.K, w.dtype)
        return lin

    @staticmethod
    def _check(qw) -> torch.nn.Linear:
        if not isinstance(qw, torch.nn.Linear) or not hasattr(qw, "contract_shape"):
            raise TypeError(f"qw must be the quantized Linear this adapter's quantize returned, got {type(qw).__name__}")
        return qw

    def dequantize(self, qw):
        qw = self._check(qw)
        return qw.weight.dequantize().to(qw.contract_shape[2])

    def matmul(self, x, qw):
        from inference_conformance.conformance.contracts.quantization import validate_matmul

        qw = self._check(qw)
        N, K, dtype = qw.contract_shape
        validate_matmul(x, K=K, dtype=dtype, device=qw.weight.device)
        with torch.no_grad():
            return qw(x)

    def __repr__(self) -> str:
        return f"inference_conformance.optimized.quantization.outside_torchao.TorchaoWeightOnly({self.kind!r})"


torchao_int8 = TorchaoWeightOnly("int8")
torchao_intx = TorchaoWeightOnly("intx")
