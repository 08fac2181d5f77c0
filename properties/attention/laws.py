"""The laws of attention (claims FA-2, FA-3, FA-7, FA-8; lecture 001 §3).

Every law is written against the attention contract (``conformance/contracts/attention.py``)
and, but FA-2's, runs over every registered implementation; each lists the known-bad
implementations it must reject (``zoo.py``) and a zoo test shows it does:

- FA-3: attention equals the float64 reference by the tolerance policy (cases in ``cases.py``);
- FA-3's NaN rule: a NaN in the inputs is NaN in exactly the output rows (for a NaN in v: the
  components) that see it, and every other element is what it would be without the NaN (a key the
  causal mask hides must not leak); two known-bad ones: a "safe softmax" that zeroes NaN rows, a
  mask added as -inf (cases in ``nan_cases.py``);
- FA-7: split-KV decoding equals unsplit attention for any number of splits;
- FA-8: window, softcap and sinks equal the float64 reference with the same options (cases in
  ``feature_cases.py``);
- FA-2: online softmax over any chunking equals one pass, on the reference's online softmax
  (``test_softmax.py`` runs it).
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import note
from hypothesis import strategies as st

from inference_conformance.conformance.contracts.attention import COVERAGE, OPTIONS, accepts_options
from inference_conformance.conformance.laws import Kills, Law, refusal
from inference_conformance.conformance.outcomes import unsupported
from inference_conformance.conformance.tolerance import assert_close, assert_exact, max_abs_error
from inference_conformance.properties import strategies
from inference_conformance.properties.attention.cases import (
    BOUNDARY_CASES,
    EXAMPLE_BATCH5_CHUNK,
    EXAMPLE_BATCH5_SINGLE,
    EXAMPLE_DIAGONAL_TILE,
    EXAMPLE_GQA_CAUSAL,
    EXAMPLE_GQA_CAUSAL_POW2,
    EXAMPLE_LARGE_LOGITS,
    EXAMPLE_LONG_KEYS,
    EXAMPLE_SPLIT_LSE_ROUNDING,
    LARGE_NONPOW2_CASES,
    LATE_MAX_CASES,
    SCALE_MASK_CASES,
    ZOO_16BIT,
    ZOO_ALL,
    Case,
    _seeded,
    accepts_num_splits,
    call,
    cases,
    check_against_reference,
    decode_cases,
    fit_budget,
    make_inputs,
)
from inference_conformance.properties.attention.feature_cases import (
    PINNED,
    call_options,
    check_options,
    feature_cases,
    make_sinks,
    options,
)
from inference_conformance.properties.attention.flash_cases import score_rows
from inference_conformance.properties.attention.nan_cases import CASES as NAN_CASES, NanCase, expected_nan, unspecified
from inference_conformance.properties.kernel_law import kernel_law
from inference_conformance.reference import attention as ref
from inference_conformance.reference.attention import attention as attention_ref

# ---------------------------------------------------------------------------------------- FA-3
law_matches_reference = kernel_law(
    "law_matches_reference", """FA-3: attention(q, k, v) equals the float64 reference by the tolerance policy.""",
    fit=fit_budget, inputs=make_inputs, call=lambda impl, qkv, case, run: call(impl, *qkv, case, run=run),
    check=lambda out, qkv, case: check_against_reference(out, *qkv, case))


#: FA-3's law. Its pinned examples run first in every profile: together they break every zoo
#: entry and, with the production shapes, reach the contract's coverage table (checked on the
#: float64 reference by properties/attention/test_attention_coverage.py).
FA3 = Law(
    claim="FA-3", technique="attention", body=law_matches_reference,
    given={"case": cases(bounded=False), "seed": strategies.seeds},
    examples=(dict(case=EXAMPLE_GQA_CAUSAL, seed=7), dict(case=EXAMPLE_GQA_CAUSAL_POW2, seed=7),
              dict(case=EXAMPLE_LARGE_LOGITS, seed=11), dict(case=EXAMPLE_LONG_KEYS, seed=5),
              dict(case=EXAMPLE_DIAGONAL_TILE, seed=3), dict(case=EXAMPLE_SPLIT_LSE_ROUNDING, seed=25),
              dict(case=EXAMPLE_BATCH5_CHUNK, seed=9), dict(case=EXAMPLE_BATCH5_SINGLE, seed=10))
             + _seeded(SCALE_MASK_CASES, 20) + _seeded(BOUNDARY_CASES, 40) + _seeded(LATE_MAX_CASES, 60)
             + _seeded(LARGE_NONPOW2_CASES, 70),
    dtypes=strategies.FLOAT_DTYPES,
    kills=(Kills(ZOO_ALL, (torch.float64,)),
           Kills(ZOO_16BIT, (torch.bfloat16,),
                 doc="The 16-bit rule sees errors of a few ulps: a 2% scaling, a 16-bit accumulator, "
                     "a dropped key at Tk = 1100, all in bfloat16.")),
    coverage=COVERAGE,
    test="test_fa3_matches_float64_reference", zoo_tests=("test_fa3_zoo_rejected", "test_fa3_zoo_rejected_bfloat16"))



# ---------------------------------------------------------------------------------------- FA-7
def law_split_equals_unsplit(run, device, dtype, case, seed, num_splits):
    """FA-7: the split-KV result (``num_splits`` key ranges) equals the unsplit one and the
    float64 reference, by the tolerance policy."""
    note(f"{case}, num_splits={num_splits}")
    q, k, v = make_inputs(case, seed, dtype, device)
    out_split = call(run.impl, q, k, v, case, run=run, num_splits=num_splits)
    out_unsplit = call(run.impl, q, k, v, case, run=run, num_splits=1)
    check_against_reference(out_split, q, k, v, case, what=f"split-KV output ({num_splits} splits)")
    check_against_reference(out_unsplit, q, k, v, case, what="unsplit output")
    if dtype == torch.float64:
        assert_close(out_split, out_unsplit, what="split vs unsplit (float64)")


def _split_strategies(interpreted: bool) -> dict:
    """FA-7's drawn arguments; under the interpreter at most 6 splits (each split is one more
    program per head)."""
    return {"case": decode_cases(interpreted), "seed": strategies.seeds, "num_splits": st.integers(1, 6 if interpreted else 64)}


#: FA-7's law; a Triton kernel under the interpreter gets a third of the examples (each one
#: launches several kernels).
FA7 = Law(
    claim="FA-7", technique="attention", body=law_split_equals_unsplit, given=_split_strategies,
    examples=(dict(case=Case(1, 4, 2, 1, 150, 64, False, 0.125), seed=3, num_splits=5),
              dict(case=Case(1, 3, 1, 4, 97, 72, True, 0.25, "large", 40.0), seed=4, num_splits=3),
              dict(case=Case(2, 1, 1, 1, 1024, 64, False, 0.125), seed=6, num_splits=2),    # B > 1, split
              # GQA groups above 16 that are not multiples of 16, 20 and 24 (one KV head: each query
              # head is a program per split under the interpreter; Hq = 40 over two KV heads is a
              # production shape of FA-3)
              dict(case=Case(1, 20, 1, 1, 33, 8, False, 0.3), seed=8, num_splits=2),
              dict(case=Case(1, 24, 1, 2, 33, 8, True, 0.25), seed=9, num_splits=2)),
    dtypes=strategies.FLOAT_DTYPES,
    kills=(Kills(("split_no_rescale", "split_batch_stride_zero"), (torch.float64, torch.bfloat16)),),
    coverage=COVERAGE,
    interpreted_examples=lambda n: max(4, n // 3),
    applies=lambda impl: None if accepts_num_splits(impl) else f"{impl.name} has no split-KV mode (no num_splits argument)",
    test="test_fa7_split_kv_equals_unsplit", zoo_tests=("test_fa7_zoo_rejected",))


# ---------------------------------------------------------------------------------------- FA-8
def _refuse_lacking_options(run, case) -> None:
    """Refuse a case whose options the implementation's attention does not take, before any input
    is made (Hypothesis then draws again)."""
    lacking = sorted(set(options(case, case.sinks)) - accepts_options(run.impl))
    if lacking:
        run.refuse(f"{run.impl.name}'s attention takes no {', '.join(lacking)} keyword")


def _options_inputs(case, seed, dtype, device) -> tuple:
    q, k, v = make_inputs(case, seed, dtype, device)
    return q, k, v, make_sinks(case, q, k, seed)


law_options_match_reference = kernel_law(
    "law_options_match_reference", """FA-8: attention with ``window`` / ``softcap`` / ``sinks`` equals the float64 reference
    with the same options, by the tolerance policy.""",
    before=_refuse_lacking_options, fit=fit_budget, inputs=_options_inputs,
    call=lambda impl, args, case, run: call_options(impl, *args[:3], case, args[3], run=run),
    check=lambda out, args, case: check_options(out, *args[:3], case, args[3]))


#: The known-bad implementations FA-8's law rejects (properties/attention/zoo.py).
ZOO_FA8 = ("window_skips_wrong_tile", "softcap_after_max", "sinks_dropped_in_merge", "sinks_once_per_split")


def _takes_an_option(impl) -> None:
    """FA-8's ``applies``: an implementation taking none of the options ends the test as
    "unsupported" at once (not after Hypothesis has drawn and discarded every example)."""
    if not accepts_options(impl):
        unsupported(f"{impl.name}'s attention takes none of the options {', '.join(OPTIONS)}")


#: FA-8's law: pinned examples first (every profile), then a fifth of the profile's drawn ones.
FA8 = Law(
    claim="FA-8", technique="attention", body=law_options_match_reference,
    given={"case": feature_cases(bounded=False), "seed": strategies.seeds}, examples=PINNED,
    dtypes=(torch.float64, torch.bfloat16),
    kills=(Kills(ZOO_FA8, (torch.float64, torch.bfloat16)),),
    coverage=COVERAGE, max_examples=lambda n: max(2, n // 5), applies=_takes_an_option,
    test="test_fa8_options_match_float64_reference", zoo_tests=("test_fa8_zoo_rejected",))


# ------------------------------------------------------------------------------ FA-3's NaN rule
def law_nan_in_exactly_the_rows_that_see_it(run, device, dtype, case: NanCase):
    """NaN in, NaN out in exactly the elements the contract names; the rest as without the NaN."""
    g = torch.Generator().manual_seed(11)
    q = torch.randn(case.B, case.Hq, case.Tq, case.D, generator=g, dtype=torch.float64)
    k = torch.randn(case.B, case.Hkv, case.Tk, case.D, generator=g, dtype=torch.float64)
    v = torch.randn(case.B, case.Hkv, case.Tk, case.D, generator=g, dtype=torch.float64)
    q, k, v = (t.to(device=device, dtype=dtype) for t in (q, k, v))
    clean = attention_ref(q, k, v, causal=case.causal, scale=0.3)
    poisoned = {"q": q, "k": k, "v": v}
    bad = poisoned[case.where].clone()
    bad[case.b, case.h, case.t, case.d] = float("nan")
    poisoned[case.where] = bad
    run.observe(case)
    with refusal(run, f"{run.impl.name} refuses {dtype}"):
        out = run.impl(poisoned["q"], poisoned["k"], poisoned["v"], causal=case.causal, scale=0.3)
    want, free = expected_nan(case).to(out.device), unspecified(case).to(out.device)
    assert_exact(torch.isnan(out) & ~free, want, what=f"the NaN elements of the output ({case})")
    assert_close(out.masked_fill(want | free, 0.0), clean.masked_fill(want | free, 0.0),
                 what=f"the elements that do not see the NaN ({case})")


#: Findings, in the suite's expectation files (expectations/, applied to the built-ins in every
#: run, strict: a fix fails the run until its entry goes): PyTorch's CPU SDPA ("torch") breaks
#: the rule in every dtype (expectations/attention-torch.toml).
NAN_RULE = Law(
    claim="FA-3", technique="attention", body=law_nan_in_exactly_the_rows_that_see_it,
    given={"case": st.sampled_from(NAN_CASES)}, examples=tuple(dict(case=c) for c in NAN_CASES), explicit_only=True,
    dtypes=(torch.float64, torch.float32, torch.bfloat16),
    kills=(Kills(("nan_rows_zeroed", "additive_mask_leaks_nan"), (torch.float64,)),),
    test="test_fa3_nan_in_exactly_the_rows_that_see_it", zoo_tests=("test_fa3_nan_zoo_rejected",),
    marks=(pytest.mark.usefixtures("one_torch_thread"),
           pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning")))


# ---------------------------------------------------------------------------------------- FA-2
def law_fa2_online_softmax_equals_one_pass(run, case):
    """FA-2: online softmax over any chunking of the scores gives the one-pass probabilities and
    its (m, l): the running max exactly, the running sum and the probabilities to float64
    rounding; each example observes its two errors."""
    x, sizes = case
    note(f"chunks {sizes}")
    p_on, m_on, l_on = ref.online_softmax(x, sizes)
    p_one = ref.softmax(x)
    m_one, l_one = ref.softmax_stats(x)
    assert_exact(m_on, m_one, what="running max m")
    assert_close(l_on, l_one, what="running sum l")
    assert_close(p_on, p_one, what="online softmax")
    run.observe({"p": max_abs_error(p_on, p_one), "l": max_abs_error(l_on, l_one) / float(l_one.abs().max())})


#: FA-2's law on the reference's online softmax (no registered implementation).
FA2 = Law(claim="FA-2", technique="attention", body=law_fa2_online_softmax_equals_one_pass, params=(),
          given={"case": score_rows()})
