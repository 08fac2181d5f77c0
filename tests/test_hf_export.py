"""The small world's Hugging Face export (``smallworld/hf_export.py``): each folder reloads
through ``smallworld/hf_llama.py`` to the same model (float64 logit difference 0 for a plain
export, summation order only for an exact head-dim padding), a wrong padding is caught, and
transformers' own Llama computes the same logits within float32's reach."""
from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from inference_conformance.smallworld import checkpoints
from inference_conformance.smallworld import hf_export


def test_plain_export_is_the_checkpoint(tmp_path):
    folder, diff = hf_export.export_model("draft_good", tmp_path / "d")
    assert diff == 0.0
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["head_dim"] == 16 and cfg["eos_token_id"] == 2


@pytest.mark.parametrize("head_dim", [32, 64])
def test_padded_draft_is_the_same_function(tmp_path, head_dim):
    folder, diff = hf_export.export_model("draft_poor", tmp_path / "d", head_dim)
    assert json.loads((folder / "config.json").read_text())["head_dim"] == head_dim
    assert diff <= hf_export.padding_bound(head_dim, 16), diff
    assert hf_export.padding_bound(64, 16) == hf_export.SUMMATION_BOUND       # 2 = sqrt(4): exact weights


def test_check_export_rejects_a_padding_without_the_query_scale(tmp_path):
    model = checkpoints.load_model("draft_poor")
    padded = hf_export.pad_head_dim(model, 64)
    with torch.no_grad():
        for block in padded.blocks:
            block.attn.wq.weight.mul_(0.5)                                     # undo the sqrt(r) scale
    diff = hf_export.check_export(hf_export.write_folder(padded, tmp_path / "bad"), model)
    assert diff > hf_export.ROUNDED_BOUND * 100, diff


def test_pad_head_dim_refuses_a_non_power_of_two_ratio():
    with pytest.raises(ValueError, match="head_dim"):
        hf_export.pad_head_dim(checkpoints.load_model("draft_poor"), 48)


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
def test_transformers_llama_reads_the_export(tmp_path):
    """transformers' LlamaForCausalLM in float64 on the exported target: its logits equal the
    reference's float64 logits up to its RoPE angles, which transformers computes in float32
    (position·inv_freq rounded: at most T·2^-24 ≈ 2.4e-6 rad at T = 40, measured 7e-6 in the
    logits); a misnamed or transposed tensor, a wrong RoPE layout or theta differs by O(1)."""
    from transformers import LlamaForCausalLM

    folder, _ = hf_export.export_model("target", tmp_path / "t")
    hf = LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float64).eval()
    ref = checkpoints.load_model("target", dtype=torch.float64)
    tokens = hf_export.probe_tokens(ref.cfg.vocab_size, length=40)
    with torch.no_grad():
        diff = float((hf(tokens).logits - ref(tokens)).abs().max())
    assert diff < 1e-4, diff
