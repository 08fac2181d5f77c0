"""KV-1, KV-2 and FA-3 on a real checkpoint rather than random weights.

The model is the shipped small-world target (``smallworld/checkpoints/target``) or, with
``--model PATH``, a user's checkpoint: a local Hugging Face Llama folder (config.json +
*.safetensors) or a world checkpoint. Prompts are real test documents for the world model and
seeded random ids otherwise. Every registered ``kv_cache`` and ``attention`` implementation runs.

Lecture 001 §2.2 (KV-1: 4.3e-6 in fp32 on its trained model) and §3.3 (FA-3: 1.3e-15 on a real
model layer in float64).
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from inference_conformance.conformance import results, tolerance
from inference_conformance.conformance.outcomes import unsupported
from inference_conformance.properties.kv_cache.cases import open_engine
from inference_conformance.reference.transformer import generate, sample_next

PREFILL, STEPS = 12, 8


def load_model(path: str | None, dtype: torch.dtype, device: str):
    """The model under test in ``dtype`` on ``device``. Raises FileNotFoundError for a bad path."""
    if path is None:
        from inference_conformance.smallworld.checkpoints import load_model as load_world

        return load_world("target", dtype, device)
    p = Path(path)
    if p.is_dir():
        from inference_conformance.smallworld.hf_llama import load_hf_llama

        return load_hf_llama(p, dtype, device, max_seq_len=PREFILL + STEPS + 8)
    from inference_conformance.smallworld.checkpoints import load_model as load_world

    return load_world(p, dtype, device)


def prompt_tokens(model, path: str | None, device: str) -> torch.Tensor:
    """(2, PREFILL + STEPS) int64: two real test documents, or seeded ids for an outside model."""
    if path is None:
        from inference_conformance.smallworld import data

        docs = [d for d in data.encode(data.split("test", 32)) if len(d) >= PREFILL + STEPS][:2]
        return torch.tensor([d[:PREFILL + STEPS] for d in docs], device=device)
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, model.cfg.vocab_size, (2, PREFILL + STEPS), generator=g).to(device)


@pytest.fixture(scope="module")
def model_path(request) -> str | None:
    return request.config.getoption("model", default=None)


@pytest.mark.technique("kv_cache")
@pytest.mark.claim("KV-1")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_checkpoint_prefill_then_decode_equals_full_forward(impl, dtype, device, model_path):
    model = load_model(model_path, dtype, device)
    tokens = prompt_tokens(model, model_path, device)                         # (2, S + T)
    B, T = tokens.shape
    engine = open_engine(impl, model, B, T)        # a lossy (quantized) cache: "differs by design"
    lens = torch.full((B,), PREFILL, dtype=torch.int64, device=device)
    steps = [engine.prefill(tokens[:, :PREFILL], lens)]                       # (B, S, V)
    for t in range(PREFILL, T):
        steps.append(engine.decode(tokens[:, t])[:, None])                    # (B, 1, V)
    out = torch.cat(steps, dim=1)[:, :T - 1]                                  # (B, T-1, V): next-token logits
    with torch.no_grad():
        out_ref = load_model(model_path, torch.float64, device)(tokens)[:, :T - 1]
    if dtype == torch.float32:
        results.record("KV-1", measured=float((out.double() - out_ref).abs().max()),
                       unit=f"max |logit difference| vs float64 (fp32, checkpoint, {PREFILL}+{STEPS})")
    tolerance.assert_close(out, out_ref, what=f"cached logits of the checkpoint ({PREFILL} prefill + {STEPS} steps)")


@pytest.mark.technique("kv_cache")
@pytest.mark.claim("KV-2")
def test_checkpoint_same_seed_same_tokens(impl, device, model_path):
    model = load_model(model_path, torch.float64, device)
    prompt = prompt_tokens(model, model_path, device)[:, :PREFILL]            # (2, S)
    B, S = prompt.shape
    tokens_ref, _ = generate(model, prompt, STEPS, temperature=1.0,
                             generator=torch.Generator(device=device).manual_seed(7))
    gen = torch.Generator(device=device).manual_seed(7)
    engine = open_engine(impl, model, B, S + STEPS)
    logits = engine.prefill(prompt, torch.full((B,), S, dtype=torch.int64, device=device))[:, -1]
    out = [prompt]
    with torch.no_grad():
        for i in range(STEPS):
            nxt = sample_next(logits, 1.0, gen)                               # (B,)
            out.append(nxt[:, None])
            if i + 1 < STEPS:
                logits = engine.decode(nxt)
    tolerance.assert_exact(torch.cat(out, dim=1), tokens_ref, what="sampled tokens, cache vs no cache")


@pytest.mark.technique("attention")
@pytest.mark.claim("FA-3")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_checkpoint_layer_attention(impl, dtype, device, model_path):
    """Attention of the checkpoint's first layer on a real prompt, against float64 standard
    attention (lecture: 1.3e-15 on a real model layer in float64)."""
    model = load_model(model_path, torch.float64, device)
    tokens = prompt_tokens(model, model_path, device)                         # (B, T)
    block = model.blocks[0]
    with torch.no_grad():
        x = block.attn_norm(model.embed(tokens))                              # (B, T, D)
        pos = torch.arange(tokens.shape[1], device=device).expand_as(tokens)
        q, k, v = block.attn.qkv(x, pos)                                      # (B, N, T, H), (B, K, T, H)
    from inference_conformance.reference.attention import attention as attention_ref

    scale = 1 / math.sqrt(q.shape[-1])
    out_ref = attention_ref(q, k, v, causal=True, scale=scale)                # (B, N, T, H)
    try:
        out = impl(q.to(dtype), k.to(dtype), v.to(dtype), causal=True, scale=scale)
    except NotImplementedError as exc:
        unsupported(f"{impl.name} refuses {dtype}, D={q.shape[-1]}: {exc}")
    if dtype == torch.float64:
        results.record("FA-3", measured=float((out - out_ref).abs().max()), lecture=1.3e-15,
                       unit=f"max |difference| on the checkpoint's layer 0 ({impl.name}, fp64)")
    tolerance.assert_close(out, out_ref, what="attention of the checkpoint's first layer")
