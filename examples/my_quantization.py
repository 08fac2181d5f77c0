"""A worked outside implementation of the ``quantization`` contract, written without the suite's
code except its argument checks: absmax quantization with one int8 code per weight (no packing),
float64 scales, dequantize-then-multiply. ``quantization`` conforms; ``wrong_quantization`` rounds
down (floor) instead of to nearest, a classic bug that QT-1 rejects.

    PYTHONPATH=examples pytest properties --impl quantization=my_quantization:quantization
"""
from __future__ import annotations

import torch

from inference_conformance.conformance.contracts.quantization import validate_matmul, validate_quantize


class AbsMax:
    symmetric = True

    def __init__(self, rounding=torch.round):
        self.rounding = rounding

    def quantize(self, w, *, bits, granularity):
        shape = validate_quantize(w, bits, granularity)
        qmax = 2 ** (shape.bits - 1) - 1
        rows = w.double().reshape(1, -1) if granularity == "tensor" else w.double().reshape(-1, shape.group_size)
        s = rows.abs().amax(dim=1, keepdim=True) / qmax
        q = self.rounding(rows / torch.where(s > 0, s, 1.0)).clamp(-qmax, qmax).to(torch.int8)
        return {"q": q, "s": s, "shape": (shape.N, shape.K), "dtype": w.dtype}

    def dequantize(self, qw):
        if not isinstance(qw, dict) or "q" not in qw:
            raise TypeError("qw must be what quantize returned")
        return (qw["q"].double() * qw["s"]).reshape(qw["shape"]).to(qw["dtype"])

    def matmul(self, x, qw):
        w = self.dequantize(qw)
        validate_matmul(x, K=w.shape[1], dtype=w.dtype, device=w.device)
        return x @ w.T


quantization = AbsMax()
wrong_quantization = AbsMax(rounding=torch.floor)
