"""KV-4 and KV-6 measured on the engines' caches at real models' shapes (lecture 001 §2.3): the
bytes per token at Llama-2-7B's and Llama-3-8B's layers, KV heads and head dim, and the cache
GQA and MQA save against MHA. Every registered ``kv_cache`` engine (``impl`` fixture).
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.conformance import results
from inference_conformance.conformance.tolerance import assert_exact
from inference_conformance.properties.kv_cache.cases import LLAMA_SHAPES, formula_bytes, model_for, open_engine
from inference_conformance.reference.transformer import TransformerConfig

TECH = "kv_cache"
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.technique(TECH)
@pytest.mark.claim("KV-4")
@pytest.mark.parametrize("name", list(LLAMA_SHAPES))
def test_bytes_per_token_at_llama_shapes(impl, device, name):
    """Lecture 001 §2.3 in fp16: the engine's cache for a model with Llama-2-7B's (Llama-3-8B's)
    layers, KV heads and head dim (the rest of the model shrunk to d_model 8) holds 512 KiB
    (128 KiB) per token, so a 128K context needs 64 GiB (16 GiB)."""
    L, N, K, H, lecture_kib = LLAMA_SHAPES[name]
    cfg = TransformerConfig(vocab_size=16, d_model=8, n_layers=L, n_heads=N, n_kv_heads=K, d_ff=8,
                            max_seq_len=8, head_dim=H)
    model = model_for(cfg, 0, torch.float16, device)
    engine = open_engine(impl, model, 1, 4)
    engine.prefill(torch.tensor([[1, 2, 3]], device=device), torch.tensor([3], device=device))
    engine.decode(torch.tensor([4], device=device))
    per_token = engine.cache_bytes() / 4
    results.record("KV-4", measured=per_token / 1024, lecture=f"{lecture_kib} KiB/token ({name}, fp16)",
                   unit="KiB per token", model=name, context_128k_GiB=per_token * 128 * 1024 / 2**30)
    assert_exact(torch.tensor(engine.cache_bytes()), torch.tensor(formula_bytes(cfg, torch.float16, 4)),
                 what=f"{name} cache bytes")


@pytest.mark.technique(TECH)
@pytest.mark.claim("KV-6")
def test_gqa_cache_bytes_against_mha(impl, device):
    """KV-6 measured on the engines' caches: with 64 query heads, a model with 8 KV heads
    (Llama-2-70B's grouping) holds 8 times fewer cache bytes than the same model with 64 (MHA),
    and one KV head (MQA) 64 times fewer, for the same tokens (the engine's own cache_bytes,
    which reads its tensors' shapes and element size)."""
    held = {}
    for K in (64, 8, 1):
        cfg = TransformerConfig(vocab_size=16, d_model=8, n_layers=2, n_heads=64, n_kv_heads=K, d_ff=8,
                                max_seq_len=8, head_dim=16)
        engine = open_engine(impl, model_for(cfg, 0, torch.float32, device), 2, 6)
        engine.prefill(torch.tensor([[1, 2, 3], [4, 5, 0]], device=device), torch.tensor([3, 2], device=device))
        engine.decode(torch.tensor([6, 7], device=device))
        held[K] = engine.cache_bytes()
    assert_exact(torch.tensor([held[64], held[64]]), torch.tensor([8 * held[8], 64 * held[1]]),
                 what="cache bytes: MHA == 8 x GQA(K=8) == 64 x MQA")
    results.record("KV-6", measured=held[64] / held[8], lecture="N/K = 8", unit="x less cache (engine bytes, MHA / GQA)",
                   rule="N = 64 query heads, K = 8 KV heads; MQA (K = 1): 64x", mha_bytes=held[64], gqa_bytes=held[8],
                   mqa_bytes=held[1])
