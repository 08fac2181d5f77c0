"""Laws of the KV-cache quantization formats (lecture 001 §5.4; claim QT-12), written against the
``quantization`` contract (``conformance/contracts/quantization/kv.py``: the formats and their
bounds). The FP8 weight formats (QT-11) are in ``properties/quantization/test_quantization_fp8.py``.

- QT-12: the formats' laws (every value within its step, attention within its bound, the bytes
  held) are the ``kv_format`` contract's (``properties/kv_format/``), over every registered
  implementation; here the model's quantized cache (``QuantizedKVCache``): a prefill in pieces
  equals one prefill, decode equals one forward; figures: the model's NLL with each format, and
  the cache bytes per token measured from the held tensors at Llama-3-8B's shape (KV-5's 240
  requests).
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.conformance import results
from inference_conformance.conformance.contracts.quantization import kv as kv_contract
from inference_conformance.properties.kv_format.cases import KVFCase, make_kv

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.claim("QT-12")
@pytest.mark.parametrize("fmt", ["int4_kivi_r8_g8", "int8"])
@pytest.mark.suite_own("the suite's QuantizedKVCache appended in pieces; formats from outside meet QT-12 in kv_format")
def test_qt12_cache_prefill_in_pieces_equals_one_prefill(fmt):
    """Appending a sequence to the quantized cache in pieces (a prefill of 11, one decode token,
    then pieces of 5 and 20) gives the same outputs as one prefill of all 37 tokens (float64, to
    1e-12 relative): a group once quantized never changes, and each query sees the cache as
    decode holds it."""
    from inference_conformance.optimized.quantization.kv import QuantizedKVCache

    case = KVFCase(2, 2, 37, 16, fmt, "outlier_channel", 2)
    q, k, v = make_kv(case, 3, torch.float64, "cpu")
    whole = QuantizedKVCache(kv_contract.KV_FORMATS[fmt]).attend(0, q, k, v)
    cache = QuantizedKVCache(kv_contract.KV_FORMATS[fmt])
    pieces = [cache.attend(0, q[:, :, a:b], k[:, :, a:b], v[:, :, a:b]) for a, b in ((0, 11), (11, 12), (12, 17), (17, 37))]
    got = torch.cat(pieces, dim=2)
    err = float((got - whole).abs().max() / whole.abs().max())
    assert err <= 1e-12, err
    assert cache.tokens == 37


@pytest.mark.claim("QT-12")
@pytest.mark.suite_own("the reference model through the suite's QuantizedKVCache; formats from outside meet QT-12 in kv_format")
def test_qt12_model_decode_with_the_quantized_cache_equals_one_forward():
    """The model's one forward through a QuantizedKVCache (int4 KIVI, R = G = 8): a prefill of
    13 tokens then 11 single-token decode steps (positions given) give the logits of one forward
    over all 24 tokens with a fresh cache (float64 target model, to 1e-10 relative), so the NLL
    figure measured in one forward is decode's."""
    from inference_conformance.optimized.quantization.kv import QuantizedKVCache
    from inference_conformance.smallworld import checkpoints, data

    model = checkpoints.load_model("target", dtype=torch.float64)
    tokens = data.pad_batch(data.encode(data.split("test", 4)))[0][:, :24]
    fmt = kv_contract.KV_FORMATS["int4_kivi_r8_g8"]
    with torch.no_grad():
        whole = model(tokens, None, QuantizedKVCache(fmt))
        cache = QuantizedKVCache(fmt)
        steps = [model(tokens[:, :13], None, cache)]
        for t in range(13, tokens.shape[1]):
            steps.append(model(tokens[:, t:t + 1], torch.full((tokens.shape[0], 1), t), cache))
    got = torch.cat(steps, dim=1)
    err = float((got - whole).abs().max() / whole.abs().max())
    assert err <= 1e-10, err


def kv_nll(model, docs, fmt) -> float:
    """:func:`inference_conformance.smallworld.data.nll` with every layer's attention through a QuantizedKVCache of
    ``fmt`` (each prediction as a decode step over the quantized cache sees it)."""
    from inference_conformance.optimized.quantization.kv import QuantizedKVCache
    from inference_conformance.smallworld import data

    total, count = 0.0, 0
    for inputs, targets in data.batches(data.encode(docs), 256):
        with torch.no_grad():
            logits = model(inputs, None, QuantizedKVCache(fmt))
        logp = torch.log_softmax(logits.double(), dim=-1)
        mask = targets != data.IGNORE
        total += float(-(logp.gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)[mask]).sum())
        count += int(mask.sum())
    return total / count


#: QT-12's NLL figure (CLAIMS.md): every quantized cache within 0.02% of the unquantized NLL (relative).
QT12_NLL_WITHIN = 2e-4


@pytest.mark.claim("QT-12")
@pytest.mark.suite_own("the small model's NLL with the suite's quantized KV cache (the lecture's figure)")
def test_qt12_nll_with_a_quantized_kv_cache():
    """QT-12's NLL figure on the target model (float32, QT-3's 64 test documents): every layer's
    keys and values through the quantized cache, int8 per token, int4 KIVI (R = G = 8), int4 KIVI
    with no residual (R = 0, G = 8), FP8 E4M3 and E5M2 per token. The rule, the claim's figure:
    each within :data:`QT12_NLL_WITHIN` = 0.02% of the unquantized NLL (the documents average 22
    tokens; measured on CPU: -0.013% to +0.004%)."""
    from inference_conformance.smallworld import checkpoints, data

    model = checkpoints.load_model("target", dtype=torch.float32)
    docs = data.split("test", data.TEST_SUBSET)
    base = data.nll(model, docs)
    formats = dict(kv_contract.KV_FORMATS)
    formats["int4_kivi_r0_g8"] = kv_contract.kv_format("int4_kivi", 0, 8)
    rel = {}
    for name, fmt in formats.items():
        nll = kv_nll(model, docs, fmt)
        rel[name] = nll / base - 1
        results.record("QT-12", measured=round(nll, 4), unit="test NLL (nats/token)",
                       bound=round(base * (1 + QT12_NLL_WITHIN), 5),
                       lecture="KV cache at 8 and 4 bits (KIVI) almost lossless", nll=nll,
                       rule=f"KV cache {name}; unquantized {base:.4f} ({100 * rel[name]:+.3f}%), within "
                            f"{100 * QT12_NLL_WITHIN:g}% (CLAIMS.md QT-12)")
    bad = {k: f"{100 * r:+.4f}%" for k, r in rel.items() if abs(r) > QT12_NLL_WITHIN}
    assert not bad, f"QT-12: NLL off the unquantized {base:.5f} by more than {100 * QT12_NLL_WITHIN:g}%: {bad}"


@pytest.mark.claim("QT-12", "KV-5")
@pytest.mark.suite_own("the model's quantized KV cache (the suite's QuantizedKVCache) at Llama-3-8B's shape: KV-5's figure; formats from "
                       "outside meet QT-12 in kv_format")
def test_qt12_cache_bytes_per_token_and_kv5():
    """Cache bytes per token measured from the tensors a QuantizedKVCache holds, at Llama-3-8B's
    layer shape (8 KV heads of 128, bfloat16, one layer of a 4,096-token sequence, times 32
    layers), and the requests a 60 GiB budget holds at 4K context (KV-5). bf16 holds 128 KiB per
    token: 120 requests. The 8-bit formats' codes are 1 byte per value: the 240 of KV-5 (checked
    from the code tensors alone); with the float32 scale each token and head holds beside its 128
    codes, 132 bytes per 128 values: 232 requests (the exact count from that layout is asserted,
    both from the measured bytes). KIVI int4 (R = 128, G = 32, KIVI's own sizes): half a byte
    per value, a float32 scale per channel per 32 keys and per value token, 128 recent tokens in
    bf16 (recorded)."""
    from inference_conformance.optimized.quantization.kv import QuantizedKVCache

    L, Hkv, D, T, context = 32, 8, 128, 4096, 4096
    budget = 60 * 2 ** 30
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, Hkv, 1, D, generator=g).to(torch.bfloat16)
    k = torch.randn(1, Hkv, T, D, generator=g).to(torch.bfloat16)
    v = torch.randn(1, Hkv, T, D, generator=g).to(torch.bfloat16)
    bf16_per_token = L * 2 * Hkv * D * 2
    assert budget // (context * bf16_per_token) == 120
    counts = {"bf16": 120}
    for name, fmt in (("int8", kv_contract.KV_FORMATS["int8"]), ("fp8_e4m3fn", kv_contract.KV_FORMATS["fp8_e4m3fn"]),
                      ("int4_kivi_r128_g32", kv_contract.kv_format("int4_kivi", 128, 32))):
        cache = QuantizedKVCache(fmt)
        # T - 1 tokens appended (one query: only the bytes are measured), then one decode step
        cache.attend(0, q, k[:, :, :T - 1], v[:, :, :T - 1])
        cache.attend(0, q, k[:, :, T - 1:], v[:, :, T - 1:])
        per_seq = cache.nbytes() * L                                                   # context = T tokens
        counts[name] = budget // per_seq
        seg = cache._segments[0][0]
        code_bytes = (seg.k_codes.numel() * seg.k_codes.element_size() + seg.v_codes.numel() * seg.v_codes.element_size())
        if fmt.kind != "int4_kivi":
            assert budget // (code_bytes * L) == 240, (name, code_bytes)
            assert per_seq == L * 2 * Hkv * T * (D + 4), (name, per_seq)
            assert counts[name] == 232, counts
        results.record("QT-12", measured=int(counts[name]), lecture=240 if fmt.kind != "int4_kivi" else "",
                       unit="requests in 60 GiB at 4K context (Llama-3-8B)",
                       rule=f"KV cache {name}: {per_seq / context / 1024:.2f} KiB per token measured (bf16: 128)",
                       what=f"codes alone {code_bytes * L / context / 1024:.2f} KiB per token")
    results.record("KV-5", measured=int(counts["int8"]), lecture=240, unit="requests, int8 KV with per-token scales",
                   rule="measured from a quantized cache's tensors: 240 counts the codes only; float32 per-token "
                        "scales make it 232", what=str(counts))
