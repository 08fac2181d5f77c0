"""What only the suite's own KV-cache format built-ins promise about bad input, in their exact
wording (the contract's documented bad calls run on every implementation in
``properties/test_contract_generic.py``): a stored cache of another implementation is a TypeError
naming ``stored``, and the contract's messages name the argument and what it expects."""
from __future__ import annotations

import pytest
import torch

from inference_conformance.conformance.contracts.quantization.kv import KV_FORMATS
from inference_conformance.optimized.kv_format import TORCH
from inference_conformance.reference import kv_format as ref

BUILTINS = [pytest.param(ref, id="reference"), pytest.param(TORCH, id="torch")]


@pytest.mark.parametrize("ops", BUILTINS)
def test_builtins_name_the_argument_in_the_contracts_words(ops):
    k = torch.randn(1, 2, 4, 8)
    with pytest.raises(TypeError, match="format must be a KVFormat"):
        ops.quantize_kv(k, k, format="int8")
    with pytest.raises(ValueError, match=r"v must have k's shape \(1, 2, 4, 8\), got \(1, 1, 4, 8\)"):
        ops.quantize_kv(k, k[:, :1], format=KV_FORMATS["int8"])
    with pytest.raises(TypeError, match="stored must be what this quantize_kv returned"):
        ops.dequantize_kv((k, k))


def test_reference_holds_int4_packed_and_fp8_in_its_dtype():
    """The reference holds int4 KIVI codes two per byte (an odd D rounds up) and FP8 codes in
    torch's 8-bit dtype: the bytes its tensors take, not a declared count."""
    k = torch.randn(1, 1, 16, 5, dtype=torch.float64)
    s = ref.quantize_kv(k, k, format=KV_FORMATS["int4_kivi_r8_g8"])
    assert s.k_codes.dtype == torch.uint8 and tuple(s.k_codes.shape) == (1, 1, 8, 3)
    f = ref.quantize_kv(k, k, format=KV_FORMATS["fp8_e5m2"])
    assert f.k_codes.dtype == torch.float8_e5m2
    k_hat, _ = ref.dequantize_kv(s)
    assert torch.equal(k_hat[:, :, 8:], k[:, :, 8:])                  # the residual exact
