"""The laws of paged attention's mixed batch (claim PA-8, the kernel half; lecture 001 §4.5): the
contract's ``paged_prefill`` (decode tokens and prefill chunks of several sequences in one call,
each chunk causal with the offset of its cached prefix) equals dense causal attention over each
sequence's contiguous K/V, for any chunk lengths, block size and GQA group, and on chunks past the
production sizes; its known-bad versions (a chunk's offset counted from 0, every chunk taken as C
long) are rejected. The engine half is the serve law over every registered engine
(``properties/inference_engine/laws.py``), PA-1 in ``decode.py``.
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.conformance.contracts.paged_attention import COVERAGE
from inference_conformance.conformance.laws import Kills, Law
from inference_conformance.properties import strategies
from inference_conformance.properties.kernel_law import kernel_law
from inference_conformance.properties.paged_attention.cases import (
    call_prefill,
    fit_prefill_budget,
    make_prefill_inputs,
    prefill_cases,
)
from inference_conformance.properties.paged_attention.prefill_cases import (
    SCALE_COVERAGE,
    check_against_causal,
    long_chunks_for,
    prefill_case,
)

TECH = "paged_attention"

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: Seventeen sequences (past a search over 4 and a query tile of 16): a 20-token prompt ahead of
#: fifteen decode rows and a chunk after a 24-token prefix; run whole under the interpreter too
#: (38 programs).
MANY = prefill_case((20, 9, 1, 33, 4, 17, 2, 50, 3, 12, 7, 64, 5, 16, 8, 29, 30), (20,) + (1,) * 15 + (6,), 2, 1, 8, 3,
          pinned=True)

#: Pinned: together they reach every PA-8 class (the contract's and SCALE_COVERAGE) within the
#: interpreter budget and reject every zoo entry (a decode token beside chunks of 23 and 20
#: tokens; seventeen sequences).
PREFILL_EXAMPLES = (
    prefill_case((9, 40, 20), (1, 23, 20), 3, 1, 16, 3),         # decode + chunk after a prefix + whole prompt, group 3
    prefill_case((5, 30), (1, 18), 4, 1, 64, 1, spare_cols=0),    # block size 1, a chunk over a 12-token prefix
    prefill_case((33, 7), (16, 7), 4, 2, 59, 16, c=1.7),          # a chunk at a block boundary, D 59
    MANY,
)


law_prefill_equals_causal = kernel_law(
    "law_prefill_equals_causal",
    """PA-8: the mixed batch over randomly placed blocks equals dense causal attention over
    each sequence's contiguous K/V (the chunk's queries its last q_len tokens), by the tolerance
    policy.""",
    fit=fit_prefill_budget, inputs=make_prefill_inputs, call=call_prefill, check=check_against_causal)


#: PA-8's law of the kernel: every implementation that provides ``paged_prefill`` and every
#: dtype; the cases must reach every PA-8 class of the contract.
PA8 = Law(
    claim="PA-8", technique=TECH, body=law_prefill_equals_causal,
    given={"case": prefill_cases(), "seed": strategies.seeds},
    examples=tuple(dict(case=c, seed=i + 1) for i, c in enumerate(PREFILL_EXAMPLES)),
    dtypes=strategies.FLOAT_DTYPES,
    kills=(Kills(("chunk_offset_from_zero", "last_chunk_as_c", "searches_first_4_sequences",
                  "chunk_top_left_in_large_batches"), (torch.float64,)),),
    coverage=COVERAGE + SCALE_COVERAGE, require_coverage=True,
    interpreted_examples=lambda n: max(4, n // 3),
    test="test_pa8_mixed_batch_equals_causal",
    doc="""PA-8 for every implementation with the mixed batch and every dtype; the cases must reach
    every PA-8 boundary class of the contract.""",
    zoo_tests=("test_pa8_zoo_rejected",))


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
               coverage=COVERAGE + SCALE_COVERAGE,
    test="test_pa8_chunks_past_production_sizes",
    doc="""PA-8 for every implementation with the mixed batch on chunks of 513 and 8,193
    tokens.""")
