"""The optimized built-in of the ``kv_format`` contract (claim QT-12): "torch", the vectorized
formats of :mod:`inference_conformance.optimized.quantization.kv` (the ones the model's quantized
cache, ``QuantizedKVCache``, holds): int8 codes, FP8 codes in torch's 8-bit dtypes, int4 KIVI
codes packed two per byte along D, low nibble first; float32 scales rounded up where the cast
rounds down (float64 for a float64 cache).
"""
from __future__ import annotations

import torch

from inference_conformance.conformance.contracts.kv_format import validate
from inference_conformance.optimized.quantization import kv as quant_kv


class TorchKVFormat:
    """The contract's two functions over ``optimized.quantization.kv``'s PackedKV."""

    @staticmethod
    def quantize_kv(k: torch.Tensor, v: torch.Tensor, *, format) -> quant_kv.PackedKV:
        """Raises as the contract's ``validate``."""
        validate(k, v, format)
        return quant_kv.quantize_kv(k, v, format)

    @staticmethod
    def dequantize_kv(stored) -> tuple[torch.Tensor, torch.Tensor]:
        """TypeError naming ``stored`` for anything but a PackedKV."""
        if not isinstance(stored, quant_kv.PackedKV):
            raise TypeError(f"stored must be what this quantize_kv returned (a PackedKV), got {type(stored).__name__}")
        return quant_kv.dequantize_kv(stored)


TORCH = TorchKVFormat()


def implementations():
    """The vectorized PyTorch KV-cache formats as the kv_format contract's optimized built-in."""
    from inference_conformance.conformance.registry import builtin

    return (builtin("kv_format", "torch", TORCH),)
