"""The laws of the suite's speculative decoding engine with KV caches
(``optimized/speculative/engine.py``; claims SD-1, SD-7, SD-8; lecture 002 §2); the laws of a
``verify`` function are in ``verify.py``.

- :data:`SD8`: after every round, the target's and the draft's caches hold exactly the committed
  tokens but the pending one (the draft one fewer after a round that accepted every draft token):
  the lengths exactly, NaN in every slot past them exactly (as in a cache that never saw the
  rejected tokens), and the keys and values of one recomputation over the accepted tokens only
  (float64 rule, 1e-12 of the scale).
- :data:`SD7`: greedy speculative decoding emits exactly the tokens of greedy target decoding.
- :data:`SD1_DRAFT_Q`: at a context where bfloat16 rounding of the draft's logits moves q, the
  engine's first emitted tokens follow the processed target (G-test): the engine samples its draft
  tokens from the q it passes to verify.
- :data:`SD1_FIRST_TWO`: the first two tokens of the engine's generations follow the target's
  own distribution of the first two tokens (G-test), with a given verifier.

The engine is the suite's own (no engine contract: an outside engine's speculation is judged by
EN-3, ``inference_engine``), so these laws declare no test of their own: the tests of
``properties/speculative/test_speculative_engine.py`` run them on the engine and on its known-bad
variants (``properties/speculative/zoo.py`` ``ENGINE_ZOO``), each shown rejected.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
from hypothesis import note
from hypothesis import strategies as st

from inference_conformance.conformance import results
from inference_conformance.conformance.laws import Law
from inference_conformance.conformance.stats import check_counts
from inference_conformance.conformance.tolerance import assert_close, assert_exact, check_exact
from inference_conformance.properties.speculative.cases import first_two_token_distribution
from inference_conformance.reference.speculative import process_logits
from inference_conformance.reference.transformer import generate, layer_kv

ALPHA = 1e-3
DRAFTS = ("draft_good", "draft_poor")


@lru_cache(maxsize=None)
def small_model(name: str, dtype: torch.dtype):
    """The small world's model ``name`` ("target", "draft_good", "draft_poor") in ``dtype``, loaded once."""
    from inference_conformance.smallworld.checkpoints import load_model

    return load_model(name, dtype)


def small_tokenizer():
    """The small world's tokenizer (``bos_id``, ``stoi``)."""
    from inference_conformance.smallworld.tokenizer import tokenizer

    return tokenizer()


# ------------------------------------------------------------------------------------ SD-8
def reference_kv(model, tokens):
    """Per layer, the model's keys (after RoPE) and values for ``tokens`` (1, n) from one
    recomputation over those tokens only: [(k (Hkv, n, D), v (Hkv, n, D))]."""
    return [(k[0], v[0]) for k, v in layer_kv(model, tokens)]


def check_caches(engine, buf, L, prev_L, gamma, worst: list) -> None:
    """SD-8 after one round: lengths, NaN past them, and the kept keys and values."""
    all_accepted = (L - prev_L) == gamma + 1
    expected = {"target": L - 1, "draft": torch.where(all_accepted, L - 2, L - 1)}
    for name, model in (("target", engine.target), ("draft", engine.draft)):
        lengths = model.lengths()
        assert_exact(lengths, expected[name], what=f"{name} cache lengths after the round (committed tokens "
                                                    f"{L.tolist()})")
        top = model.cache.max_seq_len
        for b, n in enumerate(lengths.tolist()):
            for t in (model.cache.k, model.cache.v):
                dead = t[:, b, :, n:top]
                v = check_exact(torch.isnan(dead), torch.ones_like(dead, dtype=torch.bool),
                                what=f"{name} cache slots past length {n} of row {b} hold NaN (never written)")
                v.check()
            ref = reference_kv(model.model, buf[b:b + 1, :n])
            outs, refs = [], []
            for layer in range(model.cfg.n_layers):
                k, v = model.kv(layer, b)
                outs += [k.flatten(), v.flatten()]
                refs += [ref[layer][0].flatten(), ref[layer][1].flatten()]
            out, want = torch.cat(outs), torch.cat(refs)
            worst.append(float((out - want).abs().max()) if out.numel() else 0.0)
            assert_close(out, want, what=f"{name} cache of row {b} vs the accepted tokens recomputed")


def law_sd8_caches_rolled_back(run, draft, gamma, greedy, batch, prompt_len, seed, adaptive):
    """SD-8 on one generation: the caches are checked after every round; each round's largest
    |cached K, V - recomputed| is observed."""
    worst: list[float] = []
    target, dr = small_model("target", torch.float64), small_model(draft, torch.float64)
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.cat([torch.full((batch, 1), small_tokenizer().bos_id),
                        torch.randint(4, target.cfg.vocab_size, (batch, prompt_len - 1), generator=gen)], 1)
    engine = run.impl.cls(target, dr, gamma=gamma, max_batch=batch, max_seq_len=target.cfg.max_seq_len,
                          temperature=0.0 if greedy else 1.0, adaptive=adaptive, nan_fill=True)
    prev = {"L": torch.full((batch,), prompt_len, dtype=torch.int64)}
    rounds = []

    def on_round(eng, buf, L):
        check_caches(eng, buf, L, prev["L"], eng.last_gamma, worst)
        prev["L"] = L
        rounds.append(1)

    note(f"prompt {prompt.tolist()}")
    engine.generate(prompt, 12, generator=gen, on_round=on_round)
    assert rounds, "the engine ran no round"
    for error in worst:
        run.observe(error)


#: SD-8's law, on the engine (not a registered implementation: ``test_speculative_engine.py`` picks it).
SD8 = Law(
    claim="SD-8", technique="speculative", body=law_sd8_caches_rolled_back, params=(),
    given={"draft": st.sampled_from(DRAFTS), "gamma": st.integers(1, 5), "greedy": st.booleans(),
           "batch": st.integers(1, 3), "prompt_len": st.integers(1, 4), "seed": st.integers(0, 2**16),
           "adaptive": st.booleans()},
    examples=(dict(draft="draft_poor", gamma=1, greedy=False, batch=3, prompt_len=1, seed=0, adaptive=False),  # most rejections
              dict(draft="draft_good", gamma=4, greedy=True, batch=2, prompt_len=3, seed=1, adaptive=False),   # all accepted
              dict(draft="draft_poor", gamma=5, greedy=False, batch=1, prompt_len=4, seed=2, adaptive=False),
              dict(draft="draft_good", gamma=6, greedy=False, batch=2, prompt_len=2, seed=3, adaptive=True)),  # γ per round
    max_examples=lambda n: 4)


# ------------------------------------------------------------------------------------ SD-7
def law_sd7_engine_greedy(run, draft: str, gamma: int, adaptive: bool, n_tokens: int = 24):
    """SD-7 with the cached engine: greedy speculative output (3 rows from ``<bos>``) equals
    greedy target decoding (no cache, float64) token for token; the run observes the tokens that
    differ and the engine's statistics (acceptance, rounds, the γ of each round)."""
    target, dr = small_model("target", torch.float64), small_model(draft, torch.float64)
    prompt = torch.full((3, 1), small_tokenizer().bos_id)
    engine = run.impl.cls(target, dr, gamma=gamma, max_batch=3, max_seq_len=target.cfg.max_seq_len,
                          temperature=0.0, adaptive=adaptive)
    gammas = []
    out, st_ = engine.generate(prompt, n_tokens, on_round=lambda eng, buf, L: gammas.append(eng.last_gamma))
    out_ref, _ = generate(target, prompt, n_tokens)
    run.observe(dict(st_, gammas=gammas, differing=int((out != out_ref).sum())))
    assert_exact(out, out_ref, what=f"greedy speculative engine {run.implementation} ({draft}, gamma={gamma}) "
                                    "vs greedy target")


#: SD-7's law on one engine (``test_speculative_engine.py`` picks the engine, the draft and γ).
SD7 = Law(claim="SD-7", technique="speculative", body=law_sd7_engine_greedy, params=("draft", "gamma", "adaptive"))


# --------------------------------------------------------------- SD-1 at engine level (G-tests)
def first_token_counts(impl, target_name, draft_name, prompt_words, settings_, n, gamma, seed):
    """Counts (V,) of the first token the engine ``impl.cls`` emits after ``prompt_words`` over
    ``n`` rows at ``settings_`` (temperature, top_k, top_p), and the target's distributions there
    in float64, (V,) each: processed by ``settings_`` and raw."""
    T, k, p_top = settings_
    tok = small_tokenizer()
    prompt = torch.tensor([[tok.bos_id] + [tok.stoi[w] for w in prompt_words]])
    target, dr = small_model(target_name, torch.float32), small_model(draft_name, torch.float32)
    engine = impl.cls(target, dr, gamma=gamma, max_batch=n, max_seq_len=prompt.shape[1] + 2 * gamma + 2,
                      temperature=T, top_k=k, top_p=p_top)
    out, _ = engine.generate(prompt.expand(n, -1).contiguous(), 1, generator=torch.Generator().manual_seed(seed))
    counts = np.bincount(out[:, prompt.shape[1]].numpy(), minlength=target.cfg.vocab_size)
    with torch.no_grad():
        logits = small_model(target_name, torch.float64)(prompt)[0, -1]
    exact = process_logits(logits, T, k, p_top).numpy()
    raw = torch.softmax(logits, -1).numpy()
    return counts, exact / exact.sum(), raw / raw.sum()


#: The bfloat16-sampling law's case: a context where the draft's logits are large enough that
#: bfloat16's rounding of them moves q (the two drafts as target and draft keep it cheap).
BF16_CASE = dict(target_name="draft_poor", draft_name="draft_good", prompt_words=["old"],
                 settings_=(0.35, 0, 1.0), n=40_000, gamma=1)


def law_engine_first_token(run, seed: int = 3):
    """SD-1 at a context where bfloat16 rounding of the draft's logits moves q: the engine's
    first emitted tokens over 40000 rows follow the processed target (G-test, alpha = 1e-3).
    The G statistic is recorded for every engine, the known-bad ones too."""
    counts, exact, _ = first_token_counts(run.impl, seed=seed, **BF16_CASE)
    v = check_counts(counts, exact, alpha=ALPHA, what="first token after '<bos> old', temperature 0.35")
    what = f"{run.implementation} (known bad)" if run.impl.origin == "zoo" else "correct engine, '<bos> old', T=0.35"
    results.record("SD-1", measured=round(v.error, 2), bound=round(v.bound, 2), unit="G statistic",
                   rule="engine-level G-test, alpha=1e-3", what=what, temperature=0.35, trials=BF16_CASE["n"])
    v.check()


#: SD-1's draft-sampling law on one engine.
SD1_DRAFT_Q = Law(claim="SD-1", technique="speculative", body=law_engine_first_token, params=())


def law_engine_first_two(run, verify, n: int = 3000, seed: int = 21):
    """SD-1 end to end: the first two tokens of ``n`` engine generations after ``<bos>`` (poor
    draft, γ = 2, temperature 1, the engine's verifier ``verify``: None for its own) follow the
    target's own distribution of the first two tokens (G-test); the verdict is observed."""
    impl = run.impl
    target, dr = small_model("target", torch.float32), small_model("draft_poor", torch.float32)
    V = target.cfg.vocab_size
    engine = impl.cls(target, dr, gamma=2, max_batch=n, max_seq_len=16, verify=verify)
    out, _ = engine.generate(torch.full((n, 1), small_tokenizer().bos_id), 2, generator=torch.Generator().manual_seed(seed))
    counts = np.bincount((out[:, 1] * V + out[:, 2]).numpy(), minlength=V * V)
    exact = first_two_token_distribution(small_model("target", torch.float64), small_tokenizer().bos_id)
    v = check_counts(counts, exact / exact.sum(), alpha=ALPHA, what=f"engine {impl.name}: first two tokens")
    run.observe(v)
    v.check()


#: SD-1's end-to-end law on one engine and verifier.
SD1_FIRST_TWO = Law(claim="SD-1", technique="speculative", body=law_engine_first_two, params=("verify",))
