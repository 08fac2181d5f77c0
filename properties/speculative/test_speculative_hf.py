"""An outside peer of speculative decoding: Hugging Face transformers' assisted generation
(``generate(..., assistant_model=...)``) on the small world's target and poor draft, exported as
Hugging Face Llama folders (and read back by ``inference_conformance.smallworld.hf_llama`` to the same weights).

- Sampled (``do_sample=True``, temperature 1, top-k and top-p off: transformers' default top-k
  is 50): the first two tokens of 1500 generations after ``<bos>`` follow the target's own
  distribution (G-tests of the first two and of the first alone, alpha = 1e-3, bins below 5
  expected pooled), the claim SD-1 on an outside system; the same first tokens reject the poor
  draft's own distribution (KL 0.03 from the target's).
  transformers stops a generation at ``<eos>``: a first token ``<eos>`` counts as (eos, eos).
- Greedy: assisted generation emits exactly the tokens of greedy target decoding (SD-7), both
  transformers' own and the reference's (float64).

Skipped when transformers is not installed. Assisted generation runs one sequence per call
(about 9 ms each on one CPU core here).
"""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from inference_conformance.conformance import results
from inference_conformance.conformance.stats import check_counts
from inference_conformance.conformance.tolerance import assert_exact
from inference_conformance.reference.transformer import generate

# found, not imported, at collection (importing transformers costs ~1.4 s in every process that
# collects properties/, most of which never run these tests)
if importlib.util.find_spec("transformers") is None:
    pytest.skip("could not import 'transformers': not installed", allow_module_level=True)


def _transformers():
    import transformers

    return transformers

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.suite_own("transformers' assisted generation judged directly (peers-hf); as an engine it is the inference_engine "
                                    "laws' hf entries")]

ALPHA = 1e-3
N_SAMPLED = 1500


def export_hf_llama(model, folder):
    """Write reference ``model`` as a Hugging Face Llama folder (config.json + safetensors) and
    return the transformers model (float32, eval)."""
    from inference_conformance.smallworld.hf_llama import hf_name_map
    from inference_conformance.smallworld.tokenizer import tokenizer

    c, tok = model.cfg, tokenizer()
    config = _transformers().LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff, num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads, head_dim=c.hd,
        max_position_embeddings=c.max_seq_len, rms_norm_eps=c.norm_eps, rope_theta=c.rope_theta,
        tie_word_embeddings=c.tie_embeddings, bos_token_id=tok.bos_id, eos_token_id=tok.eos_id,
        pad_token_id=tok.pad_id)
    hf = _transformers().LlamaForCausalLM(config)
    names = hf_name_map(c)
    missing, unexpected = hf.load_state_dict({names[k]: v.float() for k, v in model.state_dict().items()},
                                             strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    hf.save_pretrained(folder)
    return hf.eval()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from inference_conformance.smallworld.checkpoints import load_model
    from inference_conformance.smallworld.hf_llama import load_hf_llama

    out = {}
    for name in ("target", "draft_poor"):
        ours = load_model(name, torch.float32)
        folder = tmp_path_factory.mktemp(f"hf_{name}")
        hf = export_hf_llama(ours, folder)
        back = load_hf_llama(folder, dtype=torch.float32, max_seq_len=ours.cfg.max_seq_len)
        for key, value in ours.state_dict().items():
            assert_exact(back.state_dict()[key], value, what=f"{name} exported and read back: {key}")
        out[name] = hf
    return out


def _tok():
    from inference_conformance.smallworld.tokenizer import tokenizer

    return tokenizer()


def _bos():
    return _tok().bos_id


def _first_two_exact(target, bos_id: int) -> np.ndarray:
    """The target's own distribution of the first two tokens after ``<bos>`` (V·V,) float64."""
    V = target.cfg.vocab_size
    seqs = torch.stack([torch.full((V,), bos_id), torch.arange(V)], 1)
    with torch.no_grad():
        logits = target(seqs).double()
    p1 = torch.softmax(logits[0, 0], -1)
    p2 = torch.softmax(logits[:, 1], -1)
    return (p1[:, None] * p2).reshape(-1).numpy()


@pytest.mark.claim("SD-1")
def test_hf_assisted_sampling_follows_target(world):
    """SD-1 on transformers' assisted generation: the first two sampled tokens of 1500
    generations follow the target's own distribution (G-test, alpha = 1e-3)."""
    from inference_conformance.smallworld.checkpoints import load_model

    target, draft = world["target"], world["draft_poor"]
    V = target.config.vocab_size
    x = torch.tensor([[_bos()]])
    eos = _tok().eos_id
    torch.manual_seed(17)                               # transformers samples from the global generator
    counts = np.zeros(V * V, dtype=np.int64)
    for _ in range(N_SAMPLED):
        out = target.generate(x, assistant_model=draft, do_sample=True, max_new_tokens=2, temperature=1.0,
                              top_k=0, top_p=1.0)
        second = int(out[0, 2]) if out.shape[1] > 2 else eos       # stopped at <eos>: (eos, eos)
        counts[int(out[0, 1]) * V + second] += 1
    exact = _first_two_exact(load_model("target", torch.float64), _bos()).reshape(V, V)
    stop = exact[eos].sum()
    exact[eos] = 0.0
    exact[eos, eos] = stop
    exact = exact.reshape(-1)
    v = check_counts(counts, exact / exact.sum(), alpha=ALPHA,
                     what="transformers assisted generation (poor draft): first two tokens")
    results.record("SD-1", measured=round(v.error, 2), bound=round(v.bound, 2), unit="G statistic",
                   rule="outside peer: transformers assisted generation vs the target's own sampling, alpha=1e-3",
                   what=f"transformers {_transformers().__version__} assisted generation", backend="transformers",
                   trials=N_SAMPLED, draft="draft_poor")
    v.check()
    # the first token alone, against the target (SD-1) and against the poor draft (the test can fail)
    first = counts.reshape(V, V).sum(1)
    p1 = exact.reshape(V, V).sum(1)
    check_counts(first, p1 / p1.sum(), alpha=ALPHA, what="transformers assisted generation: first token").check()
    q = _first_two_exact(load_model("draft_poor", torch.float64), _bos()).reshape(V, V).sum(1)
    against_draft = check_counts(first, q / q.sum(), alpha=ALPHA, what="the same first tokens vs the draft's own")
    assert not against_draft.ok, f"the G-test cannot tell the target from the poor draft: {against_draft.message()}"


@pytest.mark.claim("SD-7")
def test_hf_assisted_greedy_equals_greedy_target(world):
    """SD-7 on transformers' assisted generation: greedy assisted output equals greedy target
    decoding token for token (transformers' own, and the reference's in float64)."""
    from inference_conformance.smallworld.checkpoints import load_model

    target, draft = world["target"], world["draft_poor"]
    n = 24
    x = torch.tensor([[_bos()]])
    assisted = target.generate(x, assistant_model=draft, do_sample=False, max_new_tokens=n)
    plain = target.generate(x, do_sample=False, max_new_tokens=n)
    ours, _ = generate(load_model("target", torch.float64), x, n)
    # transformers stops at <eos>; the reference goes on: compare up to transformers' length
    assert assisted.shape[1] == n + 1 or int(assisted[0, -1]) == _tok().eos_id, "stopped early without <eos>"
    ours = ours[:, :assisted.shape[1]]
    results.record("SD-7", measured=int((assisted != ours).sum()), bound=0, unit="tokens differing",
                   rule="exact: transformers assisted greedy vs reference greedy target (float64)",
                   backend="transformers", draft="draft_poor")
    assert_exact(assisted, plain, what="transformers assisted greedy vs transformers greedy target")
    assert_exact(assisted, ours, what="transformers assisted greedy vs reference greedy target (float64)")
