"""Tests of FlashAttention and split-KV decoding beside their laws (claims FA-3, FA-7; lecture 001
§3): the laws, with their zoo tests, are in ``laws.py``; here the production shapes, the law
runner's handling of refusals and the calls a conforming kernel must also get right. The cases
are in ``cases.py``; softmax (FA-1, FA-2) is in ``test_softmax.py``, the memory
claims (FA-4..FA-6) in ``test_attention_memory.py``.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from inference_conformance.conformance import results
from inference_conformance.conformance.device import triton_interpreted
from inference_conformance.conformance.law_run import input_digest
from inference_conformance.conformance.outcomes import Unsupported
from inference_conformance.conformance.tolerance import (
    assert_close,
    assert_exact,
    max_abs_error,
)
from inference_conformance.properties import strategies
from inference_conformance.properties.attention.laws import FA3
from inference_conformance.properties.attention.cases import (
    COST_BUDGET,
    PRODUCTION_CASES,
    Case,
    call,
    cases,
    check_against_reference,
    decode_cases,
    interpreter_cost,
    make_inputs,
)
from inference_conformance.reference import attention as ref



@pytest.mark.technique("attention")
@pytest.mark.claim("FA-3")
def test_fa3_noncontiguous_inputs(impl, device):
    """Any strides: transposed views and a sliced head dim give the same result as contiguous
    copies (kernels must use the strides they are given)."""
    case = Case(B=2, Hq=4, Hkv=2, Tq=9, Tk=21, D=24, causal=True, scale=0.2)
    q0, k0, v0 = make_inputs(Case(2, 4, 2, 9, 21, 48, True, 0.2), 5, torch.float32, device)
    # (B, T, H, D) storage viewed as (B, H, T, D), and every other element of the head dim
    q = q0.transpose(1, 2).contiguous().transpose(1, 2)[..., ::2]
    k = k0.transpose(1, 2).contiguous().transpose(1, 2)[..., ::2]
    v = v0[..., 1::2]
    assert not q.is_contiguous() and not v.is_contiguous()
    out = call(impl, q, k, v, case)
    check_against_reference(out, q.contiguous(), k.contiguous(), v.contiguous(), case)


# the lecture's experiment (lecture 001 §3.3): T=256, d=64, causal, blocks 1/16/64/256
LECTURE_BLOCKS = (1, 16, 64, 256)


@pytest.mark.claim("FA-3")
@pytest.mark.suite_own("the lecture's experiment on the blocked reference")
def test_fa3_lecture_experiment_blocked_equals_standard():
    case = Case(B=1, Hq=1, Hkv=1, Tq=256, Tk=256, D=64, causal=True, scale=1 / 8)
    q, k, v = make_inputs(case, 2024, torch.float64, "cpu")
    out_ref = ref.attention_naive(q, k, v, causal=True, scale=case.scale)
    diffs = {}
    for blk in LECTURE_BLOCKS:
        out = ref.blocked_attention(q, k, v, causal=True, scale=case.scale, block_k=blk)
        assert_close(out, out_ref, what=f"blocked attention, key blocks of {blk}")
        diffs[blk] = max_abs_error(out, out_ref)
    results.record("FA-3", measured=max(diffs.values()), lecture="~1e-14 (fp64, every block size)",
                   bound=1e-12 * float(out_ref.abs().max()), unit="max |blocked - standard|",
                   rule="T=256, d=64, causal, float64; key blocks 1/16/64/256",
                   per_block={str(b): d for b, d in diffs.items()})


@pytest.mark.claim("FA-3")
@pytest.mark.suite_own("the lecture's experiment on the suite's Triton kernel; outside kernels meet FA-3 in "
                       "test_fa3_matches_float64_reference")
def test_fa3_lecture_experiment_triton_kernel(device):
    """The same experiment on the Triton kernel itself, with its tile sizes varied."""
    fa = pytest.importorskip("inference_conformance.optimized.attention.flash_attention")
    case = Case(B=1, Hq=1, Hkv=1, Tq=256, Tk=256, D=64, causal=True, scale=1 / 8)
    q, k, v = make_inputs(case, 2024, torch.float64, device)
    out_ref = ref.attention_naive(q, k, v, causal=True, scale=case.scale)
    diffs = {}
    for bm, bn in ((16, 16), (16, 64), (64, 64)) if triton_interpreted() else ((16, 16), (16, 64)):
        out = fa.flash_attention(q, k, v, causal=True, scale=case.scale, block_m=bm, block_n=bn)
        assert_close(out, out_ref, what=f"Triton FlashAttention, tiles {bm}x{bn}")
        diffs[f"{bm}x{bn}"] = max_abs_error(out, out_ref)
    results.record("FA-3", measured=max(diffs.values()), lecture="~1e-14 (fp64, every block size)",
                   bound=1e-12 * float(out_ref.abs().max()), unit="max |Triton - standard|",
                   rule="T=256, d=64, causal, float64; Triton tiles (BLOCK_M x BLOCK_N)", per_tile=diffs)


@pytest.mark.claim("FA-3")
@given(case=cases(max_len=129), seed=strategies.seeds, block_q=st.sampled_from([None, 1, 3, 16, 17, 64]),
       block_k=st.integers(1, 70))
@pytest.mark.suite_own("the blocked float64 reference (the oracle of online softmax) at any block sizes")
def test_fa3_blocked_reference_any_block_sizes(case, seed, block_q, block_k):
    q, k, v = make_inputs(case, seed, torch.float64, "cpu")
    out = ref.blocked_attention(q, k, v, causal=case.causal, scale=case.scale, block_q=block_q, block_k=block_k)
    check_against_reference(out, q, k, v, case, what=f"blocked attention ({block_q}, {block_k})")


@pytest.mark.claim("FA-3")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@settings(max_examples=6)
@given(case=cases(max_len=129), seed=strategies.seeds, data=st.data())
@pytest.mark.suite_own("the suite's Triton kernel at forced tile sizes (its internals)")
def test_fa3_triton_any_tile_sizes(device, dtype, case, seed, data):
    fa = pytest.importorskip("inference_conformance.optimized.attention.flash_attention")
    tiles = [1, 2, 4, 8, 16, 32, 64] if dtype == torch.float64 else [16, 32, 64]
    bm, bn = data.draw(st.sampled_from(tiles)), data.draw(st.sampled_from(tiles))
    if triton_interpreted() and interpreter_cost(case.B, case.Hq, case.Tq * 16 // bm, case.Tk * 32 // bn) > 3 * COST_BUDGET:
        bm, bn = max(bm, 16), max(bn, 16)
    q, k, v = make_inputs(case, seed, dtype, device)
    out = fa.flash_attention(q, k, v, causal=case.causal, scale=case.scale, block_m=bm, block_n=bn)
    check_against_reference(out, q, k, v, case, what=f"Triton FlashAttention, tiles {bm}x{bn}")


@pytest.mark.claim("FA-3")
@pytest.mark.parametrize("kernel", ["flash_attention", "flash_decoding"])
@settings(max_examples=5)
@given(case=cases(max_len=129), seed=strategies.seeds, dtype=st.sampled_from([torch.float64, torch.float32]),
       num_splits=st.integers(1, 4))
@example(case=Case(1, 2, 1, 40, 100, 64, True, 0.2), seed=1, dtype=torch.float32, num_splits=2)
@example(case=Case(1, 3, 3, 17, 70, 72, False, 0.3, "large", 40.0), seed=2, dtype=torch.float64, num_splits=1)
@pytest.mark.suite_own("the suite's Triton kernel's two-stage tile loop (its internals)")
def test_fa3_triton_two_stage_tile_loop(device, kernel, case, seed, dtype, num_splits):
    """The GPU's tile loop (whole visible tiles without masks, then the masked rest), forced on
    wherever the kernels run, so that the interpreter checks it too."""
    fa = pytest.importorskip("inference_conformance.optimized.attention.flash_attention")
    fd = pytest.importorskip("inference_conformance.optimized.attention.flash_decoding")
    tiles = pytest.importorskip("inference_conformance.optimized.attention.tiles")
    q, k, v = make_inputs(case, seed, dtype, device)
    saved = tiles.TWO_STAGE_OVERRIDE
    tiles.TWO_STAGE_OVERRIDE = True
    try:
        if kernel == "flash_attention":
            out = fa.flash_attention(q, k, v, causal=case.causal, scale=case.scale)
        else:
            out = fd.flash_decoding(q, k, v, causal=case.causal, scale=case.scale, num_splits=num_splits)
    finally:
        tiles.TWO_STAGE_OVERRIDE = saved
    check_against_reference(out, q, k, v, case, what=f"{kernel}, two-stage tile loop")


# ----------------------------------------------------------------------------------------------
# FA-7: split-KV decoding equals unsplit attention for any number of splits
# ----------------------------------------------------------------------------------------------




@pytest.mark.claim("FA-7")
@settings(max_examples=8)
@given(case=decode_cases(), seed=strategies.seeds, num_splits=st.integers(1, 300))
@pytest.mark.suite_own("the float64 reference's split and merge (the oracle of FA-7)")
def test_fa7_reference_split_merge(case, seed, num_splits):
    """The plain-PyTorch split-KV merge (inference_conformance.reference.attention.split_kv_attention) is exact too."""
    q, k, v = make_inputs(case, seed, torch.float64, "cpu")
    out = ref.split_kv_attention(q, k, v, causal=case.causal, scale=case.scale, num_splits=num_splits)
    check_against_reference(out, q, k, v, case, what=f"reference split-KV ({num_splits} splits)")


# ------------------------------------------------- partial support: refusals are not passes
def _pow2_only(fn):
    """``fn`` restricted to power-of-two head dims (NotImplementedError otherwise), as a real
    kernel with a fixed set of head dims would be."""
    def attention(q, k, v, *, causal, scale, **kw):
        D = q.shape[-1]
        if D & (D - 1):
            raise NotImplementedError(f"head dim {D} not supported")
        return fn(q, k, v, causal=causal, scale=scale, **kw)
    return attention


def _implementation(name, fn):
    import types

    from inference_conformance.conformance.registry import Implementation

    return Implementation("attention", name, f"tests:{name}", "outside",
                          types.SimpleNamespace(attention=fn), ("attention",))


def test_a_refused_example_does_not_skip_the_law(device):
    """A kernel that supports only some head dims is still checked on those: the top-left mask
    bug behind a power-of-two-only kernel is rejected, not reported unsupported."""
    from inference_conformance.properties.attention import zoo as zoo_attention

    bad = _implementation("pow2_top_left", _pow2_only(zoo_attention.top_left_causal))
    with pytest.raises(AssertionError):
        FA3(bad, device, torch.float64)
    good = _implementation("pow2_reference", _pow2_only(ref.attention))
    run = FA3(good, device, torch.float64)
    assert run.ran > 0 and run.refused and all("head dim" in r for r in run.refused)


def test_a_failing_input_is_named_by_the_digest_a_later_judgement_records(device):
    """What the matrix matches (reports/merge.py): the failure's input digest is the one a run that
    judged that input records, and a run refusing it never records it."""
    from inference_conformance.properties.attention import zoo as zoo_attention

    import dataclasses

    pow2, other = Case(1, 2, 1, 3, 9, 16, True, 0.25), Case(1, 2, 1, 3, 9, 24, True, 0.25)
    law, want = FA3.with_examples((dict(case=pow2, seed=7), dict(case=other, seed=7))), input_digest({"case": pow2, "seed": 7})
    bad = dataclasses.replace(_implementation("pow2_top_left", _pow2_only(zoo_attention.top_left_causal)),
                              origin="zoo")     # the law's own failure, without the diagnosis' replays
    with results.recording(results.Recorder()) as rec, pytest.raises(AssertionError):
        law(bad, device, torch.float64)
    assert rec.failed_inputs == [want], rec.failed_inputs
    with results.recording(results.Recorder()) as rec:
        law(_implementation("pow2_reference", _pow2_only(ref.attention)), device, torch.float64)
    assert rec.judged == [want] and rec.refused_classes == [] and "refused 1 of 2 examples" in rec.partial
    assert rec.evidence == {"accepted": 1, "examples": 2, "refused_classes": [], "judged": [want]}, rec.evidence


def test_an_implementation_refusing_everything_is_unsupported_not_passed(device):
    def refuses(q, k, v, *, causal, scale):
        raise NotImplementedError("nothing supported")

    with pytest.raises(Unsupported, match="unsupported"):
        FA3(_implementation("refuses", refuses), device, torch.float64)


# ----------------------------------------------- production-sized shapes, beyond the drawn ones
@pytest.mark.technique("attention")
@pytest.mark.claim("FA-3")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", list(PRODUCTION_CASES))
def test_fa3_production_shapes(impl, device, dtype, name):
    case = PRODUCTION_CASES[name]
    q, k, v = make_inputs(case, 17, dtype, device)
    check_against_reference(call(impl, q, k, v, case), q, k, v, case, what=f"attention at {name}")


@pytest.mark.technique("attention")
def test_outputs_do_not_alias_across_calls(impl, device):
    """A second call must not overwrite the first call's output (a kernel returning one reused
    workspace per shape would)."""
    case = Case(1, 4, 2, 5, 33, 16, True, 0.25)
    q, k, v = make_inputs(case, 5, torch.float32, device)
    out1 = call(impl, q, k, v, case)
    kept = out1.clone()
    call(impl, -q, k.flip(2), -v, case)
    assert_exact(out1, kept, what="the first output after a second call")

