"""The continuous-batching engine over the paged cache (``optimized/paged_attention/engine.py``; claims
PA-6, PA-7; lecture 001 §4.1, §4.4).

- PA-6: with requests arriving at drawn steps, of drawn prompt and output lengths, in a cache
  small enough that requests are preempted and recomputed, every request gets exactly the
  tokens it gets run alone through the reference model without any cache (greedy, and sampled
  with a generator per request).
- PA-7: with the prefix cache on, outputs equal those without it; blocks of a shared prefix are
  computed once (the tokens computed drop by exactly the tokens reused); equal tokens after
  different prefixes never share a block.

- PA-8 (the engine half): with a token budget per step (chunked prefill: a long prompt split into
  chunks, each batched with the other requests' decode tokens), every request gets the same
  logits (float64 tolerance) and exactly the same sampled tokens as with unchunked prefill, for
  any budget C, any mix of arrivals and lengths, any block size; also through the Triton
  mixed-batch kernel.
- PA-9 (prefill/decode disaggregation) is the law of the ``kv_transfer`` technique
  (``properties/kv_transfer/``), over every registered transfer.

Known-bad engines (``properties/paged_attention/zoo.py``): a query that misses its own token (PA-6), a
prefix key without the parent's key (PA-7), a chunk's K/V written after its attention (PA-8);
each is rejected.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, note, settings
from hypothesis import strategies as st

from inference_conformance.conformance import results
from inference_conformance.conformance.tolerance import assert_exact
from inference_conformance.optimized.paged_attention.engine import PagedEngine
from inference_conformance.properties.paged_attention.engine_cases import (
    SYSTEM,
    Req,
    alone,
    blocks_for,
    model_for,
    run_engine,
    same_as,
    shared_prefix_workloads,
    workloads,
)
from inference_conformance.properties.paged_attention.zoo import _engine_zoo, expect_rejection, serving_engine_zoo
from inference_conformance.reference.transformer import generate

pytestmark = pytest.mark.usefixtures("one_torch_thread")


#: Four requests in 7 blocks of 2: preemption and recomputation happen; one is sampled.
PREEMPTING = (Req(tuple(range(3, 12)), 5, 0, 0.0, 1), Req(tuple(range(20, 26)), 6, 0, 1.0, 2),
              Req((5, 5, 5), 4, 1, 0.0, 3), Req(tuple(range(1, 12)), 3, 2, 1.0, 4))


@settings(max_examples=max(10, settings.default.max_examples // 3))
@given(reqs=workloads(), block_size=st.integers(1, 4), slack=st.integers(0, 12), max_batch=st.integers(1, 4),
       seed=st.integers(0, 100))
@example(reqs=PREEMPTING, block_size=2, slack=0, max_batch=4, seed=5)
def law_engine_equals_alone(engine_class, reqs, block_size, slack, max_batch, seed, **engine_kw):
    """PA-6: every request's tokens equal its tokens run alone (no cache, the reference)."""
    model = model_for(seed)
    engine = engine_class(model, num_blocks=blocks_for(reqs, block_size) + slack, block_size=block_size,
                          max_batch=max_batch, **engine_kw)
    out = run_engine(engine, reqs)
    note(f"stats {dict(engine.stats)}")
    for i, r in enumerate(reqs):
        assert_exact(torch.tensor(out[i]), torch.tensor(alone(model, r)),
                     what=f"request {i} (prompt {len(r.prompt)}, {r.max_new} new, T={r.temperature}) vs run alone")


@pytest.mark.claim("PA-6")
def test_pa6_continuous_batching_equals_alone():
    law_engine_equals_alone(PagedEngine)


@pytest.mark.claim("PA-6")
def test_pa6_preemption_happens_and_is_recomputed():
    """The pinned workload preempts (and so recomputes) at least once, and still equals alone."""
    model = model_for(5)
    engine = PagedEngine(model, num_blocks=blocks_for(PREEMPTING, 2), block_size=2, max_batch=4)
    out = run_engine(engine, PREEMPTING)
    assert engine.stats["preemptions"] > 0, dict(engine.stats)
    for i, r in enumerate(PREEMPTING):
        assert_exact(torch.tensor(out[i]), torch.tensor(alone(model, r)), what=f"request {i} after preemption")
    results.record("PA-6", measured=0, bound=0, unit="requests whose tokens differ from running alone",
                   rule=f"{len(PREEMPTING)} requests, {engine.stats['preemptions']} preemptions, "
                        f"{engine.stats['steps']} steps", preemptions=engine.stats["preemptions"])


@pytest.mark.claim("PA-6")
def test_pa6_engine_through_the_triton_kernels(device):
    """The same, with attention by the Triton paged kernel and writes by the Triton slot-mapping write."""
    pa = pytest.importorskip("inference_conformance.optimized.paged_attention")
    reqs = (Req((3, 4, 5, 6, 7), 3, 0, 0.0, 1), Req((9, 8, 7), 2, 1, 1.0, 2))
    model = model_for(5, device)
    engine = PagedEngine(model, num_blocks=6, block_size=2, max_batch=2,
                         attention=pa.paged_attention, write=pa.write_kv_cache)
    run_engine(engine, reqs, device)
    for i, r in enumerate(reqs):
        assert_exact(torch.tensor(engine.finished[i]), torch.tensor(alone(model, r, device)), what=f"request {i} (Triton)")


@pytest.mark.claim("PA-6")
def test_pa6_zoo_query_missing_its_token_rejected():
    bad, _ = _engine_zoo()
    expect_rejection("PA-6", law_engine_equals_alone, bad, entry="query_misses_its_own_token", match="vs run alone")


#: Equal tokens after different prefixes: block (7, 8, 9) follows (1, 2, 3) in one prompt and
#: opens the other; a key without the parent would share it.
DIFFERENT_PREFIXES = (Req((1, 2, 3, 7, 8, 9, 4), 3, 0, 0.0, 1), Req((7, 8, 9, 7, 8, 9, 5), 3, 2, 0.0, 2))


@settings(max_examples=max(8, settings.default.max_examples // 4))
@given(reqs=shared_prefix_workloads(), seed=st.integers(0, 100), slack=st.integers(0, 8))
@example(reqs=DIFFERENT_PREFIXES, seed=3, slack=4)
def law_prefix_cache(engine_class, reqs, seed, slack):
    """PA-7: outputs with the prefix cache equal outputs without it and alone; the tokens
    computed drop by exactly the tokens reused."""
    model = model_for(seed)
    nb = sum(-(-(len(r.prompt) + r.max_new) // 3) for r in reqs) + slack
    plain = PagedEngine(model, num_blocks=nb, block_size=3, max_batch=8)
    cached = engine_class(model, num_blocks=nb, block_size=3, max_batch=8, prefix_cache=True)
    out_plain, out_cached = run_engine(plain, reqs), run_engine(cached, reqs)
    note(f"plain {dict(plain.stats)}, cached {dict(cached.stats)}")
    for i, r in enumerate(reqs):
        assert_exact(torch.tensor(out_cached[i]), torch.tensor(alone(model, r)),
                     what=f"request {i} with the prefix cache vs run alone")
        assert_exact(torch.tensor(out_cached[i]), torch.tensor(out_plain[i]), what=f"request {i}, cache on vs off")
    if plain.stats["preemptions"] == cached.stats["preemptions"] == 0:
        assert cached.stats["computed_tokens"] == plain.stats["computed_tokens"] - cached.stats["reused_tokens"], \
            "tokens of reused blocks were computed again"


@pytest.mark.claim("PA-7")
def test_pa7_prefix_cache_equals_recompute():
    law_prefix_cache(PagedEngine)


@pytest.mark.claim("PA-7")
def test_pa7_shared_system_prompt_is_computed_once():
    """Four requests with one 12-token system prompt, arriving one after another: the prompt's
    4 blocks are computed by the first and reused by the other three."""
    model = model_for(11)
    reqs = tuple(Req(SYSTEM + (20 + i, 21 + i), 2, 3 * i, 0.0, i) for i in range(4))
    plain = PagedEngine(model, num_blocks=40, block_size=3)
    cached = PagedEngine(model, num_blocks=40, block_size=3, prefix_cache=True)
    out_plain, out_cached = run_engine(plain, reqs), run_engine(cached, reqs)
    assert out_plain == out_cached
    assert cached.stats["reused_tokens"] == 3 * len(SYSTEM), dict(cached.stats)
    saved = 1 - cached.stats["computed_tokens"] / plain.stats["computed_tokens"]
    results.record("PA-7", measured=cached.stats["reused_tokens"], lecture="the shared prefix's KV is reused",
                   unit="prompt tokens reused instead of recomputed",
                   rule="4 requests sharing a 12-token system prompt, blocks of 3; outputs equal with and without",
                   computed_with=cached.stats["computed_tokens"], computed_without=plain.stats["computed_tokens"],
                   fraction_saved=round(saved, 3))


@pytest.mark.claim("PA-7")
def test_pa7_equal_tokens_after_different_prefixes_are_not_shared():
    model = model_for(3)
    cached = PagedEngine(model, num_blocks=20, block_size=3, prefix_cache=True)
    run_engine(cached, DIFFERENT_PREFIXES)
    assert cached.stats["reused_tokens"] == 0, dict(cached.stats)


@pytest.mark.claim("PA-7")
def test_pa7_zoo_key_without_parent_rejected():
    _, bad = _engine_zoo()
    expect_rejection("PA-7", law_prefix_cache, bad, entry="prefix_key_without_parent",
                     match="with the prefix cache vs run alone")


def test_engine_rejects_bad_requests():
    e = PagedEngine(model_for(0), num_blocks=4, block_size=2)
    e.add_request("a", [1, 2], 2)
    for args, match in (((["a"], [1], 1), "already used"), ((["b"], [], 1), "at least one token"),
                        ((["c"], [37], 1), "outside"), ((["d"], [1], 0), "max_new_tokens must be >= 1"),
                        ((["e"], [1] * 60, 10), "max_seq_len"), ((["f"], [1] * 9, 1), "more than all 4 blocks")):
        with pytest.raises(ValueError, match=match):
            e.add_request(args[0][0], args[1], args[2])


@pytest.mark.claim("PA-6", "PA-3")
def test_pa6_parallel_sampling_by_fork_shares_the_prompt():
    """One 12-token prompt, greedy parent forked after its prefill into three sampled children:
    every sample equals the prompt plus the parent's first token generated alone with the same
    generator, and while they run the blocks in use are the prompt's (shared once) plus each
    sample's own blocks, fewer than four separate copies would hold."""
    model = model_for(9)
    prompt, n_new, bs = list(range(4, 16)), 5, 3
    e = PagedEngine(model, num_blocks=40, block_size=bs)
    e.add_request("p", prompt, n_new)
    e.step()                                              # prefill + the parent's first token
    first = e.running[0].out[0]
    for c in range(3):
        e.fork("p", c, torch.Generator().manual_seed(100 + c), temperature=1.0)
    e.step()
    shared_blocks = e.blocks_in_use()
    e.run()
    assert_exact(torch.tensor(e.finished["p"]), torch.tensor(alone(model, Req(tuple(prompt), n_new, 0, 0.0, 0))),
                 what="the parent vs alone")
    for c in range(3):
        gen = torch.Generator().manual_seed(100 + c)
        toks, _ = generate(model, torch.tensor([prompt + [first]]), n_new - 1, 1.0, gen)
        assert_exact(torch.tensor(e.finished[c]), torch.tensor([first] + toks[0, len(prompt) + 1:].tolist()),
                     what=f"sample {c} vs alone")
    unshared = 4 * -(-(len(prompt) + 2) // bs)
    assert shared_blocks < unshared, (shared_blocks, unshared)
    results.record("PA-3", measured=shared_blocks * bs, lecture="forked samples share the prompt's blocks",
                   unit="token slots held by 4 samples of a 12-token prompt (engine, blocks of 3)",
                   rule=f"unshared: {unshared * bs} slots", unshared=unshared * bs)


#: A 19-token prompt arriving while two requests decode, a token budget of 4: the prompt is
#: prefilled in chunks of 4 minus the decode tokens batched with them, over blocks of 3; the
#: second prompt's chunks start inside a block.
LONG_PROMPT = (Req((5, 6, 7), 6, 0, 0.0, 1), Req((8, 9), 7, 0, 1.0, 2), Req(tuple(range(1, 20)), 3, 1, 1.0, 3),
               Req(tuple(range(10, 17)), 2, 2, 0.0, 4))


@settings(max_examples=max(8, settings.default.max_examples // 3))
@given(reqs=workloads(max_requests=4, max_prompt=20), budget=st.integers(1, 10), block_size=st.integers(1, 5),
       slack=st.integers(0, 10), max_batch=st.integers(1, 4), seed=st.integers(0, 100))
@example(reqs=LONG_PROMPT, budget=4, block_size=3, slack=6, max_batch=4, seed=7)
def law_chunked_equals_unchunked(engine_class, reqs, budget, block_size, slack, max_batch, seed, **engine_kw):
    """PA-8: with a token budget per step every request gets the logits and tokens of unchunked prefill."""
    model = model_for(seed)
    nb = blocks_for(reqs, block_size) + slack
    whole = PagedEngine(model, num_blocks=nb, block_size=block_size, max_batch=max_batch, keep_logits=True)
    chunked = engine_class(model, num_blocks=nb, block_size=block_size, max_batch=max_batch, keep_logits=True,
                           max_num_batched_tokens=budget, **engine_kw)
    run_engine(whole, reqs)
    run_engine(chunked, reqs)
    note(f"whole {dict(whole.stats)}, chunked {dict(chunked.stats)}, step tokens {chunked.step_tokens}")
    assert max(chunked.step_tokens) <= budget, f"a step computed {max(chunked.step_tokens)} tokens > budget {budget}"
    same_as(chunked, whole, reqs, f"budget {budget} vs unchunked")


@pytest.mark.claim("PA-8")
def test_pa8_chunked_prefill_equals_unchunked():
    law_chunked_equals_unchunked(PagedEngine)


@pytest.mark.claim("PA-8")
def test_pa8_long_prompt_is_chunked_beside_decodes():
    """The pinned workload does chunk: the 19-token prompt takes several steps, each also
    carrying the other requests' decode tokens, and still equals unchunked prefill."""
    model = model_for(7)
    nb = blocks_for(LONG_PROMPT, 3) + 6
    whole = PagedEngine(model, num_blocks=nb, block_size=3, keep_logits=True)
    chunked = PagedEngine(model, num_blocks=nb, block_size=3, keep_logits=True, max_num_batched_tokens=4)
    run_engine(whole, LONG_PROMPT)
    run_engine(chunked, LONG_PROMPT)
    same_as(chunked, whole, LONG_PROMPT, "budget 4 vs unchunked")
    steps_with_prompt = [i for i, n in enumerate(chunked.step_tokens) if n == 4]
    assert len(steps_with_prompt) >= 5, chunked.step_tokens
    assert max(chunked.step_tokens) == 4 and max(whole.step_tokens) >= 19, (chunked.step_tokens, whole.step_tokens)
    results.record("PA-8", measured=0, bound=0, unit="requests whose tokens differ from unchunked prefill",
                   rule=f"{len(LONG_PROMPT)} requests, a 19-token prompt in chunks of <= 4 tokens (blocks of 3): "
                        f"{chunked.stats['steps']} steps chunked, {whole.stats['steps']} unchunked; largest step "
                        f"{max(chunked.step_tokens)} vs {max(whole.step_tokens)} tokens")


@pytest.mark.claim("PA-8")
def test_pa8_chunked_engine_through_the_triton_mixed_batch_kernel(device):
    """The chunked engine with every layer's attention one launch of the Triton mixed-batch
    kernel (``paged_prefill``) and writes by the Triton slot-mapping write equals the unchunked
    reference engine."""
    pp = pytest.importorskip("inference_conformance.optimized.paged_attention.prefill")
    pa = pytest.importorskip("inference_conformance.optimized.paged_attention")
    reqs = (Req((3, 4, 5), 3, 0, 0.0, 1), Req(tuple(range(2, 13)), 2, 1, 1.0, 2))
    model = model_for(5, device)
    whole = PagedEngine(model, num_blocks=12, block_size=2, keep_logits=True)
    chunked = PagedEngine(model, num_blocks=12, block_size=2, keep_logits=True, max_num_batched_tokens=5,
                          prefill=pp.paged_prefill, write=pa.write_kv_cache)
    for engine in (whole, chunked):
        run_engine(engine, reqs, device)
    assert max(chunked.step_tokens) <= 5 < max(whole.step_tokens)
    same_as(chunked, whole, reqs, "Triton mixed batch, budget 5, vs unchunked reference")


@pytest.mark.claim("PA-8")
def test_pa8_zoo_chunk_kv_written_after_attention_rejected():
    bad = serving_engine_zoo()["chunk_kv_written_after_attention"]
    expect_rejection("PA-8", law_chunked_equals_unchunked, bad, entry="chunk_kv_written_after_attention", match="vs unchunked")


def test_engine_rejects_bad_token_budget():
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="max_num_batched_tokens"):
            PagedEngine(model_for(0), num_blocks=4, block_size=2, max_num_batched_tokens=bad)
