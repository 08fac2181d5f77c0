"""The laws of FA-8 in the paged kernels: the attention contract's options (``window``, ``softcap``,
``sinks``) through ``paged_attention`` (decode, every query at its sequence's last position) and
``paged_prefill`` (the mixed batch, each chunk's query at its position after the cached prefix)
equal dense float64 attention with the same options over the contiguous K/V the pages were cut from.
An implementation whose function lacks an option's keyword refuses it ("unsupported", never a pass);
the calls and the check are in ``options_cases.py``. Pinned cases only (they run in every profile),
which reach the contract's "FA-8 paged: ..." coverage classes, the dense FA-8 classes on paged calls
(each law requires them): a window of one key, shorter than a block, crossing several blocks, hiding
whole blocks, at least a sequence's length; caps below the largest logit and with a window; sinks
with GQA, mixed and dominant, with several splits (the merge counts them once). Zoo: sinks dropped
in the paged merge, a window of one key read as no window, a chunk's window measured from the
chunk's start.
"""
from __future__ import annotations

import torch
from hypothesis import note
from hypothesis import strategies as st

from inference_conformance.conformance.contracts.paged_attention import COVERAGE
from inference_conformance.conformance.laws import Kills, Law
from inference_conformance.properties.paged_attention.cases import (
    PagedCase,
    PrefillCase,
    make_inputs,
    make_prefill_inputs,
)
from inference_conformance.properties.paged_attention.options_cases import (
    Options,
    call_with_options,
    check_with_options,
    make_sinks,
    options_profile,
)


def law_paged_options_match_dense(run, device, dtype, case, opts, seed):
    """FA-8 (decode): ``paged_attention`` with the options equals dense float64 attention of each
    sequence's last token over its contiguous K/V with the same options."""
    note(f"{case}, {opts}")
    inp = make_inputs(case, seed, dtype, device)
    loc = list(range(case.B + 1))
    sinks = make_sinks(opts, inp.q, inp.k, loc, case.scale, seed)
    run.observe(options_profile(inp.q, inp.k, loc, opts, sinks, case.scale, case.block_size))
    out = call_with_options(run, run.impl.paged_attention, inp.args(), case.scale, opts, sinks, "paged_attention")
    check_with_options(out, inp.q, inp.k, inp.v, loc, opts, sinks, case.scale, "paged decode")


def law_prefill_options_match_dense(run, device, dtype, case, opts, seed):
    """FA-8 (mixed batch): ``paged_prefill`` with the options equals dense float64 causal attention
    of each chunk over its sequence's contiguous K/V with the same options."""
    note(f"{case}, {opts}")
    inp = make_prefill_inputs(case, seed, dtype, device)
    loc = inp.query_start_loc.tolist()
    sinks = make_sinks(opts, inp.q, inp.k, loc, case.scale, seed)
    run.observe(options_profile(inp.q, inp.k, loc, opts, sinks, case.scale, case.block_size))
    out = call_with_options(run, run.impl.paged_prefill, inp.args(), case.scale, opts, sinks, "paged_prefill")
    check_with_options(out, inp.q, inp.k, inp.v, loc, opts, sinks, case.scale, "mixed batch")


#: Decode: a window shorter than a block of 7 (W = 5), one crossing blocks and longer than a short
#: sequence (W = 40 over 130 and 9 tokens), a cap below the largest logit, a window of one key with
#: sinks mixed over GQA, and dominant sinks over 200 tokens in three splits with a window and a cap.
DECODE_PINNED = (
    dict(case=PagedCase((50, 130, 9), 4, 2, 16, 7, 0.25), opts=Options(window=5), seed=1),
    dict(case=PagedCase((130, 9), 2, 1, 16, 16, 0.25), opts=Options(window=40), seed=2),
    dict(case=PagedCase((33, 65), 2, 1, 16, 5, 1.0), opts=Options(softcap=0.5), seed=3),
    dict(case=PagedCase((17, 40), 6, 2, 16, 16, 0.25), opts=Options(window=1, sinks="mixed"), seed=4),
    dict(case=PagedCase((200,), 4, 2, 16, 16, 0.25, magnitude="large", amp=12.0),
         opts=Options(window=70, softcap=20.0, sinks="dominant"), seed=5),
)
#: Mixed batch: chunks after cached prefixes with a decode token between them, windows of 1, 13
#: (crossing blocks of 5) and longer than every sequence, a cap, mixed and dominant sinks.
PREFILL_PINNED = (
    dict(case=PrefillCase((60, 9, 100), (20, 1, 30), 4, 2, 16, 5, 0.25), opts=Options(window=13), seed=1),
    dict(case=PrefillCase((40, 30), (16, 1), 2, 1, 16, 16, 0.25), opts=Options(window=1, sinks="mixed"), seed=2),
    dict(case=PrefillCase((60, 9, 100), (20, 1, 30), 4, 2, 16, 5, 0.25),
         opts=Options(window=500, softcap=2.0, sinks="dominant"), seed=3),
)


def _pinned(examples) -> dict:
    """The strategies of a pinned-only law (Hypothesis runs only the examples: ``explicit_only``)."""
    return {name: st.sampled_from([e[name] for e in examples]) for name in ("case", "opts", "seed")}


FA8_PAGED = Law(claim="FA-8", technique="paged_attention", body=law_paged_options_match_dense,
                given=_pinned(DECODE_PINNED), examples=DECODE_PINNED, explicit_only=True, dtypes=(torch.float64, torch.bfloat16),
                kills=(Kills(("paged_sinks_dropped_in_merge", "paged_window_of_one_ignored"), (torch.float64,)),),
                coverage=COVERAGE, require_coverage=True,
    test="test_fa8_paged_options_match_dense",
    zoo_tests=("test_fa8_paged_zoo_rejected",))
FA8_PREFILL = Law(claim="FA-8", technique="paged_attention", body=law_prefill_options_match_dense,
                  given=_pinned(PREFILL_PINNED), examples=PREFILL_PINNED, explicit_only=True, dtypes=(torch.float64, torch.bfloat16),
                  kills=(Kills(("prefill_window_from_chunk_start",), (torch.float64,)),),
                  coverage=COVERAGE, require_coverage=True,
    test="test_fa8_prefill_options_match_dense",
    zoo_tests=("test_fa8_prefill_zoo_rejected",))
