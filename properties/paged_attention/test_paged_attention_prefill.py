"""Tests of paged attention's mixed batch beside its laws (claim PA-8, the kernel half; lecture 001
§4.5; the laws in ``laws/prefill.py``): the Triton kernel's split paths, an all-decode batch as
paged attention, the generic checks, the coverage table and the long chunks' sizes.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from inference_conformance.conformance.device import triton_interpreted
from inference_conformance.conformance.laws import refusal
from inference_conformance.properties import strategies
from inference_conformance.conformance.coverage import classes_reached, missing_classes
from inference_conformance.properties.paged_attention.cases import (
    PagedCase,
    check_against_contiguous,
    fit_prefill_budget,
    make_inputs,
    make_prefill_inputs,
    prefill_cases,
)
from inference_conformance.properties.paged_attention.laws.prefill import PA8, PA8_LONG, PREFILL_EXAMPLES
from inference_conformance.properties.paged_attention.prefill_cases import (
    prefill_case,
    LONG_CHUNKS,
    SCALE_COVERAGE,
    check_against_causal,
    long_chunks_for,
)

TECH = "paged_attention"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.claim("PA-8")
@settings(max_examples=3)
@given(case=prefill_cases(), seed=strategies.seeds, num_splits=st.integers(1, 3),
       dtype=st.sampled_from([torch.float64, torch.float32, torch.bfloat16]))
@example(case=prefill_case((9, 150), (1, 12), 4, 2, 16, 5), seed=3, num_splits=3, dtype=torch.float32)
@pytest.mark.suite_own("the suite's Triton mixed-batch kernel's split paths (its internals)")
def test_pa8_triton_split_kv_paths(device, case, seed, num_splits, dtype):
    """The Triton mixed-batch kernel with each tile's keys split into 1..3 ranges (merged by
    log-sum-exp; a split past a tile's last visible key weighs 0) equals dense causal attention."""
    pp = pytest.importorskip("inference_conformance.optimized.paged_attention.prefill")
    if triton_interpreted():
        case = fit_prefill_budget(case, budget=12)
    inp = make_prefill_inputs(case, seed, dtype, device)
    out = pp.paged_prefill(*inp.args(), scale=case.scale, num_splits=num_splits)
    check_against_causal(out, inp, case, what=f"Triton mixed batch, {num_splits} splits")


@pytest.mark.technique(TECH)
@pytest.mark.claim("PA-8", "PA-1")
def test_pa8_all_decode_batch_is_paged_attention(impl, device):
    """A mixed batch of decode tokens only (every q_len 1) is the decode call: ``paged_prefill``
    with query_start_loc = 0, 1, ..., B equals ``paged_attention`` on the same caches, by the
    tolerance policy against the same float64 oracle."""
    case = PagedCase((17, 130, 1), 6, 2, 16, 3, 0.7 / math.sqrt(16))
    inp = make_inputs(case, 13, torch.float32, device)
    loc = torch.arange(case.B + 1, dtype=torch.int32, device=device)
    with refusal(None, f"{impl.name} refuses paged_prefill"):
        out = impl.paged_prefill(*inp.args(), loc, scale=case.scale)
    check_against_contiguous(out, inp, case, what="paged_prefill with one query per sequence")


@pytest.mark.technique(TECH)
@pytest.mark.claim("PA-8")
def test_pa8_mixed_batch_generic_checks(impl, device):
    """The generic checks every contract's main call gets, for ``paged_prefill`` on the first
    pinned mixed batch (unused slots NaN, unused table entries out of range): its inputs are left
    unchanged, every output element is written (finite), and a repeated call is bit-identical."""
    from inference_conformance.conformance.outcomes import unsupported
    from inference_conformance.properties.generic_cases import (Refused, check_inputs_not_mutated, check_output_fully_written,
                                                                check_repeatable)

    case = PREFILL_EXAMPLES[0]
    inp = make_prefill_inputs(case, 5, torch.float32, device)
    kwargs = {"scale": case.scale}
    try:
        for check in (check_inputs_not_mutated, check_output_fully_written, check_repeatable):
            check(impl.paged_prefill, inp.args(), kwargs)
    except Refused as exc:
        unsupported(f"{impl.name} refuses paged_prefill: {exc}")


@pytest.mark.claim("PA-8")
@pytest.mark.suite_own("the suite's pinned examples reach every boundary class")
def test_pa8_coverage_table():
    """The PA-8 boundary classes each pinned mixed batch reaches (reported); the pinned ones alone
    reach them all."""
    PA8.record_pinned_coverage("every PA-8 class of the contract is reached by the pinned mixed batches")


@pytest.mark.claim("PA-8")
@pytest.mark.suite_own("the suite's pinned long chunks reach the production sizes")
def test_pa8_long_chunks_reach_the_production_sizes():
    """The pinned long chunks reach a chunk past each production chunk size (512, 2,048, 8,192
    tokens); the interpreted subset reaches past 512."""
    reached = set().union(*(classes_reached(SCALE_COVERAGE, PA8_LONG.name, c) for c in LONG_CHUNKS))
    assert not missing_classes(SCALE_COVERAGE, reached, PA8_LONG.name), sorted(reached)
    assert len(reached) == 3 and max(max(c.qlens) for c in LONG_CHUNKS) > 8192
    assert any(max(c.qlens) > 512 for c in long_chunks_for(True))
