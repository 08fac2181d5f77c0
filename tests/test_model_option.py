"""``--model PATH`` runs the model-level claims on a user's Hugging Face Llama checkpoint."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    folder = tmp_path_factory.mktemp("tiny_llama")
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder, safe_serialization=True)
    return folder


def _run(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, CI="true")
    env.pop("PYTEST_XDIST_WORKER", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "properties/kv_cache/test_model_claims.py", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_model_claims_run_on_an_outside_checkpoint(tiny_llama):
    res = _run(f"--model={tiny_llama}", "-k", "torch")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "passed" in res.stdout


def test_a_missing_checkpoint_fails_with_the_reason(tmp_path):
    res = _run(f"--model={tmp_path / 'nowhere'}", "-k", "torch and KV-2 or checkpoint_same_seed and torch")
    assert res.returncode != 0
    assert "nowhere" in res.stdout
