"""Tests of KV caches beside their laws (``laws.py``): the lecture's experiment (20 + 30 tokens) and
the generic checks of an engine (inputs and weights untouched, two engines bit-identical).
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.conformance import results
from inference_conformance.conformance.tolerance import assert_close, assert_exact
from inference_conformance.properties.kv_cache.cases import (
    PINNED,
    Case,
    full_forward,
    model_for,
    prefill_then_decode_calls,
    run_engine,
    sequences,
)
from inference_conformance.reference.transformer import TransformerConfig

TECH = "kv_cache"
#: tiny tensors: one intra-op thread is fastest and avoids OpenMP spin-waits between xdist workers
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.technique(TECH)
@pytest.mark.claim("KV-1")
def test_lecture_experiment_20_plus_30(impl, device):
    """Lecture 001 §2.2: one 50-token sequence, prefill 20 then 30 one-token steps, float32,
    on a model of the lecture's size (d = 128, 4 layers); the lecture measured a max logit
    difference of 4.3e-6 against the full float32 forward (its model is trained, ours random:
    compare the relative difference too)."""
    cfg = TransformerConfig(vocab_size=96, d_model=128, n_layers=4, n_heads=4, n_kv_heads=4, d_ff=512,
                            max_seq_len=64)
    case = Case(n_layers=4, n_heads=4, n_kv_heads=4, head_dim=32, seed=2026, prompt_lens=(20,), steps=30, vocab=96)
    model = model_for(cfg, case.seed, torch.float32, device)
    _, (out,) = run_engine(impl, model, case, device)                            # (50, V)
    (out_fp32,) = full_forward(model, case, device)
    (out_ref,) = full_forward(model_for(cfg, case.seed, torch.float64, device), case, device)
    diff = float((out.double() - out_fp32.double()).abs().max())
    scale = float(out_ref.abs().max())
    results.record("KV-1", measured=diff, lecture=4.3e-6, unit="max |logit difference| (fp32, 20+30 tokens)",
                   relative=diff / scale, logit_scale=scale,
                   max_abs_error_vs_float64=float((out.double() - out_ref).abs().max()))
    assert_close(out, out_ref, what="20 + 30 cached logits vs float64 full forward")


@pytest.mark.technique(TECH)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_engine_mutates_no_input_and_repeats_bit_identically(impl, dtype, device):
    """The generic checks, for an engine: prefill/decode leave the model's weights and the
    tensors they are handed unchanged, and two engines fed the same calls return bit-identical
    logits, all finite (no unwritten NaN slot read)."""
    case = PINNED
    model = model_for(case.cfg(), case.seed, dtype, device)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    full, prompt, lens = sequences(case, device)
    nexts = [full[torch.arange(len(lens), device=device), lens + i] for i in range(case.steps)]  # T x (B,)
    kept = [prompt.clone(), lens.clone()] + [n.clone() for n in nexts]
    first = prefill_then_decode_calls(impl, model, prompt, lens, nexts)
    second = prefill_then_decode_calls(impl, model, prompt, lens, nexts)
    for a, b in zip(first, second):
        assert_exact(a, b, what="logits of two engines fed the same calls")
    for got, want in zip([prompt, lens] + nexts, kept):
        assert_exact(got, want, what="a tensor handed to prefill/decode")
    for name, w in model.state_dict().items():
        assert_exact(w, weights[name], what=f"model weight {name} after prefill/decode")
    assert all(torch.isfinite(x[:, :int(lens.min())] if x.dim() == 3 else x).all() for x in first), \
        "an engine returned NaN/inf logits (an unwritten cache slot was read)"
