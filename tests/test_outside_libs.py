"""The CPU libraries' adapters (optimized/attention/outside.py, optimized/quantization/outside.py):
each adapter's layout on one small call, their registration (unavailable outside the peers-libs
environment, with the reason), and the minimal reproductions of what the laws found in each
library, pinned to the version tested (requirements/peers-libs.txt). A reproduction asserts the
correct behaviour and is a strict expected failure while the library's bug stands: a fixed
version makes it fail until the entry goes. Each is skipped where its package is missing.
"""
from __future__ import annotations

import importlib.metadata

import pytest
import torch

from inference_conformance.conformance import registry
from inference_conformance.conformance.contracts.quantization import bounds as qcontract
from inference_conformance.reference.attention import attention_naive

ATTENTION = ("flex_attention", "sdpa_math", "sdpa_flash_cpu", "jax", "ort_attention", "ort_mha", "ort_gqa")
QUANTIZATION = ("bnb_int8", "compressed_tensors", "compressed_tensors_asym", "quanto_int8", "quanto_intx",
                "gguf_q8_0", "gguf_q4_0")
PACKAGES = {"jax": "jax", "ort_attention": "onnxruntime", "ort_mha": "onnxruntime", "ort_gqa": "onnxruntime",
            "bnb_int8": "bitsandbytes", "compressed_tensors": "compressed_tensors",
            "compressed_tensors_asym": "compressed_tensors", "quanto_int8": "optimum.quanto",
            "quanto_intx": "optimum.quanto", "gguf_q8_0": "gguf", "gguf_q4_0": "gguf"}


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _peer_environment() -> None:
    """Skip outside the peers-libs environment (the main suite does not spend its time here)."""
    if "libs" not in registry.peer_sets():
        pytest.skip(f"runs in the peers-libs environment (tox -e peers-libs: {registry.PEERS_VARIABLE}=libs)")


def _impl(technique: str, name: str):
    """The registered adapter, called directly; skipped outside the peers-libs environment and
    where its package is missing."""
    _peer_environment()
    if name in PACKAGES:
        pytest.importorskip(PACKAGES[name], reason=f"{name} needs {PACKAGES[name]}")
    reg = [r for r in registry.registrations(technique)[0] if r.name == name][0]
    return reg.impl


@pytest.mark.parametrize("technique,name", [("attention", n) for n in ATTENTION] +
                         [("quantization", n) for n in QUANTIZATION])
def test_registered_for_the_peer_environment_only(technique, name, monkeypatch):
    """Each adapter is registered, and listed unavailable (naming the environment) unless
    INFERENCE_CONFORMANCE_PEERS names "libs"."""
    monkeypatch.setenv(registry.PEERS_VARIABLE, "")
    (impl,) = [i for i in registry.builtins(technique, "cpu") if i.name == name]
    assert impl.adapter and impl.unavailable is not None
    assert "peers-libs" in impl.unavailable or "not installed" in impl.unavailable, impl.unavailable
    monkeypatch.setenv(registry.PEERS_VARIABLE, "hf,libs")
    (impl,) = [i for i in registry.builtins(technique, "cpu") if i.name == name]
    if name not in PACKAGES or registry.importable(PACKAGES[name]):
        assert impl.unavailable is None, impl.unavailable


# --------------------------------------------------------------------------- layouts (one call)

def _qkv(dtype, B=2, Hq=4, Hkv=2, Tq=3, Tk=7, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g, dtype=torch.float64).to(dtype)
            for H, T in ((Hq, Tq), (Hkv, Tk), (Hkv, Tk))]


@pytest.mark.parametrize("name", ATTENTION)
def test_attention_layout(name):
    """One causal GQA call with Tq < Tk (B=2, Hq=4, Hkv=2, Tq=3, Tk=7, D=8, float32; MHA for
    ort_mha) against the float64 reference at float32's tolerance: heads, batch, the bottom-right
    mask and the output layout all go through the library."""
    f = _impl("attention", name)
    q, k, v = _qkv(torch.float32, Hkv=4 if name == "ort_mha" else 2)
    out = f(q, k, v, causal=True, scale=0.3)
    ref = attention_naive(q.double(), k.double(), v.double(), causal=True, scale=0.3)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert (out.double() - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()


@pytest.mark.parametrize("name", QUANTIZATION)
def test_quantization_layout(name):
    """quantize -> dequantize of one (4, 64) float32 weight at each adapter's own format (4 bits in
    groups of 32 where it takes it, else 8 bits per channel / in blocks of 32) comes back in w's
    shape, dtype and within the bound of its declared scheme; matmul, where the library has
    one, is x @ dequantize(qw).T."""
    impl = _impl("quantization", name)
    w = torch.randn(4, 64, generator=torch.Generator().manual_seed(1), dtype=torch.float64).float()
    for bits, gran in ((4, 32), (8, 32), (8, "channel")):
        try:
            qw = impl.quantize(w, bits=bits, granularity=gran)
            break
        except NotImplementedError:
            continue
    d = impl.dequantize(qw)
    assert d.shape == w.shape and d.dtype == w.dtype
    bound = qcontract.half_step_bound(w, bits, gran, getattr(impl, "symmetric", True),
                                      scheme=getattr(impl, "scheme", None))
    assert bool(((d.double() - w.double()).abs() <= bound).all())
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2))
    try:
        out = impl.matmul(x, qw)
    except NotImplementedError:
        return
    ref = x.double() @ d.double().T
    assert (out.double() - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()


def test_ct_packs_codes_into_int32():
    """compressed-tensors' pack-quantized layout: 4-bit codes, eight to an int32 along K."""
    impl = _impl("quantization", "compressed_tensors")
    qw = impl.quantize(torch.randn(4, 64), bits=4, granularity=32)
    packed = qw.data[0]
    assert packed.dtype == torch.int32 and tuple(packed.shape) == (4, 8)


def test_declared_schemes_bound_what_they_promise():
    """The scheme bounds, worked by hand: absmax-full-range's step at 4 bits is max|w| / 7.5;
    Q4_0's element opposite the block's extreme, clipped at 7 steps, may be off by |w| - 7 s,
    which the contract's absmax bound (s/2 of max|w| / 7) does not allow."""
    w = torch.zeros(1, 32, dtype=torch.float32)
    w[0, 0], w[0, 1] = 1.0, -1.0
    full = qcontract.half_step_bound(w, 4, 32, scheme="absmax-full-range")
    assert full[0, 2].item() == pytest.approx(1 / 7.5 / 2, rel=1e-3)
    q40 = qcontract.half_step_bound(w, 4, 32, scheme="gguf-q4_0")
    assert q40[0, 1].item() >= 1 / 8 > qcontract.half_step_bound(w, 4, 32)[0, 1].item()
    assert q40[0, 2].item() < 1 / 8 * 0.51                      # the others stay within half a step
    with pytest.raises(ValueError, match="scheme"):
        qcontract.half_step_bound(w, 4, 32, scheme="nf4")


# ------------------------------------------------------------------- minimal reproductions

def _xfail(dist: str, what: str):
    return pytest.mark.xfail(strict=True, reason=f"{dist} {_version(dist)}: {what}")


@pytest.fixture(autouse=True)
def _reproductions_in_the_peer_environment(request):
    if request.node.get_closest_marker("xfail") is not None:
        _peer_environment()


@_xfail("bitsandbytes", "int8_vectorwise_dequant returns inf once a row's absmax passes float32 max / 127 "
                        "(2e36 fine, 3e36 inf), as if codes x absmax were formed in float32 before the division by 127")
def test_bnb_int8_dequant_of_a_large_row_is_finite():
    F = pytest.importorskip("bitsandbytes.functional")
    for amax in (2e36, 3e36):
        w = torch.tensor([[amax, 1.0, -amax / 2]], dtype=torch.float32)
        codes, stats, _ = F.int8_vectorwise_quant(w)
        d = F.int8_vectorwise_dequant(codes, stats)
        assert bool(torch.isfinite(d).all()), f"absmax {amax:g}: {d.tolist()}"


@_xfail("torch", "the CPU flash SDPA kernel (sdpa_kernel(SDPBackend.FLASH_ATTENTION)) returns NaN for "
                 "is_causal=True with a negative scale; the math backend is right")
def test_sdpa_flash_cpu_causal_negative_scale():
    from inference_conformance.optimized.attention import outside as oa

    q, k, v = _qkv(torch.float32, B=1, Hq=2, Hkv=2, Tq=5, Tk=5, D=16)
    out = oa.sdpa_flash_cpu(q, k, v, causal=True, scale=-0.5)
    ref = attention_naive(q.double(), k.double(), v.double(), causal=True, scale=-0.5)
    assert (out.double() - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()


@_xfail("jax", "jax.nn.dot_product_attention (implementation='xla', CPU) computes float64 inputs' softmax "
               "in float32: errors ~6e-8 against the float64 rule's 1e-12 x max|out|")
def test_jax_float64_attention_is_float64_accurate():
    pytest.importorskip("jax")
    from inference_conformance.optimized.attention import outside as oa

    q, k, v = _qkv(torch.float64, B=1, Hq=2, Hkv=2, Tq=3, Tk=4, D=8)
    out = oa.jax_attention(q, k, v, causal=False, scale=0.3)
    ref = attention_naive(q, k, v, causal=False, scale=0.3)
    assert out.dtype == torch.float64
    assert (out - ref).abs().max().item() <= 1e-12 * ref.abs().max().item()


@_xfail("onnxruntime", "the ONNX Attention op (opset 23) in float64 with a boolean attn_mask is off by "
                       "~1e-8 (float32-sized); without a mask it is exact to 2e-16")
def test_ort_attention_float64_with_a_mask_is_float64_accurate():
    pytest.importorskip("onnxruntime")
    from inference_conformance.optimized.attention import outside as oa

    q, k, v = _qkv(torch.float64)
    out = oa.ort_attention(q, k, v, causal=True, scale=0.3)              # Tq < Tk: a boolean mask
    ref = attention_naive(q, k, v, causal=True, scale=0.3)
    assert (out - ref).abs().max().item() <= 1e-12 * ref.abs().max().item()


@pytest.mark.parametrize("name", ["ort_mha", "ort_gqa"])
@_xfail("onnxruntime", "com.microsoft.MultiHeadAttention and GroupQueryAttention (CPU) read scale = 0 as "
                       "their default 1/sqrt(D): the output is attention at 1/sqrt(D), 0.4-1.8 off at scale 0")
def test_ort_contrib_attention_scale_zero(name):
    pytest.importorskip("onnxruntime")
    from inference_conformance.optimized.attention import outside as oa

    q, k, v = _qkv(torch.float32, B=1, Hq=2, Hkv=2, Tq=4, Tk=4, D=8)
    out = getattr(oa, name)(q, k, v, causal=True, scale=0.0)
    ref = attention_naive(q.double(), k.double(), v.double(), causal=True, scale=0.0)
    assert (out.double() - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()


@_xfail("torchao", "IntxWeightOnlyConfig(granularity=PerGroup(1)) crashes inside choose_qparams: RuntimeError "
                   "\"shape '[N, K]' is invalid for input of size 1\" (a crash, not a documented refusal)")
def test_torchao_intx_group_of_one():
    pytest.importorskip("torchao")
    from torchao.quantization import IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    lin = torch.nn.Linear(8, 4, bias=False)
    w = lin.weight.detach().clone()
    quantize_(lin, IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(1), scale_dtype=torch.float32))
    assert (lin.weight.dequantize() - w).abs().max().item() <= 1e-6 * w.abs().max().item()   # one scale per weight


@_xfail("optimum-quanto", "a qint8 weight times a bfloat16 x (torch.nn.functional.linear, CPU) returns "
                          "non-finite or wrong values (a worker crashed once in the law run)")
def test_quanto_int8_bfloat16_matmul():
    pytest.importorskip("optimum.quanto")
    from inference_conformance.optimized.quantization.outside import quanto_int8

    worst = 0.0
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(4, 8, generator=g).to(torch.bfloat16)
        x = torch.randn(3, 8, generator=g).to(torch.bfloat16)
        qw = quanto_int8.quantize(w, bits=8, granularity="channel")
        ref = x.double() @ quanto_int8.dequantize(qw).double().T
        err = (quanto_int8.matmul(x, qw).double() - ref).abs().max().item()
        worst = max(worst, err if err == err else float("inf"))
    assert worst <= 0.05, f"worst error {worst} over 20 seeds (outputs of magnitude ~5)"


# ------------------------------------------- FA-8's options through GroupQueryAttention (ort_gqa)

def _gqa_without_scale_zero():
    """ort_gqa as a test implementation that refuses scale 0 (ONNX Runtime's known answer there,
    reproduced by test_ort_contrib_attention_scale_zero and listed for FA-3): what FA-8 adds is
    the options, judged here on every other call."""
    import types

    from inference_conformance.conformance.registry import Implementation
    from inference_conformance.optimized.attention import outside as oa

    def attention(q, k, v, *, causal, scale, window=None, softcap=None, sinks=None):
        if scale == 0:
            raise NotImplementedError("scale 0: test_ort_contrib_attention_scale_zero")
        return oa.ort_gqa(q, k, v, causal=causal, scale=scale, window=window, softcap=softcap, sinks=sinks)

    return Implementation("attention", "ort_gqa", "tests:ort_gqa", "outside",
                          types.SimpleNamespace(attention=attention), ("attention",))


@pytest.mark.claim("FA-8")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
def test_ort_gqa_fa8_options(dtype):
    """FA-8's law on ort_gqa in the dtypes its kernel takes (the law's own test runs float64 and
    bfloat16, which GroupQueryAttention refuses): local_window_size, softcap and head_sink equal
    the float64 reference with the same options on every example that ran, and the options'
    boundary classes are reached (sinks in float32 only: in float16 the adapter refuses float32
    sinks not exact in float16)."""
    _impl("attention", "ort_gqa")
    from inference_conformance.properties.attention.feature_cases import FA8

    run = FA8(_gqa_without_scale_zero(), "cpu", dtype)
    reached = " | ".join(sorted(run.reached))
    assert run.ran >= 5, (run.ran, run.refused[:3])
    expected = ["window shorter than a key tile", "window skipping whole key tiles", "softcap below the largest logit"]
    if dtype == torch.float32:              # float16: the pinned sinks cases are refused (float32 sinks)
        expected += ["window longer than Tk", "sinks above every row's largest logit"]
    for what in expected:
        assert what in reached, (what, reached)


def test_ort_gqa_options_one_call():
    """One call with all three options (B=2, Hq=4, Hkv=2, Tq=3, Tk=7, D=8, float32: the
    batch-split path) and window W in 1, 2, 6, 7, 9: ONNX Runtime's local_window_size counts the
    query's own key (W = 1: each query sees only its own key), as the contract's window; and a
    float16 call refuses float32 sinks not exact in float16 (ONNX Runtime takes head_sink in the
    query's type only) and takes exact ones."""
    f = _impl("attention", "ort_gqa")
    q, k, v = _qkv(torch.float32)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.25])
    for window in (1, 2, 6, 7, 9):
        opts = dict(window=window, softcap=2.0, sinks=sinks)
        out = f(q, k, v, causal=True, scale=0.3, **opts)
        ref = attention_naive(q.double(), k.double(), v.double(), causal=True, scale=0.3, **opts)
        assert (out.double() - ref).abs().max().item() <= 1e-5 * ref.abs().max().item(), window
    q16, k16, v16 = _qkv(torch.float16)
    with pytest.raises(NotImplementedError, match="head_sink"):
        f(q16, k16, v16, causal=True, scale=0.3, sinks=sinks + 1e-4)
    out = f(q16, k16, v16, causal=True, scale=0.3, sinks=sinks)
    ref = attention_naive(q16.double(), k16.double(), v16.double(), causal=True, scale=0.3, sinks=sinks.double())
    assert (out.double() - ref).abs().max().item() <= 2e-3 * ref.abs().max().item()


def test_ort_gqa_bidirectional():
    """A non-causal call (B=2, Tq=3 < Tk=7: the batch-split path; and Tq = Tk = 7) through
    GroupQueryAttention's ``causal`` = 0, with and without a cap and sinks, equals the float64
    reference: every query sees every key."""
    f = _impl("attention", "ort_gqa")
    for Tq in (3, 7):
        q, k, v = _qkv(torch.float32, Tq=Tq)
        for opts in ({}, dict(softcap=2.0, sinks=torch.tensor([0.5, -1.0, 2.0, 0.25]))):
            out = f(q, k, v, causal=False, scale=0.3, **opts)
            ref = attention_naive(q.double(), k.double(), v.double(), causal=False, scale=0.3, **opts)
            assert (out.double() - ref).abs().max().item() <= 1e-5 * ref.abs().max().item(), (Tq, opts)
