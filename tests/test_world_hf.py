"""Loading Hugging Face Llama checkpoints into the reference transformer, checked against
transformers itself: a tiny random LlamaForCausalLM is built offline, saved with
save_pretrained, loaded with inference_conformance.smallworld.hf_llama; its full-forward logits must equal
transformers' and its greedy generations must be transformers' tokens.

Logits: the float64 reference is our loaded model in float64. transformers' float32 forward is
judged against it by the float32 rule (transformers computes RMSNorm and the RoPE tables in
float32 even for a float64 model, so its float64 run is float32-accurate only and is not an
oracle for the float64 rule); our own float32 load is judged by the same rule."""
import json

import pytest
import torch

from inference_conformance.conformance.tolerance import assert_close, assert_exact
from inference_conformance.reference.transformer import generate
from inference_conformance.smallworld.hf_llama import MissingTensor, UnsupportedCheckpoint, load_hf_llama

transformers = pytest.importorskip("transformers")

NEW_TOKENS = 10


def _tiny_llama(tmp_path, *, tie: bool, kv_heads: int = 2, head_dim: int | None = None, theta: float = 5000.0):
    cfg = dict(vocab_size=97, hidden_size=48, intermediate_size=88, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=kv_heads, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=theta,
               tie_word_embeddings=tie, initializer_range=0.15, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    config = transformers.LlamaConfig(**cfg)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # norm gains away from 1, so a loader that drops them is caught
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
    folder = tmp_path / ("tied" if tie else "untied")
    model.save_pretrained(folder)
    return model.to(torch.float64), folder


def _prompt(seed=3, batch=2, length=7):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 97, (batch, length), generator=g)


@pytest.mark.parametrize("tie,kv_heads,head_dim", [(False, 2, None), (True, 1, None), (False, 4, 16)],
                         ids=["untied-gqa", "tied-mqa", "mha-head_dim16"])
def test_full_forward_logits_equal_transformers(tmp_path, tie, kv_heads, head_dim):
    hf, folder = _tiny_llama(tmp_path, tie=tie, kv_heads=kv_heads, head_dim=head_dim)
    ours = load_hf_llama(folder, dtype=torch.float64)
    assert ours.cfg.tie_embeddings == tie and ours.cfg.n_kv_heads == kv_heads and ours.cfg.rope_theta == 5000.0
    tokens = _prompt(length=40)
    with torch.no_grad():
        out_ref = ours(tokens)  # (B, T, V) float64 reference
        out_hf = hf.to(torch.float32)(tokens).logits  # (B, T, V) transformers, float32
        out32 = load_hf_llama(folder, dtype=torch.float32)(tokens)
    assert out_hf.dtype == torch.float32
    assert_close(out_hf, out_ref, what="transformers float32 logits vs reference float64")
    assert_close(out32, out_ref, what="reference float32 logits vs reference float64")
    # and the two float32 computations agree to float32 rounding
    assert float((out32.double() - out_hf.double()).abs().max()) <= 1e-5 * float(out_ref.abs().max())


def test_greedy_generation_equals_transformers(tmp_path):
    hf, folder = _tiny_llama(tmp_path, tie=False)
    ours = load_hf_llama(folder, dtype=torch.float64)
    prompt = _prompt()
    with torch.no_grad():
        expected = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                               min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    tokens, _ = generate(ours, prompt, NEW_TOKENS)
    assert_exact(tokens, expected, what="greedy tokens vs transformers.generate")


def test_engine_cached_greedy_equals_transformers(tmp_path):
    engine_mod = pytest.importorskip("inference_conformance.optimized.kv_cache")
    hf, folder = _tiny_llama(tmp_path, tie=True)
    ours = load_hf_llama(folder, dtype=torch.float64)
    prompt = _prompt(seed=4, batch=3, length=5)
    with torch.no_grad():
        expected = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                               min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    engine = engine_mod.KVCacheEngine(ours, max_batch=3, max_seq_len=prompt.shape[1] + NEW_TOKENS, append="torch")
    lengths = torch.full((3,), prompt.shape[1], dtype=torch.int64)
    logits = engine.prefill(prompt, lengths)[:, -1]  # (B, V)
    out = [prompt]
    for step in range(NEW_TOKENS):
        nxt = logits.argmax(-1)
        out.append(nxt[:, None])
        if step + 1 < NEW_TOKENS:
            logits = engine.decode(nxt)
    assert_exact(torch.cat(out, dim=1), expected, what="cached greedy tokens vs transformers.generate")


def _edit_config(folder, **changes):
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


def test_unsupported_architecture_is_rejected_clearly(tmp_path):
    _, folder = _tiny_llama(tmp_path, tie=False)
    _edit_config(folder, model_type="gpt2", architectures=["GPT2LMHeadModel"])
    with pytest.raises(UnsupportedCheckpoint, match="unsupported architecture.*gpt2"):
        load_hf_llama(folder)


@pytest.mark.parametrize("change,match", [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "RoPE scaling 'yarn'"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5000.0, "factor": 8.0}}, "RoPE scaling 'llama3'"),
    ({"attention_bias": True}, "attention_bias"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
])
def test_unsupported_options_are_rejected_clearly(tmp_path, change, match):
    _, folder = _tiny_llama(tmp_path, tie=False)
    _edit_config(folder, **change)
    with pytest.raises(UnsupportedCheckpoint, match=match):
        load_hf_llama(folder)


def test_missing_tensor_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    _, folder = _tiny_llama(tmp_path, tie=False)
    f = next(folder.glob("*.safetensors"))
    tensors = load_file(str(f))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(f), metadata={"format": "pt"})
    with pytest.raises(MissingTensor, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load_hf_llama(folder)


def test_missing_folder_or_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_hf_llama(tmp_path)
