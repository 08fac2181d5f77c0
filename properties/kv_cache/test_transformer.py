"""Laws of the reference transformer itself: causality and GQA == MHA with repeated KV heads.

KV-6 (001 §2.3, CS336 part 3): grouped-query attention with K KV heads computes the same function
as multi-head attention whose K/V projections repeat each KV head N/K times, while storing N/K
times less cache; K = N is MHA and K = 1 is MQA.
"""
import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_conformance.conformance import tolerance
from inference_conformance.properties import strategies as sst
from inference_conformance.reference import transformer as tf

pytestmark = pytest.mark.suite_own("GQA in the reference model and the lecture's cache-size arithmetic")


@st.composite
def configs(draw):
    n_heads, n_kv = draw(sst.gqa_heads(max_kv=3, max_group=3))
    hd = draw(st.sampled_from([2, 4, 6, 8]))
    return tf.TransformerConfig(vocab_size=draw(st.integers(5, 40)), d_model=n_heads * hd,
                                n_layers=draw(st.integers(1, 2)), n_heads=n_heads, n_kv_heads=n_kv,
                                d_ff=draw(st.integers(3, 40)), max_seq_len=64,
                                tie_embeddings=draw(st.booleans()))


def _as_mha(model: tf.Transformer) -> tf.Transformer:
    """The MHA model whose K/V projections repeat each KV head group-size times."""
    cfg = model.cfg
    mha = tf.Transformer(dataclasses.replace(cfg, n_kv_heads=cfg.n_heads)).to(model.output_weight().dtype)
    state = model.state_dict()
    for name, w in list(state.items()):
        if name.endswith(("attn.wk.weight", "attn.wv.weight")):
            w = w.view(cfg.n_kv_heads, cfg.hd, cfg.d_model).repeat_interleave(cfg.group_size, 0)
            state[name] = w.reshape(cfg.n_heads * cfg.hd, cfg.d_model)
    mha.load_state_dict(state)
    return mha.eval()


@pytest.mark.claim("KV-6")
@settings(max_examples=15)
@given(cfg=configs(), seed=sst.seeds, T=st.integers(1, 20))
def test_gqa_equals_mha_with_repeated_kv_heads(cfg, seed, T):
    model = tf.build(cfg, seed=seed)
    tokens = sst.randint(0, cfg.vocab_size, (2, T), seed)
    with torch.no_grad():
        out = model(tokens)
        out_ref = _as_mha(model)(tokens)
    tolerance.assert_close(out, out_ref, what="GQA logits vs MHA with repeated KV heads")
    kv_gqa = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.hd
    kv_mha = 2 * cfg.n_layers * cfg.n_heads * cfg.hd
    tolerance.assert_exact(torch.tensor(kv_mha), torch.tensor(kv_gqa * cfg.group_size),
                           what="cache values per token: MHA == GQA * N/K")


@pytest.mark.claim("KV-6")
def test_gqa_cache_ratio_llama_sized():
    """Llama-2-70B-like shape: N = 64 query heads, K = 8 KV heads -> 8x less cache per token."""
    cfg = tf.TransformerConfig(vocab_size=8, d_model=64 * 2, n_layers=1, n_heads=64, n_kv_heads=8, d_ff=8)
    model = tf.build(cfg, seed=0, dtype=torch.float32)
    kv_per_token = sum(b.attn.wk.weight.shape[0] + b.attn.wv.weight.shape[0] for b in model.blocks)
    mha_per_token = 2 * cfg.n_layers * cfg.n_heads * cfg.hd
    assert mha_per_token / kv_per_token == cfg.n_heads / cfg.n_kv_heads


@settings(max_examples=15)
@given(cfg=configs(), seed=sst.seeds, T=st.integers(2, 20), data=st.data())
def test_logits_are_causal(cfg, seed, T, data):
    """Changing token t never changes the logits at positions < t."""
    model = tf.build(cfg, seed=seed)
    tokens = sst.randint(0, cfg.vocab_size, (1, T), seed)
    t = data.draw(st.integers(1, T - 1))
    changed = tokens.clone()
    changed[0, t:] = (changed[0, t:] + 1) % cfg.vocab_size
    with torch.no_grad():
        tolerance.assert_close(model(changed)[:, :t], model(tokens)[:, :t], what="logits before the change")


def test_config_errors_name_the_argument():
    with pytest.raises(ValueError, match="n_kv_heads"):
        tf.TransformerConfig(n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="d_model"):
        tf.TransformerConfig(d_model=30, n_heads=4, n_kv_heads=2)
    with pytest.raises(ValueError, match="vocab_size"):
        tf.TransformerConfig(vocab_size=0)
    model = tf.build(tf.TransformerConfig(vocab_size=10, max_seq_len=8), seed=0)
    with pytest.raises(TypeError, match="tokens"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="outside"):
        model(torch.tensor([[0, 10]]))
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, 9, dtype=torch.long))


@settings(max_examples=10)
@given(cfg=configs(), seed=sst.seeds, T=st.integers(1, 12), B=st.integers(1, 3))
def test_recording_cache_sees_every_layer_and_changes_nothing(cfg, seed, T, B):
    """The forward through an attention cache that records each layer's k, v gives the logits
    of the plain forward bit for bit, and the recorded k, v are the layer's (after RoPE)."""
    model = tf.build(cfg, seed=seed)
    tokens = sst.randint(0, cfg.vocab_size, (B, T), seed)
    recorder = tf.RecordingAttention()
    with torch.no_grad():
        plain = model(tokens)
        recorded = model(tokens, None, recorder)
        x0 = model.blocks[0].attn_norm(model.embed(tokens))
        _, k0, v0 = model.blocks[0].attn.qkv(x0, torch.arange(T).expand(B, T))
    tolerance.assert_exact(recorded, plain, what="logits through the recording cache")
    assert len(recorder.kv) == cfg.n_layers
    for k, v in recorder.kv:
        assert k.shape == v.shape == (B, cfg.n_kv_heads, T, cfg.hd)
    tolerance.assert_exact(recorder.kv[0][0], k0, what="layer 0 keys")
    tolerance.assert_exact(recorder.kv[0][1], v0, what="layer 0 values")
