"""The suite's continuous-batching engine over the paged cache (``optimized/paged_attention/engine.py``;
claims PA-6, PA-7, PA-8; lecture 001 §4.1, §4.4, §4.5): what its pinned workloads do inside it.

The laws PA-6 (arrivals, preemption), PA-7 (the prefix cache) and PA-8's engine half (chunked
prefill) run over every registered ``inference_engine`` through the contract's ``serve``
(``properties/inference_engine/laws/serving.py``, this engine the built-in "paged", its known-bad
versions in ``properties/paged_attention/zoo.py`` registered there). Here, on the engine itself
with the float64 test model: the pinned workloads preempt, reuse exactly the shared prefix's
blocks, never share equal tokens after different prefixes, chunk a long prompt beside decodes,
fork samples sharing the prompt's blocks, and do so through the Triton kernels too (each equal
to running alone, exactly); bad requests and budgets are refused. PA-9 (disaggregation) is the
``kv_transfer`` technique's (``properties/kv_transfer/``).
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.conformance import results
from inference_conformance.conformance.tolerance import assert_exact
from inference_conformance.optimized.paged_attention.engine import PagedEngine
from inference_conformance.properties.paged_attention.engine_cases import (
    DIFFERENT_PREFIXES,
    LONG_PROMPT,
    PREEMPTING,
    SYSTEM,
    Req,
    alone,
    blocks_for,
    model_for,
    run_engine,
    same_as,
)
from inference_conformance.reference.transformer import generate

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.suite_own("the suite's paged engine on its pinned workloads, inside the engine (preemption, reuse, chunks, fork, "
                                    "the Triton kernels); outside engines meet PA-6..PA-8 as serve laws of inference_engine")]


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


def test_engine_rejects_bad_token_budget():
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="max_num_batched_tokens"):
            PagedEngine(model_for(0), num_blocks=4, block_size=2, max_num_batched_tokens=bad)
