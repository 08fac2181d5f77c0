"""Laws of the speculative decoding engine with KV caches (``optimized/speculative/engine.py``;
claims SD-1, SD-7, SD-8; lecture 002 §2).

- SD-8: after every round, the target's and the draft's caches hold exactly the committed tokens
  but the pending one (the draft one fewer after a round that accepted every draft token): the
  lengths exactly, NaN in every slot past them exactly (as in a cache that never saw the rejected
  tokens), and the keys and values of one recomputation over the accepted tokens only (float64
  rule, 1e-12 of the scale).
- SD-7 at engine level: greedy speculative decoding emits exactly the tokens of greedy target
  decoding, for both drafts and any γ.
- SD-1 at engine level: the engine's first emitted tokens follow the target's processed
  distribution (G-test), with temperature, top-k and top-p applied to the target and the draft
  alike; the same counts reject the unprocessed distribution, and an engine that samples its
  draft tokens from a bfloat16 softmax while passing verify the float32 q is rejected.

Known-bad engines (``properties/speculative/zoo.py`` ``ENGINE_ZOO``), each shown rejected:
``forgets_rollback`` (SD-8 and SD-7), ``forgets_draft_rollback`` (SD-8 only: its output is still
right, as any draft is a valid draft), ``bfloat16_draft_sampling`` and ``bfloat16_draft_q`` (the
engine-level G-test).
"""
from __future__ import annotations

from functools import lru_cache
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import example, given, note
from hypothesis import strategies as st

from inference_conformance.conformance import results
from inference_conformance.conformance.stats import check_counts
from inference_conformance.conformance.tolerance import assert_close, assert_exact, check_exact
from inference_conformance.conformance.laws import Law
from inference_conformance.conformance.zoo import expect_rejected
from inference_conformance.optimized.speculative.engine import SpeculativeEngine
from inference_conformance.properties.speculative.cases import first_two_token_distribution
from inference_conformance.properties.speculative.zoo import ENGINE_ZOO
from inference_conformance.reference.speculative import process_logits
from inference_conformance.reference.transformer import generate, layer_kv

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.suite_own("the suite's speculative engine with KV caches; an outside engine's speculation is judged by EN-3 "
                                    "(inference_engine)")]

ALPHA = 1e-3
DRAFTS = ("draft_good", "draft_poor")


@lru_cache(maxsize=None)
def _model(name: str, dtype: torch.dtype):
    from inference_conformance.smallworld.checkpoints import load_model

    return load_model(name, dtype)


def _tok():
    from inference_conformance.smallworld.tokenizer import tokenizer

    return tokenizer()


def _bad(name: str):
    """A zoo engine as expect_rejected expects a known-bad implementation."""
    return SimpleNamespace(name=name, target=f"inference_conformance.properties.speculative.zoo:{ENGINE_ZOO[name].__name__}",
                           cls=ENGINE_ZOO[name], origin="zoo")


def _good():
    return SimpleNamespace(name="speculative_engine", target="inference_conformance.optimized.speculative.engine:SpeculativeEngine",
                           cls=SpeculativeEngine, origin="builtin")


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
    target, dr = _model("target", torch.float64), _model(draft, torch.float64)
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.cat([torch.full((batch, 1), _tok().bos_id),
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


#: SD-8's law, on the engine (not a registered implementation: the tests below pick it).
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


@pytest.mark.claim("SD-8")
def test_sd8_caches_equal_the_accepted_prefix():
    """SD-8: after every round both caches hold exactly the accepted prefix (lengths and NaN past
    them exactly; keys and values those of decoding only the accepted tokens, float64 1e-12)."""
    run = SD8(_good())
    results.record("SD-8", measured=max(run.observations), bound="float64: 1e-12 x scale; lengths and NaN slots exact",
                   unit="max |cached K, V - recomputed over the accepted tokens|",
                   rule="checked after every round, target and draft caches", what="max abs error")


@pytest.mark.claim("SD-8")
@pytest.mark.parametrize("bad", ["forgets_rollback", "forgets_draft_rollback"])
def test_sd8_zoo_rejected(bad):
    text = expect_rejected(SD8, _bad(bad))
    results.record("SD-8", measured="rejected", unit="known-bad engine", rule="SD-8 cache check",
                   what=f"{bad}: {text[:120]}")


# ------------------------------------------------------------------------------------ SD-7
def law_sd7_engine_greedy(run, draft: str, gamma: int, adaptive: bool, n_tokens: int = 24):
    """SD-7 with the cached engine: greedy speculative output (3 rows from ``<bos>``) equals
    greedy target decoding (no cache, float64) token for token; the run observes the tokens that
    differ and the engine's statistics (acceptance, rounds, the γ of each round)."""
    target, dr = _model("target", torch.float64), _model(draft, torch.float64)
    prompt = torch.full((3, 1), _tok().bos_id)
    engine = run.impl.cls(target, dr, gamma=gamma, max_batch=3, max_seq_len=target.cfg.max_seq_len,
                          temperature=0.0, adaptive=adaptive)
    gammas = []
    out, st_ = engine.generate(prompt, n_tokens, on_round=lambda eng, buf, L: gammas.append(eng.last_gamma))
    out_ref, _ = generate(target, prompt, n_tokens)
    run.observe(dict(st_, gammas=gammas, differing=int((out != out_ref).sum())))
    assert_exact(out, out_ref, what=f"greedy speculative engine {run.implementation} ({draft}, gamma={gamma}) "
                                    "vs greedy target")


#: SD-7's law on one engine (the tests below pick the engine, the draft and γ).
SD7 = Law(claim="SD-7", technique="speculative", body=law_sd7_engine_greedy, params=("draft", "gamma", "adaptive"))


@pytest.mark.claim("SD-7")
@pytest.mark.parametrize("draft", DRAFTS)
@pytest.mark.parametrize("gamma,adaptive", [(1, False), (3, False), (6, False), (8, True)],
                         ids=["g1", "g3", "g6", "adaptive-g1..8"])
def test_sd7_engine_greedy_equals_greedy_target(draft, gamma, adaptive):
    """SD-7 with the cached engine: greedy speculative output equals greedy target decoding
    (no cache, float64) token for token, whatever the draft, with a fixed γ or one chosen each
    round from the recent acceptance rate (up to 8)."""
    (st_,) = SD7(_good(), draft, gamma, adaptive).observations
    results.record("SD-7", measured=st_["differing"], bound=0, unit="tokens differing",
                   rule="exact (cached engine with rollback)", gamma=gamma, draft=draft,
                   alpha=st_["accepted"] / st_["drafted"], rounds=st_["rounds"],
                   what=f"adaptive gamma, mean {np.mean(st_['gammas']):.2f}" if adaptive else "fixed gamma")


@pytest.mark.claim("SD-7")
def test_sd7_engine_zoo():
    """An engine that forgets to roll back emits other tokens than greedy target decoding; one
    that forgets only the draft's rollback still emits the right ones (SD-7 cannot see it, SD-8
    does: ``test_sd8_zoo_rejected``)."""
    SD7(_bad("forgets_draft_rollback"), "draft_poor", 3, False)      # passes: the draft is only a proposal
    text = expect_rejected(SD7, _bad("forgets_rollback"), "draft_poor", 3, False)
    results.record("SD-7", measured="rejected", unit="known-bad engine", rule="SD-7 greedy equality",
                   what=f"forgets_rollback: {text[:120]}")


# --------------------------------------------------------------- SD-1 at engine level (G-tests)
#: Sampling settings the laws use: (temperature, top_k, top_p).
SETTINGS = {"raw": (1.0, 0, 1.0), "t0.7-k20-p0.9": (0.7, 20, 0.9), "t1.5-k10-p0.95": (1.5, 10, 0.95)}


def _first_token_counts(impl, target_name, draft_name, prompt_words, settings_, n, gamma, seed):
    """Counts of the first token the engine emits after ``prompt_words`` over ``n`` rows, and
    the exact processed target distribution there (float64)."""
    T, k, p_top = settings_
    tok = _tok()
    prompt = torch.tensor([[tok.bos_id] + [tok.stoi[w] for w in prompt_words]])
    target, dr = _model(target_name, torch.float32), _model(draft_name, torch.float32)
    engine = impl.cls(target, dr, gamma=gamma, max_batch=n, max_seq_len=prompt.shape[1] + 2 * gamma + 2,
                      temperature=T, top_k=k, top_p=p_top)
    out, _ = engine.generate(prompt.expand(n, -1).contiguous(), 1, generator=torch.Generator().manual_seed(seed))
    counts = np.bincount(out[:, prompt.shape[1]].numpy(), minlength=target.cfg.vocab_size)
    with torch.no_grad():
        logits = _model(target_name, torch.float64)(prompt)[0, -1]
    exact = process_logits(logits, T, k, p_top).numpy()
    raw = torch.softmax(logits, -1).numpy()
    return counts, exact / exact.sum(), raw / raw.sum()


@pytest.mark.claim("SD-1")
@pytest.mark.parametrize("name", list(SETTINGS))
def test_sd1_engine_follows_processed_target(name):
    """With temperature, top-k and top-p applied to the target and the draft alike, the engine's
    first emitted token follows the processed target distribution (G-test, alpha = 1e-3, 4000
    rows, poor draft, gamma = 3); when processing changes the distribution, the same counts
    reject the unprocessed one (the test can fail)."""
    counts, exact, raw = _first_token_counts(_good(), "target", "draft_poor", ["the"], SETTINGS[name],
                                             4000, 3, seed=5)
    v = check_counts(counts, exact, alpha=ALPHA, what=f"first token after '<bos> the', settings {name}")
    T, k, p_top = SETTINGS[name]
    results.record("SD-1", measured=round(v.error, 2), bound=round(v.bound, 2), unit="G statistic",
                   rule="engine's first emitted token vs processed target distribution, alpha=1e-3",
                   what=f"engine, {name}", temperature=T, top_k=k, top_p=p_top, trials=4000)
    v.check()
    if name != "raw":
        against_raw = check_counts(counts, raw, alpha=ALPHA, what="the same counts vs the unprocessed target")
        assert not against_raw.ok, f"settings {name}: the counts also fit the unprocessed target"


#: The bfloat16-sampling law's case: a context where the draft's logits are large enough that
#: bfloat16's rounding of them moves q (the two drafts as target and draft keep it cheap).
BF16_CASE = dict(target_name="draft_poor", draft_name="draft_good", prompt_words=["old"],
                 settings_=(0.35, 0, 1.0), n=40_000, gamma=1)


def law_engine_first_token(run, seed: int = 3):
    """SD-1 at a context where bfloat16 rounding of the draft's logits moves q: the engine's
    first emitted tokens over 40000 rows follow the processed target (G-test, alpha = 1e-3).
    The G statistic is recorded for every engine, the known-bad ones too."""
    counts, exact, _ = _first_token_counts(run.impl, seed=seed, **BF16_CASE)
    v = check_counts(counts, exact, alpha=ALPHA, what="first token after '<bos> old', temperature 0.35")
    what = f"{run.implementation} (known bad)" if run.impl.origin == "zoo" else "correct engine, '<bos> old', T=0.35"
    results.record("SD-1", measured=round(v.error, 2), bound=round(v.bound, 2), unit="G statistic",
                   rule="engine-level G-test, alpha=1e-3", what=what, temperature=0.35, trials=BF16_CASE["n"])
    v.check()


#: SD-1's draft-sampling law on one engine.
SD1_DRAFT_Q = Law(claim="SD-1", technique="speculative", body=law_engine_first_token, params=())


@pytest.mark.claim("SD-1")
def test_sd1_engine_draft_sampled_from_q():
    """The engine samples its draft tokens from exactly the q it passes to verify: at a context
    where bfloat16 rounding of the draft's logits moves q (KL about 1.6e-3), 40000 rows follow
    the target (G-test); the engine that samples from a bfloat16 softmax while passing the float32
    q, and the one that samples from the float32 softmax while passing a bfloat16 q, are rejected."""
    SD1_DRAFT_Q(_good())
    for name in ("bfloat16_draft_sampling", "bfloat16_draft_q"):
        expect_rejected(SD1_DRAFT_Q, _bad(name))


def _naive_process(logits: list[float], T: float, k: int, top_p: float) -> list[float]:
    """:func:`process_logits` one token at a time in Python floats (float64)."""
    import math

    m = max(x / T for x in logits)
    e = [math.exp(x / T - m) for x in logits]
    probs = [x / sum(e) for x in e]
    if 0 < k < len(probs):
        kth = sorted(probs, reverse=True)[k - 1]
        probs = [x if x >= kth else 0.0 for x in probs]
        probs = [x / sum(probs) for x in probs]
    if top_p < 1.0:
        order = sorted(range(len(probs)), key=lambda i: (-probs[i], i))
        kept, before = set(), 0.0
        for i in order:
            if before < top_p:
                kept.add(i)
            before += probs[i]
        probs = [x if i in kept else 0.0 for i, x in enumerate(probs)]
        probs = [x / sum(probs) for x in probs]
    return probs


@given(logits=st.lists(st.integers(-8, 8).map(lambda x: x / 2), min_size=2, max_size=12),
       T=st.sampled_from([0.3, 0.7, 1.0, 2.5]), k=st.integers(0, 13), top_p=st.sampled_from([0.05, 0.5, 0.9, 1.0]))
@example(logits=[1.0, 1.0, 1.0, 0.0], T=1.0, k=2, top_p=1.0)       # ties with the k-th are kept
@example(logits=[3.0, 0.0, -1.0], T=1.0, k=1, top_p=1.0)           # top-1: the argmax only
@example(logits=[0.0, 0.5, 0.0], T=1.0, k=0, top_p=0.05)          # tiny top-p: the most probable token
@example(logits=[0.0, 0.0, 0.0, 0.0], T=0.7, k=0, top_p=0.5)       # top-p on a boundary: two of four
@example(logits=[2.0, 1.0], T=2.5, k=5, top_p=1.0)                 # k >= V: nothing truncated
def test_process_logits_matches_naive(logits, T, k, top_p):
    """Temperature, top-k and top-p of :func:`process_logits` equal a token-by-token Python
    computation: the kept set exactly, the probabilities to float64 rounding."""
    got = process_logits(torch.tensor(logits, dtype=torch.float64), T, k, top_p)
    want = torch.tensor(_naive_process(logits, T, k, top_p), dtype=torch.float64)
    assert_exact(got > 0, want > 0, what="tokens kept")
    assert_close(got, want, what="processed probabilities")


def test_process_logits_errors():
    with pytest.raises(ValueError, match="temperature"):
        process_logits(torch.zeros(3), 0.0)
    with pytest.raises(ValueError, match="top_k"):
        process_logits(torch.zeros(3), 1.0, top_k=-1)
    with pytest.raises(ValueError, match="top_p"):
        process_logits(torch.zeros(3), 1.0, top_p=0.0)
    with pytest.raises(ValueError, match="gamma"):
        SpeculativeEngine(_model("target", torch.float32), _model("draft_poor", torch.float32), gamma=0,
                          max_batch=1, max_seq_len=16)


def law_engine_first_two(run, verify, n: int = 3000, seed: int = 21):
    """SD-1 end to end: the first two tokens of ``n`` engine generations after ``<bos>`` (poor
    draft, γ = 2, temperature 1, the engine's verifier ``verify``: None for its own) follow the
    target's own distribution of the first two tokens (G-test); the verdict is observed."""
    impl = run.impl
    target, dr = _model("target", torch.float32), _model("draft_poor", torch.float32)
    V = target.cfg.vocab_size
    engine = impl.cls(target, dr, gamma=2, max_batch=n, max_seq_len=16, verify=verify)
    out, _ = engine.generate(torch.full((n, 1), _tok().bos_id), 2, generator=torch.Generator().manual_seed(seed))
    counts = np.bincount((out[:, 1] * V + out[:, 2]).numpy(), minlength=V * V)
    exact = first_two_token_distribution(_model("target", torch.float64), _tok().bos_id)
    v = check_counts(counts, exact / exact.sum(), alpha=ALPHA, what=f"engine {impl.name}: first two tokens")
    run.observe(v)
    v.check()


#: SD-1's end-to-end law on one engine and verifier.
SD1_FIRST_TWO = Law(claim="SD-1", technique="speculative", body=law_engine_first_two, params=("verify",))


@pytest.mark.claim("SD-1")
def test_sd1_engine_first_two_tokens():
    """SD-1 end to end with the cached engine: the first two tokens of 3000 generations (poor
    draft, γ = 2) follow the target's own sampling (G-test over the V² pairs, alpha = 1e-3); the
    same engine with the min(1, q/p) verifier of the zoo is rejected by the same test. (Forgetting
    the rollback is too subtle here, G = 108 against 171: it shows only from the second round;
    SD-8 and SD-7 reject it.)"""
    (v,) = SD1_FIRST_TWO(_good(), None).observations
    results.record("SD-1", measured=round(v.error, 2), bound=round(v.bound, 2), unit="G statistic",
                   rule="engine end to end: first two tokens vs the target's own sampling, alpha=1e-3",
                   what="cached engine, first two tokens", trials=3000, draft="draft_poor", gamma=2)
    from inference_conformance.properties.speculative.zoo import accept_q_over_p

    expect_rejected(SD1_FIRST_TWO, _good(), accept_q_over_p)
