"""Whole-engine throughput (``inference_engine``): for every registered engine that runs here
(the suite's own; transformers' in ``tox -e peers-hf``; CTranslate2, onnxruntime-genai and vLLM in
``tox -e peers-engines``), greedy generation of NEW tokens after each of REQUESTS grammar prompts
of the small world's exported target, the requests sent one by one ("alone") and in one call
("batched"); tokens/s = generated tokens / wall time (prefill included), both in one run so the
ratio compares like with like. And for each speculative method an engine offers, greedy
generation request by request beside target-only in the same run: tokens/s of both, and the
engine's own counts where it gives them (``Completion.target_calls``, ``drafted``, ``accepted``):
tokens per target call (SD-3) and the acceptance rate α = accepted / drafted (SD-2). One intra-op
thread on the CPU. Figures only: no speed is asserted.
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.benchmarks.timing import median_seconds, rounds
from inference_conformance.conformance import registry, results
from inference_conformance.conformance.contracts.inference_engine import Request

REQUESTS, NEW = 8, 16
#: Draft tokens per round of the speculative benchmark.
GAMMA = 3

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _engines():
    return [pytest.param(i, id=i.name, marks=[pytest.mark.skip(reason=i.unavailable)] if i.unavailable else [])
            for i in registry.builtins("inference_engine")]


@pytest.mark.parametrize("engine", _engines())
def test_bench_engine_tokens_per_s(benchmark, device, engine):
    """tokens/s of ``engine`` alone and batched (see the module docstring)."""
    from inference_conformance.properties.inference_engine import cases

    reqs = [Request(p, NEW) for p in cases.document_prompts(0, REQUESTS)]
    p = cases.params()
    batching = engine.capabilities().batching

    def alone():
        return [engine.generate([r], p)[0] for r in reqs]

    def batched():
        return engine.generate(reqs, p) if batching else alone()

    repeats = 1 if benchmark.disabled else 3
    t_alone = median_seconds(alone, "cpu", repeats)
    t_batched = median_seconds(batched, "cpu", repeats)
    total = REQUESTS * NEW
    results.bench_info(benchmark, technique="inference_engine", implementation=engine.name, device=device,
                       dtype=str(engine.capabilities().dtype).replace("torch.", ""), batch=REQUESTS,
                       median_s=t_batched, tokens_per_s={"alone": total / t_alone, "batched": total / t_batched})
    benchmark.pedantic(batched, rounds=rounds(benchmark, t_batched, repeats), warmup_rounds=0)


def _speculative():
    """(engine, method) for each speculative method of each engine that runs here; one skipped
    row, with the reason, for each engine that does not."""
    rows = []
    for i in registry.builtins("inference_engine"):
        if i.unavailable:
            rows.append(pytest.param(i, None, id=i.name, marks=[pytest.mark.skip(reason=i.unavailable)]))
        else:
            rows += [pytest.param(i, m, id=f"{i.name}-{m}") for m in i.capabilities().speculative]
    return rows


@pytest.mark.parametrize(("engine", "method"), _speculative())
def test_bench_engine_speculation(benchmark, device, engine, method):
    """Speculative ``method`` of ``engine`` against its target-only generation (see the module
    docstring): GAMMA draft tokens per round, REQUESTS grammar prompts one by one."""
    from inference_conformance.properties.inference_engine import cases

    n_req, new = (REQUESTS, NEW) if not benchmark.disabled else (2, 6)    # a smoke run when timings are off
    reqs = [Request(p, new) for p in cases.document_prompts(1, n_req)]
    plain, spec = cases.params(), cases.params(speculative=method, num_speculative_tokens=GAMMA)
    done: dict = {}

    def run(p, key):
        done[key] = [engine.generate([r], p)[0] for r in reqs]
        return done[key]

    t_plain = median_seconds(lambda: run(plain, "plain"), "cpu", 1)
    t_spec = median_seconds(lambda: run(spec, "spec"), "cpu", 1)
    total = n_req * new
    out = done["spec"]
    calls = [c.target_calls for c in out]
    drafted = [c.drafted for c in out]
    accepted = [c.accepted for c in out]
    extra = {}
    if None not in calls:
        extra["tokens_per_call"] = total / sum(calls)
    if None not in drafted and None not in accepted and sum(drafted):
        extra["alpha"] = sum(accepted) / sum(drafted)
    same = all(torch.equal(a.tokens, b.tokens) for a, b in zip(done["plain"], out))
    results.bench_info(benchmark, technique="inference_engine", implementation=engine.name, device=device,
                       dtype=str(engine.capabilities().dtype).replace("torch.", ""), batch=1, gamma=GAMMA, requests=n_req,
                       what=f"speculative {method} vs target-only (greedy; tokens equal: {same})", median_s=t_spec,
                       tokens_per_s={"target-only": total / t_plain, method: total / t_spec}, **extra)
    benchmark.pedantic(lambda: run(spec, "spec"), rounds=1, warmup_rounds=0)
