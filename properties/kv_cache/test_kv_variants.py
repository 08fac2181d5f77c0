"""KV-cache reduction by architecture: each cached variant computes the full model's function.

KV-7 MLA (latent cache, absorbed projections), KV-8 sliding window in a ring buffer, KV-9
cross-layer sharing, KV-11 the receptive field of stacked windows grows as L·(W−1).
"""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_conformance.conformance import results, tolerance
from inference_conformance.properties import strategies as sst
from inference_conformance.properties.kv_cache.variant_cases import check_kv7, check_kv9, check_kv11
from inference_conformance.reference import kv_cache as kvv

pytestmark = pytest.mark.suite_own("KV reduction by architecture (CLA, MLA, sliding windows): the reference model's variants and the "
                                   "lecture's size formulas")


@pytest.mark.claim("KV-8")
@settings(max_examples=25)
@given(seed=sst.seeds, T=st.integers(1, 40), window=st.integers(1, 12), heads=st.integers(1, 3),
       H=st.sampled_from([1, 4, 7]))
def test_ring_buffer_equals_window_mask(seed, T, window, heads, H):
    q, k, v = (sst.randn((heads, T, H), seed + i, scale=3.0) for i in range(3))
    out, nbytes = kvv.ring_buffer_decode(q, k, v, window)
    out_ref = kvv.windowed_attention(q, k, v, window)
    tolerance.assert_close(out, out_ref, what="ring-buffer decode vs window-masked attention")
    tolerance.assert_exact(torch.tensor(nbytes), torch.tensor(2 * heads * window * H * 8),
                           what="ring-buffer bytes (independent of T)")


@pytest.mark.claim("KV-8")
def test_ring_buffer_one_slot_short_is_rejected():
    """Power: a ring buffer of W - 1 slots (the classic off-by-one) differs from the window mask."""
    q, k, v = (sst.randn((2, 20, 4), i, scale=3.0) for i in range(3))
    out, _ = kvv.ring_buffer_decode(q, k, v, 4)
    wrong = kvv.windowed_attention(q, k, v, 5)
    assert tolerance.max_abs_error(out, wrong) > 1e-3 * tolerance.scale_of(wrong)
    tolerance.assert_close(out, kvv.windowed_attention(q, k, v, 4))


@pytest.mark.claim("KV-9")
@settings(max_examples=15)
@given(seed=sst.seeds, T=st.integers(1, 12), layers=st.integers(1, 5), share=st.integers(1, 3))
def test_cla_cached_decode_equals_full_forward(seed, T, layers, share):
    check_kv9(kvv.stack_decode_cla, seed, T, layers, share)


@pytest.mark.claim("KV-9")
def test_cla_divides_the_cache_by_the_sharing_factor():
    x = sst.randn((6, 8), 0)
    cfg1 = kvv.StackConfig(d_model=8, heads=2, layers=6, share=1)
    cfg3 = kvv.StackConfig(d_model=8, heads=2, layers=6, share=3)
    _, full = kvv.stack_decode_cla(x, kvv.stack_weights(cfg1, 0), cfg1)
    _, shared = kvv.stack_decode_cla(x, kvv.stack_weights(cfg3, 0), cfg3)
    results.record("KV-9", measured=full / shared, lecture="cache ÷ sharing factor (3)", unit="x less cache")
    assert full == 3 * shared


@pytest.mark.claim("KV-7")
@settings(max_examples=20)
@given(seed=sst.seeds, T=st.integers(1, 16), heads=st.integers(1, 4), latent=st.integers(1, 10),
       rope_dim=st.sampled_from([2, 4, 6]))
def test_mla_absorbed_decode_equals_materialized(seed, T, heads, latent, rope_dim):
    check_kv7(kvv.mla_absorbed_decode, seed, T, heads, latent, rope_dim)


@pytest.mark.claim("KV-7")
def test_mla_deepseek_v2_cache_size():
    """DeepSeek-V2's cache shape (128 heads of 128 dims, latent 512, decoupled RoPE 64; a small
    d_model keeps the weights small): the values the absorbed decode holds per token, counted
    from its cache, against the keys and values MHA would hold."""
    cfg = kvv.MLAConfig(d_model=16, heads=128, head_dim=128, latent=512, rope_dim=64)
    x = sst.randn((2, cfg.d_model), 0)
    _, per_token = kvv.mla_absorbed_decode(x, kvv.mla_weights(cfg, 0), cfg)
    mha = cfg.mha_per_token()
    results.record("KV-7", measured=f"{per_token} cached vs {mha} (K+V) per token per layer ({mha / per_token:.1f}x less)",
                   lecture="16384 -> 512 + 64 = 576", unit="values")
    assert per_token == 576, per_token


@pytest.mark.claim("KV-11")
@settings(max_examples=10)
@given(seed=sst.seeds, layers=st.integers(1, 4), window=st.integers(2, 5))
def test_stacked_windows_reach_exactly_L_times_W_minus_1_back(seed, layers, window):
    check_kv11(kvv.receptive_field, seed, layers, window)


@pytest.mark.claim("KV-11")
def test_receptive_field_of_four_layers_of_window_eight():
    layers, window = 4, 8
    distance = check_kv11(kvv.receptive_field, 0, layers, window)
    results.record("KV-11", measured=distance, lecture=f"L·(W−1) = {layers * (window - 1)} (not W = {window})",
                   unit="positions back (L=4, W=8)")
