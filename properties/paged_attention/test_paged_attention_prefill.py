"""Laws of paged attention's mixed batch (claim PA-8, the kernel half; lecture 001 §4.5): the
contract's ``paged_prefill`` (decode tokens and prefill chunks of several sequences in one call,
each chunk causal with the offset of its cached prefix) equals dense causal attention over each
sequence's contiguous K/V, for any chunk lengths, block size and GQA group; its known-bad versions
(a chunk's offset counted from 0, every chunk taken as C long) are rejected. The engine half is the serve law
over every registered engine (``properties/inference_engine/test_serving.py``), PA-1 in
``properties/paged_attention/test_paged_attention.py``.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given, note, settings
from hypothesis import strategies as st

from inference_conformance.conformance.contracts.paged_attention import COVERAGE
from inference_conformance.conformance.device import triton_interpreted
from inference_conformance.conformance.laws import Kills, Law, refusal
from inference_conformance.properties import strategies as S
from inference_conformance.conformance.coverage import classes_reached, missing_classes
from inference_conformance.properties.paged_attention.cases import (
    PagedCase,
    PrefillCase,
    call_prefill,
    check_against_contiguous,
    fit_prefill_budget,
    make_inputs,
    make_prefill_inputs,
    prefill_cases,
)
from inference_conformance.properties.paged_attention.prefill_cases import (
    LONG_CHUNKS,
    SCALE_COVERAGE,
    check_against_causal,
    long_chunks_for,
)

TECH = "paged_attention"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _p(lens, qlens, Hq, Hkv, D, bs, c=0.7, **kw) -> PrefillCase:
    return PrefillCase(tuple(lens), tuple(qlens), Hq, Hkv, D, bs, c / math.sqrt(D), **kw)


#: Seventeen sequences (past a search over 4 and a query tile of 16): a 20-token prompt ahead of
#: fifteen decode rows and a chunk after a 24-token prefix; run whole under the interpreter too
#: (38 programs).
MANY = _p((20, 9, 1, 33, 4, 17, 2, 50, 3, 12, 7, 64, 5, 16, 8, 29, 30), (20,) + (1,) * 15 + (6,), 2, 1, 8, 3,
          pinned=True)

#: Pinned: together they reach every PA-8 class (the contract's and SCALE_COVERAGE) within the
#: interpreter budget and reject every zoo entry (a decode token beside chunks of 23 and 20
#: tokens; seventeen sequences).
PREFILL_EXAMPLES = (
    _p((9, 40, 20), (1, 23, 20), 3, 1, 16, 3),         # decode + chunk after a prefix + whole prompt, group 3
    _p((5, 30), (1, 18), 4, 1, 64, 1, spare_cols=0),    # block size 1, a chunk over a 12-token prefix
    _p((33, 7), (16, 7), 4, 2, 59, 16, c=1.7),          # a chunk at a block boundary, D 59
    MANY,
)


def law_prefill_equals_causal(run, device, dtype, case, seed):
    """PA-8: the mixed batch over randomly placed blocks equals dense causal attention over
    each sequence's contiguous K/V (the chunk's queries its last q_len tokens), by the tolerance
    policy."""
    if run.interpreted:
        case = fit_prefill_budget(case)
    note(f"{case}")
    inp = make_prefill_inputs(case, seed, dtype, device)
    out = call_prefill(run.impl, inp, case, run=run)
    check_against_causal(out, inp, case)


#: PA-8's law of the kernel: every implementation that provides ``paged_prefill`` and every
#: dtype; the cases must reach every PA-8 class of the contract.
PA8 = Law(
    claim="PA-8", technique=TECH, body=law_prefill_equals_causal,
    given={"case": prefill_cases(), "seed": S.seeds},
    examples=tuple(dict(case=c, seed=i + 1) for i, c in enumerate(PREFILL_EXAMPLES)),
    dtypes=S.FLOAT_DTYPES,
    kills=(Kills(("chunk_offset_from_zero", "last_chunk_as_c", "searches_first_4_sequences",
                  "chunk_top_left_in_large_batches"), (torch.float64,)),),
    coverage=COVERAGE + SCALE_COVERAGE, require_coverage=True,
    interpreted_examples=lambda n: max(4, n // 3))

test_pa8_mixed_batch_equals_causal = PA8.conformance_test(
    "test_pa8_mixed_batch_equals_causal",
    doc="""PA-8 for every implementation with the mixed batch and every dtype; the cases must reach
    every PA-8 boundary class of the contract.""")
(test_pa8_zoo_rejected,) = PA8.make_zoo_tests("test_pa8_zoo_rejected")


@pytest.mark.claim("PA-8")
@settings(max_examples=3)
@given(case=prefill_cases(), seed=S.seeds, num_splits=st.integers(1, 3),
       dtype=st.sampled_from([torch.float64, torch.float32, torch.bfloat16]))
@example(case=_p((9, 150), (1, 12), 4, 2, 16, 5), seed=3, num_splits=3, dtype=torch.float32)
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


def law_long_chunks(run, device, dtype=torch.float32):
    """PA-8 on chunks past the production chunk sizes (:data:`LONG_CHUNKS`: 513 and 8,193 tokens,
    each beside decode rows), float32: equal to dense causal attention by the tolerance policy.
    An interpreted kernel runs the 513-token chunk only (the interpreter's measured cost)."""
    for i, case in enumerate(long_chunks_for(run.interpreted)):
        inp = make_prefill_inputs(case, 61 + i, dtype, device)
        check_against_causal(call_prefill(run.impl, inp, case, run=run), inp, case,
                             what=f"mixed batch, a chunk of {max(case.qlens)} tokens")


#: PA-8 on the pinned long chunks (no drawn arguments), every implementation with the mixed batch.
PA8_LONG = Law(claim="PA-8", technique=TECH, body=law_long_chunks, params=("device",),
               coverage=COVERAGE + SCALE_COVERAGE)

test_pa8_chunks_past_production_sizes = PA8_LONG.conformance_test(
    "test_pa8_chunks_past_production_sizes",
    doc="""PA-8 for every implementation with the mixed batch on chunks of 513 and 8,193 tokens.""")


@pytest.mark.claim("PA-8")
@pytest.mark.suite_own("the suite's pinned long chunks reach the production sizes")
def test_pa8_long_chunks_reach_the_production_sizes():
    """The pinned long chunks reach a chunk past each production chunk size (512, 2,048, 8,192
    tokens); the interpreted subset reaches past 512."""
    reached = set().union(*(classes_reached(SCALE_COVERAGE, PA8_LONG.name, c) for c in LONG_CHUNKS))
    assert not missing_classes(SCALE_COVERAGE, reached, PA8_LONG.name), sorted(reached)
    assert len(reached) == 3 and max(max(c.qlens) for c in LONG_CHUNKS) > 8192
    assert any(max(c.qlens) > 512 for c in long_chunks_for(True))
