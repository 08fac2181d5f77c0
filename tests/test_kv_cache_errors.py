"""Bad input to the KV-cache engines and to the cache-append kernel: a clear TypeError /
ValueError (RuntimeError for decode before prefill) that names the argument, raised before
anything is written: the cache, outside the slots a valid call writes, stays unchanged."""
from __future__ import annotations

import pytest
import torch

from inference_conformance.conformance.tolerance import assert_exact
from inference_conformance.optimized import kv_cache as engines
from inference_conformance.optimized.kv_cache.append import StaticKVCache, kv_append, kv_append_torch
from inference_conformance.reference.transformer import TransformerConfig, build

CFG = TransformerConfig(vocab_size=19, d_model=12, n_layers=2, n_heads=3, n_kv_heads=1, d_ff=16,
                        max_seq_len=16, head_dim=4)
ENGINES = {"triton": engines.TRITON, "torch": engines.TORCH}
APPENDS = {"triton": kv_append, "torch": kv_append_torch}


#: tiny tensors: one intra-op thread is fastest and avoids OpenMP spin-waits between xdist workers
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(params=list(ENGINES))
def engine(request, device):
    """An engine (max_batch 3, capacity 6) holding two sequences of lengths 3 and 1."""
    model = build(CFG, seed=0, dtype=torch.float32, device=device)
    e = ENGINES[request.param].new_engine(model, max_batch=3, max_seq_len=6)
    e.prefill(torch.tensor([[1, 2, 3], [4, 0, 0]], device=device), torch.tensor([3, 1], device=device))
    return e


def snapshot(e):
    return e.cache.k.clone(), e.cache.v.clone(), e.lengths()


def assert_unchanged(e, snap):
    k, v, lengths = snap
    assert_exact(e.cache.k, k, what="K cache after a rejected call")
    assert_exact(e.cache.v, v, what="V cache after a rejected call")
    assert_exact(e.lengths(), lengths, what="lengths after a rejected call")


@pytest.mark.parametrize("tokens, lengths, error, match", [
    ([[1, 2]], [2], TypeError, "tokens must be a torch.Tensor"),
    (torch.tensor([[1, 2]], dtype=torch.int32), torch.tensor([2]), TypeError, "tokens must be int64"),
    (torch.tensor([[1.0, 2.0]]), torch.tensor([2]), TypeError, "tokens must be int64"),
    (torch.tensor([1, 2]), torch.tensor([2]), ValueError, r"tokens must have shape \(B, S\)"),
    (torch.tensor([[1, 2]]), [2], TypeError, "lengths must be a torch.Tensor"),
    (torch.tensor([[1, 2]]), torch.tensor([2.0]), TypeError, "lengths must be int64"),
    (torch.tensor([[1, 2]]), torch.tensor([2, 2]), ValueError, r"lengths must have shape \(1,\)"),
    (torch.tensor([[1, 2]]), torch.tensor([0]), ValueError, "lengths must lie in"),
    (torch.tensor([[1, 2]]), torch.tensor([3]), ValueError, "lengths must lie in"),
    (torch.tensor([[1, 19]]), torch.tensor([2]), ValueError, "tokens holds token ids outside"),
    (torch.tensor([[-1, 2]]), torch.tensor([2]), ValueError, "tokens holds token ids outside"),
    (torch.zeros(4, 2, dtype=torch.int64), torch.full((4,), 2), ValueError, "max_batch=3"),
    (torch.zeros(1, 7, dtype=torch.int64), torch.tensor([7]), ValueError, "max_seq_len=6"),
    (torch.zeros(0, 2, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), ValueError, "batch 0"),
])
def test_prefill_rejects_bad_input(engine, device, tokens, lengths, error, match):
    move = (lambda x: x.to(device) if isinstance(x, torch.Tensor) else x)
    snap = snapshot(engine)
    with pytest.raises(error, match=match):
        engine.prefill(move(tokens), move(lengths))
    assert_unchanged(engine, snap)


@pytest.mark.parametrize("which", ["tokens", "lengths"])
def test_prefill_rejects_other_device(engine, device, which):
    tokens, lengths = torch.tensor([[1, 2]], device=device), torch.tensor([2], device=device)
    args = {"tokens": tokens, "lengths": lengths}
    args[which] = args[which].to("meta")
    snap = snapshot(engine)
    with pytest.raises(ValueError, match=f"{which} is on meta"):
        engine.prefill(**args)
    assert_unchanged(engine, snap)


@pytest.mark.parametrize("next_tokens, error, match", [
    ([1, 2], TypeError, "next_tokens must be a torch.Tensor"),
    (torch.tensor([1, 2], dtype=torch.int32), TypeError, "next_tokens must be int64"),
    (torch.tensor([1, 2, 3]), ValueError, r"next_tokens must have shape \(2,\)"),
    (torch.tensor([[1], [2]]), ValueError, r"next_tokens must have shape \(B,\)"),
    (torch.tensor([1, 19]), ValueError, "next_tokens holds token ids outside"),
    (torch.tensor([1, 2]).to("meta"), ValueError, "next_tokens is on meta"),
])
def test_decode_rejects_bad_input(engine, device, next_tokens, error, match):
    if isinstance(next_tokens, torch.Tensor) and next_tokens.device.type != "meta":
        next_tokens = next_tokens.to(device)
    snap = snapshot(engine)
    with pytest.raises(error, match=match):
        engine.decode(next_tokens)
    assert_unchanged(engine, snap)


def test_decode_past_capacity_writes_nothing(engine, device):
    for _ in range(3):  # the longest sequence reaches the capacity, 6
        engine.decode(torch.tensor([5, 6], device=device))
    snap = snapshot(engine)
    with pytest.raises(ValueError, match="next_tokens would grow a sequence past the cache capacity max_seq_len=6"):
        engine.decode(torch.tensor([7, 8], device=device))
    assert_unchanged(engine, snap)
    assert_exact(engine.lengths(), torch.tensor([6, 4]), what="lengths at capacity")


def test_decode_before_prefill(device):
    e = engines.TORCH.new_engine(build(CFG, dtype=torch.float32, device=device), max_batch=1, max_seq_len=4)
    with pytest.raises(RuntimeError, match="decode called before prefill"):
        e.decode(torch.tensor([1], device=device))


def test_new_engine_rejects_bad_arguments(device):
    model = build(CFG, dtype=torch.float32, device=device)
    with pytest.raises(TypeError, match="model must be a inference_conformance.reference.transformer.Transformer"):
        engines.TORCH.new_engine(torch.nn.Linear(2, 2), max_batch=1, max_seq_len=4)
    with pytest.raises(ValueError, match="max_batch must be a positive int"):
        engines.TORCH.new_engine(model, max_batch=0, max_seq_len=4)
    with pytest.raises(ValueError, match="max_seq_len must be a positive int"):
        engines.TORCH.new_engine(model, max_batch=1, max_seq_len=2.5)
    with pytest.raises(ValueError, match=r"max_seq_len \(17\) must be <= the model's max_seq_len \(16\)"):
        engines.TORCH.new_engine(model, max_batch=1, max_seq_len=17)


def test_kv_rejects_out_of_range(engine):
    with pytest.raises(IndexError, match="seq 2 out of range"):
        engine.kv(0, 2)
    with pytest.raises(IndexError, match="layer 2 out of range"):
        engine.kv(2, 0)


# ------------------------------------------------------------------- the append kernel's wrapper
def _layer(device, dtype=torch.float32):
    """One layer of a cache (max_batch 3, K 2, capacity 5, H 4), NaN everywhere."""
    cache = StaticKVCache(1, 3, 2, 5, 4, dtype, device)
    return cache.k[0], cache.v[0]


def _new(device, B=2, T=3, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(B, 2, T, 4, generator=g).to(device, dtype),
            torch.randn(B, 2, T, 4, generator=g).to(device, dtype))


@pytest.mark.parametrize("append", list(APPENDS))
def test_append_writes_exactly_the_slots(append, device):
    kc, vc = _layer(device)
    kn, vn = _new(device)
    start, count = torch.tensor([1, 3], device=device), torch.tensor([3, 2], device=device)
    APPENDS[append](kc, vc, kn, vn, start, count)
    want_k = torch.full_like(kc, float("nan"))
    want_v = torch.full_like(vc, float("nan"))
    want_k[0, :, 1:4], want_v[0, :, 1:4] = kn[0], vn[0]
    want_k[1, :, 3:5], want_v[1, :, 3:5] = kn[1, :, :2], vn[1, :, :2]
    assert_exact(kc, want_k, what="K after append")
    assert_exact(vc, want_v, what="V after append")


def _bad_append_cases(device):
    kn, vn = _new(device)
    start, count = torch.tensor([0, 0], device=device), torch.tensor([3, 3], device=device)
    ok = dict(k_new=kn, v_new=vn, start=start, count=count)
    cases = {
        "k_new not a tensor": (dict(ok, k_new=kn.tolist()), TypeError, "k_new must be a torch.Tensor"),
        "k_new wrong heads": (dict(ok, k_new=torch.zeros(2, 3, 3, 4, device=device)), ValueError,
                              r"k_new must have shape \(B <= 3, 2, T, 4\)"),
        "v_new wrong head dim": (dict(ok, v_new=torch.zeros(2, 2, 3, 5, device=device)), ValueError,
                                 r"v_new must have shape \(B <= 3, 2, T, 4\)"),
        "batch above max_batch": (dict(ok, k_new=torch.zeros(4, 2, 3, 4, device=device)), ValueError, "B <= 3"),
        "v_new other T": (dict(ok, v_new=torch.zeros(2, 2, 2, 4, device=device)), ValueError,
                          "v_new must have the shape of k_new"),
        "k_new other dtype": (dict(ok, k_new=kn.double()), TypeError, "k_new must have the cache's dtype"),
        "start float": (dict(ok, start=start.float()), TypeError, "start must be int64"),
        "count int32": (dict(ok, count=count.int()), TypeError, "count must be int64"),
        "start wrong shape": (dict(ok, start=torch.zeros(3, dtype=torch.int64, device=device)), ValueError,
                              r"start must have shape \(2,\)"),
        "count on meta": (dict(ok, count=count.to("meta")), ValueError, "count is on meta"),
        "k_new on meta": (dict(ok, k_new=kn.to("meta")), ValueError, "k_new is on meta"),
        "negative start": (dict(ok, start=torch.tensor([-1, 0], device=device)), ValueError, "start must be >= 0"),
        "count above T": (dict(ok, count=torch.tensor([4, 0], device=device)), ValueError, r"count must lie in \[0, T=3\]"),
        "negative count": (dict(ok, count=torch.tensor([-1, 0], device=device)), ValueError, "count must lie in"),
        "past capacity": (dict(ok, start=torch.tensor([0, 3], device=device)), ValueError,
                          "start \\+ count must be <= the cache capacity max_seq_len=5, got 6"),
        "host_count not int64": (dict(ok, host_count=torch.tensor([3.0, 3.0])), ValueError,
                                 r"host_count must be a CPU int64 tensor of shape \(2,\)"),
        "host_start past capacity": (dict(ok, host_start=torch.tensor([0, 3])), ValueError,
                                     "start \\+ count must be <= the cache capacity"),
    }
    return cases


BAD_APPEND = list(_bad_append_cases("cpu"))


@pytest.mark.parametrize("case", BAD_APPEND)
@pytest.mark.parametrize("append", list(APPENDS))
def test_append_rejects_bad_input_and_writes_nothing(append, case, device):
    kc, vc = _layer(device)
    kc[0, :, 0] = 1.0  # some earlier content that must survive
    before_k, before_v = kc.clone(), vc.clone()
    kwargs, error, match = _bad_append_cases(device)[case]
    with pytest.raises(error, match=match):
        APPENDS[append](kc, vc, **kwargs)
    assert_exact(kc, before_k, what="K cache after a rejected append")
    assert_exact(vc, before_v, what="V cache after a rejected append")


@pytest.mark.parametrize("append", list(APPENDS))
def test_append_rejects_mismatched_caches(append, device):
    kc, vc = _layer(device)
    kn, vn = _new(device)
    start, count = torch.tensor([0, 0], device=device), torch.tensor([1, 1], device=device)
    with pytest.raises(ValueError, match="v_cache must have the shape of k_cache"):
        APPENDS[append](kc, vc[:, :, :4], kn, vn, start, count)
    with pytest.raises(TypeError, match="k_cache and v_cache must share one floating dtype"):
        APPENDS[append](kc, vc.double(), kn, vn, start, count)
    with pytest.raises(ValueError, match="separate buffer"):
        APPENDS[append](kc, kc, kn, vn, start, count)


def test_static_cache_rejects_bad_sizes(device):
    with pytest.raises(ValueError, match="max_seq_len must be a positive int"):
        StaticKVCache(1, 1, 1, 0, 4, torch.float32, device)
    with pytest.raises(TypeError, match="dtype must be a floating torch.dtype"):
        StaticKVCache(1, 1, 1, 4, 4, torch.int64, device)
    with pytest.raises(ValueError, match="append must be one of"):
        StaticKVCache(1, 1, 1, 4, 4, torch.float32, device, append="cuda")
