"""Bad input to every built-in attention implementation: a clear TypeError / ValueError that
names the argument, raised on the host before any kernel runs."""
import math

import pytest
import torch

from inference_conformance.conformance import registry


def _impls():
    return [pytest.param(i, id=i.name, marks=[pytest.mark.skip(reason=i.unavailable)] if i.unavailable else [])
            for i in registry.builtins("attention", "cpu")]


def _qkv(B=1, Hq=4, Hkv=2, Tq=3, Tk=5, D=8, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(B, Hq, Tq, D, generator=g).to(dtype), torch.randn(B, Hkv, Tk, D, generator=g).to(dtype),
            torch.randn(B, Hkv, Tk, D, generator=g).to(dtype))


def _bad_cases():
    q, k, v = _qkv()
    return [
        ("q not a tensor", (q.tolist(), k, v), {}, TypeError, r"\bq\b.*torch\.Tensor"),
        ("k with 3 dims", (q, k[0], v), {}, ValueError, r"\bk\b.*4 dimensions"),
        ("integer dtype", (q.long(), k.long(), v.long()), {}, TypeError, r"\bq\b.*dtype"),
        ("mixed dtypes", (q, k.double(), v), {}, TypeError, r"one dtype"),
        ("k, v shapes differ", (q, k, v[:, :, :4]), {}, ValueError, r"\bk\b and \bv\b.*same shape"),
        ("batch differs", (q, torch.cat([k, k]), torch.cat([v, v])), {}, ValueError, r"batch"),
        ("head dim differs", (q, k[..., :4], v[..., :4]), {}, ValueError, r"head dim"),
        ("Hq not a multiple of Hkv", _qkv(Hq=3, Hkv=2), {}, ValueError, r"multiple"),
        ("D = 257", _qkv(D=257), {}, ValueError, r"head dim D.*1\.\.256"),
        ("Tq = 0", _qkv(Tq=0), {}, ValueError, r"Tq"),
        ("Tk = 0", _qkv(Tk=0), {"causal": False}, ValueError, r"Tk"),
        ("causal not a bool", (q, k, v), {"causal": 1}, TypeError, r"causal"),
        ("scale a string", (q, k, v), {"scale": "0.3"}, TypeError, r"scale"),
        ("scale a bool", (q, k, v), {"scale": True}, TypeError, r"scale"),
        ("scale nan", (q, k, v), {"scale": math.nan}, ValueError, r"scale"),
        ("scale 1e40 with float32 inputs", (q, k, v), {"scale": 1e40}, ValueError, r"scale.*float32"),
        ("scale -1e300 with bfloat16 inputs", tuple(t.bfloat16() for t in (q, k, v)), {"scale": -1e300},
         ValueError, r"scale.*float32"),
        ("causal with Tq > Tk", _qkv(Tq=6, Tk=5), {"causal": True}, ValueError, r"Tq <= Tk"),
        ("k on another device", (q, k.to("meta"), v), {}, ValueError, r"one device"),
        ("all on the meta device", (q.to("meta"), k.to("meta"), v.to("meta")), {}, ValueError, r"cpu or cuda"),
    ]


@pytest.mark.parametrize("impl", _impls())
@pytest.mark.parametrize("name,args,kwargs,exc,match", _bad_cases(), ids=[c[0] for c in _bad_cases()])
def test_bad_input_raises_naming_the_argument(impl, name, args, kwargs, exc, match):
    kw = {"causal": False, "scale": 0.3, **kwargs}
    with pytest.raises(exc, match=match):
        impl(*args, **kw)


def test_triton_rejects_bad_tile_sizes():
    fa = pytest.importorskip("inference_conformance.optimized.attention.flash_attention")
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="block_m.*power of two"):
        fa.flash_attention(q, k, v, causal=False, scale=0.3, block_m=24)
    with pytest.raises(ValueError, match="block_n.*>= 16"):
        fa.flash_attention(q, k, v, causal=False, scale=0.3, block_n=8)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_split_kv_rejects_bad_num_splits(bad):
    fd = pytest.importorskip("inference_conformance.optimized.attention.flash_decoding")
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="num_splits"):
        fd.flash_decoding(q, k, v, causal=False, scale=0.3, num_splits=bad)


def test_batch_invariant_mode_rejects_num_splits():
    """The batch-invariant mode fixes its split size: a ``num_splits`` with it is a ValueError
    naming it, and so is a key tile < 1 for ``keys_per_split``."""
    fd = pytest.importorskip("inference_conformance.optimized.attention.flash_decoding")
    from inference_conformance.optimized.attention.batch_invariant import keys_per_split

    q, k, v = _qkv()
    with pytest.raises(ValueError, match="num_splits must be None with batch_invariant"):
        fd.flash_decoding(q, k, v, causal=False, scale=0.3, num_splits=2, batch_invariant=True)
    with pytest.raises(ValueError, match="block_n"):
        keys_per_split(0, q.device)


def test_triton_needs_cuda_tensors_without_the_interpreter(monkeypatch):
    fa = pytest.importorskip("inference_conformance.optimized.attention.flash_attention")
    fd = pytest.importorskip("inference_conformance.optimized.attention.flash_decoding")
    shared = pytest.importorskip("inference_conformance.optimized.triton_shared")
    monkeypatch.setattr(shared, "triton_interpreted", lambda: False)
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="q is on cpu.*CUDA"):
        fa.flash_attention(q, k, v, causal=False, scale=0.3)
    with pytest.raises(ValueError, match="q is on cpu.*CUDA"):
        fd.flash_decoding(q, k, v, causal=False, scale=0.3)


def test_reference_blocked_rejects_bad_blocks():
    from inference_conformance.reference.attention import blocked_attention, online_softmax, split_kv_attention

    q, k, v = _qkv()
    with pytest.raises(ValueError, match="block sizes"):
        blocked_attention(q, k, v, causal=False, scale=0.3, block_k=0)
    with pytest.raises(ValueError, match="num_splits"):
        split_kv_attention(q, k, v, causal=False, scale=0.3, num_splits=0)
    with pytest.raises(ValueError, match="chunks"):
        online_softmax(torch.zeros(5), [2, 2])


def _bad_options():
    q, k, v = _qkv()
    return [
        ("window a float", {"causal": True, "window": 2.0}, TypeError, r"window"),
        ("window a bool", {"causal": True, "window": True}, TypeError, r"window"),
        ("window 0", {"causal": True, "window": 0}, ValueError, r"window.*>= 1"),
        ("window without causal", {"window": 3}, ValueError, r"window.*causal"),
        ("softcap a string", {"softcap": "30"}, TypeError, r"softcap"),
        ("softcap negative", {"softcap": -1.0}, ValueError, r"softcap.*positive"),
        ("softcap nan", {"softcap": math.nan}, ValueError, r"softcap"),
        ("softcap 1e40 with float32 inputs", {"softcap": 1e40}, ValueError, r"softcap.*float32"),
        ("sinks a list", {"sinks": [0.0] * 4}, TypeError, r"sinks"),
        ("sinks integer", {"sinks": torch.zeros(4, dtype=torch.long)}, TypeError, r"sinks"),
        ("sinks per KV head", {"sinks": torch.zeros(2)}, ValueError, r"sinks.*\(Hq,\)"),
        ("sinks 2-D", {"sinks": torch.zeros(1, 4)}, ValueError, r"sinks"),
        ("sinks inf", {"sinks": torch.tensor([0.0, math.inf, 0.0, 0.0])}, ValueError, r"sinks.*finite"),
        ("sinks on another device", {"sinks": torch.zeros(4, device="meta")}, ValueError, r"sinks.*device"),
    ]


@pytest.mark.parametrize("impl", _impls())
@pytest.mark.parametrize("name,kwargs,exc,match", _bad_options(), ids=[c[0] for c in _bad_options()])
def test_bad_option_raises_naming_it(impl, name, kwargs, exc, match):
    """Claim FA-8's options: a wrong value raises TypeError / ValueError naming the option, in
    every built-in that takes it (one that lacks the option is "unsupported" for it)."""
    from inference_conformance.conformance.contracts.attention import OPTIONS, accepts_options

    lacking = (set(kwargs) & set(OPTIONS)) - accepts_options(impl)
    if lacking:
        pytest.skip(f"unsupported: {impl.name} takes no {sorted(lacking)}")
    q, k, v = _qkv()
    with pytest.raises(exc, match=match):
        impl(q, k, v, **{"causal": False, "scale": 0.3, **kwargs})


def test_an_implementation_lacking_an_option_is_refused_not_passed():
    """``accepts_options`` reads the signature: a function without the keyword lacks the option,
    and the invalid calls of the contract refuse it (NotImplementedError: "unsupported")."""
    from inference_conformance.conformance.contracts import attention as contract

    def plain(q, k, v, *, causal, scale):
        return q

    def windowed(q, k, v, *, causal, scale, window=None):
        return q

    assert contract.accepts_options(plain) == frozenset()
    assert contract.accepts_options(windowed) == {"window"}
    assert contract.accepts_options(lambda q, k, v, **kw: q) == set(contract.OPTIONS)
    calls = [c for c in contract.invalid("cpu") if "sinks" in c.kwargs]
    assert calls
    with pytest.raises(NotImplementedError, match="sinks"):
        calls[0].on(windowed)
