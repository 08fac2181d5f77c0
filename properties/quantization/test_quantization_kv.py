"""Laws of the KV-cache quantization formats (lecture 001 §5.4; claim QT-12), written against the
``quantization`` contract (``conformance/contracts/quantization_kv.py``: the formats and their
bounds). The FP8 weight formats (QT-11) are in ``properties/quantization/test_quantization_fp8.py``.

- QT-12: the KV-cache formats (int8 per token, int4 KIVI, FP8 per token) reconstruct every
  element within the contract's ``kv_bound``; attention over the quantized cache
  (``inference_conformance.optimized.quantization.kv.QuantizedKVCache``) is within ``attention_bound``, derived from the
  steps and the softmax's sensitivity; a prefill in pieces equals one prefill; figures: the
  model's NLL with each format, and the cache bytes per token measured from the held tensors
  at Llama-3-8B's shape (KV-5's 240 requests). Known-bad formats (``KV_ZOO``) are rejected.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import note
from hypothesis import strategies as st

from inference_conformance.conformance import results
from inference_conformance.conformance.contracts import quantization_fp8 as fp8_contract, quantization_kv as kv_contract
from inference_conformance.conformance.laws import Law
from inference_conformance.conformance.tolerance import check_within
from inference_conformance.conformance.zoo import expect_rejected
from inference_conformance.properties import strategies as S
from inference_conformance.properties.quantization.cases import as_impl
from inference_conformance.properties.quantization.zoo import KV_ZOO

TECH = "quantization"
FORMATS = tuple(fp8_contract.FP8_FORMATS)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@dataclass(frozen=True)
class KVCase:
    """Keys and values (B, H, T, D) in a format; ``outlier`` multiplies one key channel and one
    value token (the channels KIVI quantizes keys along); ``group`` the GQA group of the queries."""

    B: int
    H: int
    T: int
    D: int
    fmt: str
    outlier: float = 1.0
    group: int = 1

    def format(self) -> kv_contract.KVFormat:
        if self.fmt in kv_contract.KV_FORMATS:
            return kv_contract.KV_FORMATS[self.fmt]
        _, r, g = self.fmt.split(":")                                 # "kivi:R:G"
        return kv_contract.kv_format("int4_kivi", int(r), int(g))


def make_kv(case: KVCase, seed: int, dtype, device):
    """(q, k, v): q (B, H group, T, D), k, v (B, H, T, D) N(0, 1) in ``dtype``; key channel
    seed % D and value token seed % T times ``outlier``; the first token of row 0 all zero."""
    g = torch.Generator().manual_seed(seed)
    B, H, T, D = case.B, case.H, case.T, case.D
    q = torch.randn(B, H * case.group, T, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, H, T, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, H, T, D, generator=g, dtype=torch.float64)
    k[..., seed % D] *= case.outlier
    v[:, :, seed % T] *= case.outlier
    k[0, :, 0], v[0, :, 0] = 0.0, 0.0
    return tuple(t.to(dtype).to(device) for t in (q, k, v))


KV_FORMAT_NAMES = tuple(kv_contract.KV_FORMATS) + ("kivi:0:4", "kivi:3:5")


@st.composite
def kv_cases(draw) -> KVCase:
    return KVCase(draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 40)),
                  draw(st.sampled_from([1, 2, 3, 8, 16, 17])), draw(st.sampled_from(KV_FORMAT_NAMES)),
                  draw(st.sampled_from([1.0, 30.0])), draw(st.sampled_from([1, 2])))


#: Pinned: each format with an outlier channel over several KIVI groups (both KV_ZOO entries die
#: on the KIVI ones), odd D, one token, GQA, and a KIVI cache shorter than its residual.
KV_EXAMPLES = tuple(dict(case=c, seed=s) for c, s in (
    (KVCase(2, 2, 37, 16, "int4_kivi_r8_g8", 30.0, 2), 3), (KVCase(1, 3, 24, 17, "kivi:0:4", 30.0), 5),
    (KVCase(2, 2, 33, 16, "int8", 30.0, 2), 1), (KVCase(1, 2, 19, 8, "fp8_e4m3fn", 30.0), 2),
    (KVCase(1, 1, 1, 3, "fp8_e5m2"), 4), (KVCase(2, 1, 29, 8, "kivi:3:5", 1.0, 2), 6),
    (KVCase(1, 2, 5, 8, "int4_kivi_r8_g8", 30.0), 7)))                 # KIVI with no token quantized yet

KV_IMPLS = {"reference": "inference_conformance.reference.quantization.kv:KV_REFERENCE", "torch": "inference_conformance.optimized.quantization.kv:KV_TORCH"}


def _kv_impl(name: str):
    import importlib

    module, attr = KV_IMPLS[name].split(":")
    ops = getattr(importlib.import_module(module), attr)
    return as_impl(name, KV_IMPLS[name], quantize_kv=ops.quantize_kv, dequantize_kv=ops.dequantize_kv,
                    kv_nbytes=ops.kv_nbytes)


def law_kv_within_step(run, device, dtype, case, seed):
    """QT-12: every element of dequantize_kv(quantize_kv(k, v)) within the contract's kv_bound
    (half a step of its token or channel group; FP8: half an ulp); full-precision tokens exact."""
    note(str(case))
    _, k, v = make_kv(case, seed, dtype, device)
    fmt = case.format()
    k_hat, v_hat = run.impl.dequantize_kv(run.impl.quantize_kv(k, v, fmt))
    for name, got, x in (("k", k_hat, k), ("v", v_hat, v)):
        assert got.shape == x.shape and got.dtype == x.dtype, (name, got.shape, got.dtype)
        check_within(got, x, kv_contract.kv_bound(x, fmt, name), what=f"{fmt.name} {name} ({case})",
                     rule="QT-12 half step").check()
    run.observe(fmt.kind)


QT12_FORMAT = Law(claim="QT-12", technique=TECH, body=law_kv_within_step, given={"case": kv_cases(), "seed": S.seeds},
                  examples=KV_EXAMPLES, dtypes=(torch.float64, torch.float32), max_examples=lambda n: max(4, n // 2))


@pytest.mark.claim("QT-12")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("which", list(KV_IMPLS))
def test_qt12_kv_within_step(which, device, dtype):
    run = QT12_FORMAT(_kv_impl(which), device, dtype)
    assert {"int8", "int4_kivi", *FORMATS} <= set(run.observations), run.observations
    if run.worst is not None:
        results.record("QT-12", measured=run.worst.error, bound=run.worst.bound, unit="max |x - x_hat| / bound",
                       rule="int8 / FP8 per token, int4 KIVI keys per channel, values per token: within half a step")


@pytest.mark.claim("QT-12")
@pytest.mark.parametrize("name", list(KV_ZOO))
def test_qt12_kv_zoo_rejected(name, device):
    bad = KV_ZOO[name]
    impl = as_impl(name, f"inference_conformance.properties.quantization.zoo:KV_ZOO[{name!r}]", quantize_kv=bad.quantize_kv,
                    dequantize_kv=bad.dequantize_kv, kv_nbytes=bad.kv_nbytes)
    text = expect_rejected(QT12_FORMAT, impl, device, torch.float64)
    results.record("QT-12", measured="rejected", unit="known-bad KV-cache format", rule="QT-12 format law",
                   what=f"{name}: {text[:120]}")


def _causal(T: int, device) -> torch.Tensor:
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()[None, None]


def law_kv_attention(run, device, case, seed):
    """QT-12: attention over the quantized cache (a prefill through QuantizedKVCache: each query
    sees the cache as decode holds it then) within the contract's attention_bound of exact
    attention, float64; the bound comes from the steps alone (kv_bound), plus 64 ulp of max|v|
    for float64 rounding."""
    from inference_conformance.optimized.quantization.kv import QuantizedKVCache
    from inference_conformance.reference.quantization.kv import KVOps
    from inference_conformance.reference.transformer import naive_attention

    note(str(case))
    q, k, v = make_kv(case, seed, torch.float64, device)
    fmt = case.format()
    out = QuantizedKVCache(fmt, KVOps(run.impl.name, run.impl)).attend(0, q, k, v)
    mask = _causal(case.T, device)
    out_ref = naive_attention(q, k, v, mask)
    bound = kv_contract.attention_bound(q, k, v, kv_contract.kv_bound(k, fmt, "k"), kv_contract.kv_bound(v, fmt, "v"),
                                     case.D ** -0.5, mask)
    bound = bound + 64 * torch.finfo(torch.float64).eps * float(v.abs().max())
    check_within(out, out_ref, bound, what=f"attention over {fmt.name} ({case})", rule="QT-12 attention bound").check()


QT12_ATTENTION = Law(claim="QT-12", technique=TECH, body=law_kv_attention, params=("device",),
                     given={"case": kv_cases(), "seed": S.seeds}, examples=KV_EXAMPLES, max_examples=lambda n: 4)


@pytest.mark.claim("QT-12")
def test_qt12_attention_within_the_step_bound(device):
    run = QT12_ATTENTION(_kv_impl("torch"), device)
    if run.worst is not None:
        results.record("QT-12", measured=run.worst.error, bound=run.worst.bound, unit="max |out - out_ref| / bound",
                       rule="attention over the quantized cache within (e^(2e) - 1) range(v)/2 + max dv")


@pytest.mark.claim("QT-12")
@pytest.mark.parametrize("fmt", ["int4_kivi_r8_g8", "int8"])
def test_qt12_cache_prefill_in_pieces_equals_one_prefill(fmt):
    """Appending a sequence to the quantized cache in pieces (a prefill of 11, one decode token,
    then pieces of 5 and 20) gives the same outputs as one prefill of all 37 tokens (float64, to
    1e-12 relative): a group once quantized never changes, and each query sees the cache as
    decode holds it."""
    from inference_conformance.optimized.quantization.kv import QuantizedKVCache

    case = KVCase(2, 2, 37, 16, fmt, 30.0, 2)
    q, k, v = make_kv(case, 3, torch.float64, "cpu")
    whole = QuantizedKVCache(kv_contract.KV_FORMATS[fmt]).attend(0, q, k, v)
    cache = QuantizedKVCache(kv_contract.KV_FORMATS[fmt])
    pieces = [cache.attend(0, q[:, :, a:b], k[:, :, a:b], v[:, :, a:b]) for a, b in ((0, 11), (11, 12), (12, 17), (17, 37))]
    got = torch.cat(pieces, dim=2)
    err = float((got - whole).abs().max() / whole.abs().max())
    assert err <= 1e-12, err
    assert cache.tokens == 37


@pytest.mark.claim("QT-12")
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
