"""Whole-engine throughput (``inference_engine``): for every registered engine that runs here
(the suite's own; transformers' in ``tox -e peers-hf``; CTranslate2, onnxruntime-genai and vLLM in
``tox -e peers-engines``), greedy generation of NEW tokens after each of REQUESTS grammar prompts
of the small world's exported target, the requests sent one by one ("alone") and in one call
("batched"); tokens/s = generated tokens / wall time (prefill included), both in one run so the
ratio compares like with like. One intra-op thread on the CPU. Figures only: no speed is asserted.
"""
from __future__ import annotations

import pytest

from inference_conformance.benchmarks.timing import median_seconds, rounds
from inference_conformance.conformance import registry, results
from inference_conformance.conformance.contracts.inference_engine import Request

REQUESTS, NEW = 8, 16

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _engines():
    return [pytest.param(i, id=i.name, marks=[pytest.mark.skip(reason=i.unavailable)] if i.unavailable else [])
            for i in registry.builtins("inference_engine")]


@pytest.mark.parametrize("engine", _engines())
def test_bench_engine_tokens_per_s(benchmark, device, engine):
    """tokens/s of ``engine`` alone and batched (see the module docstring)."""
    from inference_conformance.properties.inference_engine import cases as C

    reqs = [Request(p, NEW) for p in C.document_prompts(0, REQUESTS)]
    p = C.params()
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
