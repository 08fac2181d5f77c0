"""The paged engine's features two (or more) at a time, inside the engine (claims PA-6, PA-7,
PA-8; lecture 001 §4.4, §4.5). The law, continuous batching in every example with any two of the
prefix cache, chunked prefill, a copy-on-write fork and preemption, runs over every registered
``inference_engine`` through the contract's ``serve`` (``properties/inference_engine/laws/serving.py``,
its known-bad engine publishing a prefix block before its chunk is computed among the registered
zoo). Here, on the engine itself with the float64 test model: each pinned pair does what it names
and every request (and a forked child) equals running alone exactly
(``properties/paged_attention/engine_pairs_cases.py``), also through the Triton kernels.
"""
from __future__ import annotations

import functools

import pytest
import torch

from inference_conformance.conformance import results
from inference_conformance.conformance.tolerance import assert_exact
from inference_conformance.optimized.paged_attention.engine import PagedEngine
from inference_conformance.properties.paged_attention.engine_cases import model_for
from inference_conformance.properties.paged_attention.engine_pairs_cases import (
    PAIRS,
    Combo,
    expected,
    pinned,
    run_combo,
)

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.suite_own("the suite's paged engine on its pinned workloads, inside the engine (preemption, reuse, chunks, fork, "
                                    "the Triton kernels); outside engines meet PA-6..PA-8 as serve laws of inference_engine")]


def run_pinned(engine_class, combo: Combo, device: str = "cpu"):
    """Every request's tokens (and a forked child's) equal its tokens alone, whatever features
    are on together; returns the engine (its stats)."""
    model = model_for(combo.seed, device)
    engine = engine_class(model, **combo.engine_kw())
    got = run_combo(engine, combo, device)
    want = expected(model, combo, got["forked_after"], device)
    for rid, toks in want.items():
        assert_exact(torch.tensor(got[rid]), torch.tensor(toks),
                     what=f"request {rid} with {' + '.join(sorted(combo.features))} vs run alone")
    return engine


@pytest.mark.claim("PA-7", "PA-8")
def test_prefix_cache_with_chunks_through_the_triton_kernels(device):
    """The prefix cache with chunked prefill (the pinned pair), every layer's attention one launch
    of the Triton mixed-batch kernel and writes by the Triton slot write: every request equals
    running alone (the other pairs cost ~3 s each under the interpreter: the reference attention
    runs them)."""
    pp = pytest.importorskip("inference_conformance.optimized.paged_attention.prefill")
    pa = pytest.importorskip("inference_conformance.optimized.paged_attention")
    combo = next(c for c in pinned() if c.features == {"prefix_cache", "chunked_prefill"})
    engine = run_pinned(functools.partial(PagedEngine, prefill=pp.paged_prefill, write=pa.write_kv_cache),
                                   combo, device)
    assert engine.stats["reused_tokens"] > 0 and max(engine.step_tokens) <= combo.budget, dict(engine.stats)


@pytest.mark.claim("PA-6", "PA-7", "PA-8")
def test_pinned_pairs_exercise_both_features():
    """Each pinned pair does what it names on the correct engine: the prefix cache reuses
    tokens, the budget chunks a step, the fork runs a child, the small pool preempts."""
    did = {"prefix_cache": lambda e: e.stats["reused_tokens"] > 0,
           "chunked_prefill": lambda e: max(e.step_tokens) <= 4 and len(e.step_tokens) > 5,
           "fork": lambda e: "child" in e.finished,
           "preemption": lambda e: e.stats["preemptions"] > 0}
    missing = []
    for combo in pinned():
        engine = run_pinned(PagedEngine, combo)
        missing += [f"{sorted(combo.features)}: {f}" for f in combo.features if not did[f](engine)]
    assert not missing, missing
    results.record("PA-7", measured=0, bound=0, unit="requests whose tokens differ from running alone",
                   rule=f"{len(PAIRS)} pairs of prefix cache, chunked prefill, fork and preemption, each "
                        "exercised, with continuous batching")
