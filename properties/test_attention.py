"""Laws of FlashAttention and split-KV decoding (claims FA-3, FA-7; lecture 001 §3).

Every law is written against the attention contract (``conformance/contracts/attention.py``)
and runs over every registered implementation; each lists the known-bad implementations it
must reject (``properties/zoo_attention.py``) and a zoo test shows it does. The cases are in
``properties/attention_cases.py``; softmax (FA-1, FA-2) is in ``test_softmax.py``, the memory
claims (FA-4..FA-6) in ``test_attention_memory.py``.
"""
from __future__ import annotations

import inspect
import math

import pytest
import torch
from hypothesis import example, given, note, settings
from hypothesis import strategies as st

from conformance import results
from conformance.device import triton_interpreted
from conformance.outcomes import Unsupported
from conformance.tolerance import (
    assert_close,
    assert_exact,
    max_abs_error,
)
from conformance.zoo import expect_rejected
from properties import strategies as S
from properties.attention_cases import (
    COST_BUDGET,
    DTYPES,
    Case,
    _Support,
    call,
    cases,
    check_against_reference,
    fit_budget,
    interpreter_cost,
    make_inputs,
    run_law,
    runs_interpreted,
)
from reference import attention as ref

ZOO_ALL = ("no_max_subtract", "top_left_causal", "gqa_modulo", "drops_last_key", "ignores_scale",
           "split_no_rescale", "diagonal_tile_unmasked", "sdpa_is_causal_always", "split_batch_stride_zero",
           "scale_rounded_to_float32", "stale_running_max")
#: Bugs whose error stays within a few 16-bit ulps (or vanishes in float64): rejected in bfloat16.
ZOO_16BIT = ("scaled_two_percent", "accumulates_in_16bit", "drops_last_key", "scale_folded_in_16bit")

EXAMPLE_GQA_CAUSAL = Case(B=1, Hq=6, Hkv=2, Tq=5, Tk=37, D=59, causal=True, scale=0.3 / math.sqrt(59))
EXAMPLE_GQA_CAUSAL_POW2 = Case(B=1, Hq=6, Hkv=2, Tq=5, Tk=37, D=64, causal=True, scale=0.3 / 8)
EXAMPLE_LARGE_LOGITS = Case(B=1, Hq=3, Hkv=1, Tq=17, Tk=33, D=16, causal=False, scale=0.25,
                            magnitude="large", amp=40.0)
#: Large logits whose maximum arrives late (magnitude "late": the last tile of 64 keys holds each
#: row's largest logits, above the earlier keys' maximum by far more than 709): after the first
#: 64 keys (Tk = 65), after the first 128 (Tk = 129, one key; Tk = 200, causal). A running max
#: not updated after the first tile overflows to inf there, in float64 too.
LATE_MAX_CASES = (
    Case(B=1, Hq=2, Hkv=1, Tq=3, Tk=65, D=16, causal=False, scale=0.25, magnitude="late", amp=40.0),
    Case(B=1, Hq=2, Hkv=1, Tq=2, Tk=129, D=16, causal=True, scale=0.25, magnitude="late", amp=40.0),
    Case(B=1, Hq=2, Hkv=1, Tq=3, Tk=200, D=16, causal=True, scale=0.25, magnitude="late", amp=40.0),
)
#: Large integer logits (~1e2) with scales that are not powers of two: a correct kernel scales
#: the exact float32 q·k in float32; one that folds the scale into q in 16 bits (q * scale
#: rounded to bfloat16 / float16) moves the logits by ~2^-9 |q||k| and fails in 16 bits.
LARGE_NONPOW2_CASES = (
    Case(B=1, Hq=3, Hkv=1, Tq=17, Tk=33, D=16, causal=False, scale=0.3, magnitude="large", amp=12.0),
    Case(B=1, Hq=2, Hkv=1, Tq=5, Tk=40, D=64, causal=True, scale=0.1, magnitude="large", amp=12.0),
)
#: ~1100 keys in 17 tiles of 64: a 16-bit accumulator and one dropped key show in bfloat16 here
#: (at most 0.71 of the 16-bit bound for the built-ins, >= 1.5 for the zoo's 16-bit bugs).
EXAMPLE_LONG_KEYS = Case(B=2, Hq=2, Hkv=1, Tq=1, Tk=1100, D=256, causal=False, scale=1 / 16)
#: Causal with the length a multiple of every tile (16, 32, 64): the diagonal tile is whole, and
#: a kernel taking its unmasked fast path there lets row 0 see keys it must not.
EXAMPLE_DIAGONAL_TILE = Case(B=2, Hq=2, Hkv=1, Tq=64, Tk=64, D=64, causal=True, scale=0.125)
#: The scale classes (negative, zero, tiny, huge) crossed with every mask path (none, causal with
#: Tq = Tk, where SDPA's is_causal applies, and causal with Tq < Tk). The first is PyTorch's CPU
#: is_causal bug: B = 1, 8 heads, Tq = Tk = 2, D = 1, scale -1, NaN in float64.
SCALE_MASK_CASES = tuple(
    Case(B=1, Hq=8 if (scale, Tq) == (-1.0, 2) else 2, Hkv=8 if (scale, Tq) == (-1.0, 2) else 1,
         Tq=Tq, Tk=Tk, D=1 if (scale, Tq) == (-1.0, 2) else 8, causal=causal, scale=scale)
    for scale in (-1.0, 0.0, 1e-6, 16.0)
    for (Tq, Tk, causal) in ((2, 2, True), (3, 9, True), (5, 7, False)))


#: Pinned boundary shapes (conformance.contracts.attention.COVERAGE): Tk at 127/128/129 (every
#: tile size 16..128 exactly, +1 and -1), Tq at 15/16/17 and 63/65, two query tiles of 128, the
#: head dims of real models (64..256) and group sizes 1, 3, 8, 16, 24 and 64.
BOUNDARY_CASES = (
    Case(B=1, Hq=2, Hkv=1, Tq=16, Tk=128, D=64, causal=True, scale=0.125),
    Case(B=1, Hq=2, Hkv=2, Tq=17, Tk=129, D=72, causal=True, scale=0.3 / math.sqrt(72)),
    Case(B=1, Hq=6, Hkv=2, Tq=15, Tk=127, D=80, causal=False, scale=0.1),
    Case(B=2, Hq=2, Hkv=1, Tq=65, Tk=65, D=96, causal=True, scale=0.1),
    Case(B=1, Hq=8, Hkv=1, Tq=63, Tk=255, D=128, causal=True, scale=1 / math.sqrt(128)),
    Case(B=1, Hq=16, Hkv=1, Tq=2, Tk=96, D=160, causal=False, scale=0.08),
    Case(B=1, Hq=24, Hkv=1, Tq=1, Tk=31, D=192, causal=False, scale=0.07),
    Case(B=1, Hq=64, Hkv=1, Tq=4, Tk=33, D=256, causal=True, scale=1 / 16),
    Case(B=1, Hq=2, Hkv=1, Tq=130, Tk=130, D=16, causal=True, scale=0.25),
)


def _pinned(pairs):
    """Apply @example(case=c, seed=s) for each (c, s), in order."""
    def deco(f):
        for c, s in reversed(pairs):
            f = example(case=c, seed=s)(f)
        return f
    return deco


@given(case=cases(bounded=False), seed=S.seeds)
@example(case=EXAMPLE_GQA_CAUSAL, seed=7)
@example(case=EXAMPLE_GQA_CAUSAL_POW2, seed=7)
@example(case=EXAMPLE_LARGE_LOGITS, seed=11)
@example(case=EXAMPLE_LONG_KEYS, seed=5)
@example(case=EXAMPLE_DIAGONAL_TILE, seed=3)
@_pinned([(c, 20 + i) for i, c in enumerate(SCALE_MASK_CASES)])
@_pinned([(c, 40 + i) for i, c in enumerate(BOUNDARY_CASES)])
@_pinned([(c, 60 + i) for i, c in enumerate(LATE_MAX_CASES)])
@_pinned([(c, 70 + i) for i, c in enumerate(LARGE_NONPOW2_CASES)])
def law_matches_reference(impl, device, dtype, case, seed):
    """FA-3: attention(q, k, v) equals the float64 reference by the tolerance policy."""
    if runs_interpreted(impl):
        case = fit_budget(case)
    note(f"{case}")
    q, k, v = make_inputs(case, seed, dtype, device)
    out = call(impl, q, k, v, case)
    check_against_reference(out, q, k, v, case)


@pytest.mark.technique("attention")
@pytest.mark.claim("FA-3")
@pytest.mark.parametrize("dtype", DTYPES)
def test_fa3_matches_float64_reference(impl, device, dtype):
    run_law(law_matches_reference, impl, device, dtype)


@pytest.mark.technique("attention")
@pytest.mark.claim("FA-3")
@pytest.mark.kills(*ZOO_ALL)
def test_fa3_zoo_rejected(bad_impl, device):
    expect_rejected(law_matches_reference, bad_impl, device, torch.float64)


@pytest.mark.technique("attention")
@pytest.mark.claim("FA-3")
@pytest.mark.kills(*ZOO_16BIT)
def test_fa3_zoo_rejected_bfloat16(bad_impl, device):
    """The 16-bit rule sees errors of a few ulps: a 2% scaling, a 16-bit accumulator, a dropped
    key at Tk = 1100, all in bfloat16."""
    expect_rejected(law_matches_reference, bad_impl, device, torch.bfloat16)


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
def test_fa3_lecture_experiment_triton_kernel(device):
    """The same experiment on the Triton kernel itself, with its tile sizes varied."""
    fa = pytest.importorskip("optimized.flash_attention")
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
@given(case=cases(max_len=129), seed=S.seeds, block_q=st.sampled_from([None, 1, 3, 16, 17, 64]),
       block_k=st.integers(1, 70))
def test_fa3_blocked_reference_any_block_sizes(case, seed, block_q, block_k):
    q, k, v = make_inputs(case, seed, torch.float64, "cpu")
    out = ref.blocked_attention(q, k, v, causal=case.causal, scale=case.scale, block_q=block_q, block_k=block_k)
    check_against_reference(out, q, k, v, case, what=f"blocked attention ({block_q}, {block_k})")


@pytest.mark.claim("FA-3")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@settings(max_examples=6)
@given(case=cases(max_len=129), seed=S.seeds, data=st.data())
def test_fa3_triton_any_tile_sizes(device, dtype, case, seed, data):
    fa = pytest.importorskip("optimized.flash_attention")
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
@given(case=cases(max_len=129), seed=S.seeds, dtype=st.sampled_from([torch.float64, torch.float32]),
       num_splits=st.integers(1, 4))
@example(case=Case(1, 2, 1, 40, 100, 64, True, 0.2), seed=1, dtype=torch.float32, num_splits=2)
@example(case=Case(1, 3, 3, 17, 70, 72, False, 0.3, "large", 40.0), seed=2, dtype=torch.float64, num_splits=1)
def test_fa3_triton_two_stage_tile_loop(device, kernel, case, seed, dtype, num_splits):
    """The GPU's tile loop (whole visible tiles without masks, then the masked rest), forced on
    wherever the kernels run, so that the interpreter checks it too."""
    fa = pytest.importorskip("optimized.flash_attention")
    fd = pytest.importorskip("optimized.flash_decoding")
    tiles = pytest.importorskip("optimized.attention_tiles")
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


def _accepts_num_splits(impl) -> bool:
    fn = getattr(impl, "attention", impl)
    try:
        return "num_splits" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


#: Fewer examples for the laws whose every example launches several kernels (split-KV).
FEW = settings(max_examples=max(4, settings.default.max_examples // 3)) if triton_interpreted() else settings()
#: Most splits drawn under the interpreter (each split is one more program per head).
MAX_SPLITS = 6 if triton_interpreted() else 64


@st.composite
def decode_cases(draw):
    """Decoding shapes: Tq small (1..4 draft tokens), Tk long relative to it."""
    hq, hkv = draw(S.gqa_heads(max_kv=2, max_group=2 if triton_interpreted() else 3))
    D = draw(S.head_dims())
    Tq = draw(st.sampled_from([1, 1, 2, 4]))
    Tk = draw(st.integers(max(Tq, 1), 160 if triton_interpreted() else 4096))
    causal = draw(st.booleans())
    magnitude = draw(st.sampled_from(["normal", "large"]))
    if magnitude == "large":
        return Case(1, hq, hkv, Tq, Tk, D, causal, draw(st.sampled_from([1.0, 0.25])), "large",
                    draw(st.sampled_from([12.0, 40.0])))
    return Case(1, hq, hkv, Tq, Tk, D, causal, draw(st.sampled_from([0.3, 1.0, 1.7])) / math.sqrt(D))


@FEW
@given(case=decode_cases(), seed=S.seeds, num_splits=st.integers(1, MAX_SPLITS))
@example(case=Case(1, 4, 2, 1, 150, 64, False, 0.125), seed=3, num_splits=5)
@example(case=Case(1, 3, 1, 4, 97, 72, True, 0.25, "large", 40.0), seed=4, num_splits=3)
@example(case=Case(2, 1, 1, 1, 1024, 64, False, 0.125), seed=6, num_splits=2)   # B > 1 in the split path
def law_split_equals_unsplit(impl, device, dtype, case, seed, num_splits):
    """FA-7: the split-KV result (``num_splits`` key ranges) equals the unsplit one and the
    float64 reference, by the tolerance policy."""
    note(f"{case}, num_splits={num_splits}")
    q, k, v = make_inputs(case, seed, dtype, device)
    out_split = call(impl, q, k, v, case, num_splits=num_splits)
    out_unsplit = call(impl, q, k, v, case, num_splits=1)
    check_against_reference(out_split, q, k, v, case, what=f"split-KV output ({num_splits} splits)")
    check_against_reference(out_unsplit, q, k, v, case, what="unsplit output")
    if dtype == torch.float64:
        assert_close(out_split, out_unsplit, what="split vs unsplit (float64)")


@pytest.mark.technique("attention")
@pytest.mark.claim("FA-7")
@pytest.mark.parametrize("dtype", DTYPES)
def test_fa7_split_kv_equals_unsplit(impl, device, dtype):
    if not _accepts_num_splits(impl):
        pytest.skip(f"{impl.name} has no split-KV mode (no num_splits argument)")
    run_law(law_split_equals_unsplit, impl, device, dtype)


@pytest.mark.technique("attention")
@pytest.mark.claim("FA-7")
@pytest.mark.kills("split_no_rescale", "split_batch_stride_zero")
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=["float64", "bfloat16"])
def test_fa7_zoo_rejected(bad_impl, device, dtype):
    expect_rejected(law_split_equals_unsplit, bad_impl, device, dtype)


@pytest.mark.claim("FA-7")
@settings(max_examples=8)
@given(case=decode_cases(), seed=S.seeds, num_splits=st.integers(1, 300))
def test_fa7_reference_split_merge(case, seed, num_splits):
    """The plain-PyTorch split-KV merge (reference.attention.split_kv_attention) is exact too."""
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

    from conformance.registry import Implementation

    return Implementation("attention", name, f"tests:{name}", "outside",
                          types.SimpleNamespace(attention=fn), ("attention",))


def test_a_refused_example_does_not_skip_the_law(device):
    """A kernel that supports only some head dims is still checked on those: the top-left mask
    bug behind a power-of-two-only kernel is rejected, not reported unsupported."""
    from properties import zoo_attention

    bad = _implementation("pow2_top_left", _pow2_only(zoo_attention.top_left_causal))
    with pytest.raises(AssertionError):
        run_law(law_matches_reference, bad, device, torch.float64)
    good = _implementation("pow2_reference", _pow2_only(ref.attention))
    run_law(law_matches_reference, good, device, torch.float64)
    assert _Support.ran > 0 and _Support.refused


def test_an_implementation_refusing_everything_is_unsupported_not_passed(device):
    def refuses(q, k, v, *, causal, scale):
        raise NotImplementedError("nothing supported")

    with pytest.raises(Unsupported, match="unsupported"):
        run_law(law_matches_reference, _implementation("refuses", refuses), device, torch.float64)


# ----------------------------------------------- production-sized shapes, beyond the drawn ones
#: Shapes the drawn cases stay below (interpreter cost): a GQA group of 8 and 16 query heads
#: (Llama-3-70B's ratio), 8 KV heads, batch 3 and 4 (B·Hq = 64), keys past 256 with a partial
#: last tile and Tk % 64 == 1, a long decode, a long prefill, head dims 160 and 192, a negative
#: and a zero scale. A kernel wrong only at scale fails here.
PRODUCTION_CASES = {
    "B3-Hq16-group8-Tk260-causal": Case(B=3, Hq=16, Hkv=2, Tq=3, Tk=260, D=64, causal=True, scale=0.125),
    "decode-group4-Tk1100-D192": Case(B=1, Hq=4, Hkv=1, Tq=1, Tk=1100, D=192, causal=False, scale=0.07),
    "B4-Hq16-Hkv4-prefill-Tk321-causal": Case(B=4, Hq=16, Hkv=4, Tq=2, Tk=321, D=32, causal=True, scale=0.17),
    "B3-Hkv8-noncausal-Tk129-D160-negscale": Case(B=3, Hq=8, Hkv=8, Tq=7, Tk=129, D=160, causal=False,
                                                   scale=-0.08),
    "Tk65-scale0-causal": Case(B=1, Hq=2, Hkv=1, Tq=3, Tk=65, D=16, causal=True, scale=0.0),
    # a decode batch of five past 2048 keys (a split or a batch row dropped past the first 2048
    # keys or the fourth row) and groups of 9 (odd, above 8: a GQA map wrong past 8)
    "decode-B5-Tk2049": Case(B=5, Hq=2, Hkv=1, Tq=1, Tk=2049, D=8, causal=False, scale=0.3),
    "group9-Hkv2-causal": Case(B=1, Hq=18, Hkv=2, Tq=3, Tk=40, D=16, causal=True, scale=0.25),
    "group9-Hkv1": Case(B=2, Hq=9, Hkv=1, Tq=2, Tk=33, D=8, causal=False, scale=0.3),
    # large logits whose maximum arrives in the last tile, past the first 128 keys (a running
    # max frozen after the first tile overflows), and large logits with a scale that is not a
    # power of two (a scale folded into q in 16 bits moves them)
    "late-max-Tk300-causal": Case(B=2, Hq=4, Hkv=2, Tq=2, Tk=300, D=64, causal=True, scale=0.125,
                                  magnitude="late", amp=40.0),
    "large-scale0.09-group4": Case(B=2, Hq=8, Hkv=2, Tq=4, Tk=70, D=64, causal=False, scale=0.09,
                                   magnitude="large", amp=12.0),
}


@pytest.mark.technique("attention")
@pytest.mark.claim("FA-3")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", list(PRODUCTION_CASES))
def test_fa3_production_shapes(impl, device, dtype, name):
    case = PRODUCTION_CASES[name]
    q, k, v = make_inputs(case, 17, dtype, device)
    check_against_reference(call(impl, q, k, v, case), q, k, v, case, what=f"attention at {name}")


@pytest.mark.technique("attention")
def test_invalid_calls_raise(impl, device):
    """The contract's errors, for every implementation (outside ones too): causal with Tq > Tk,
    Hq not a multiple of Hkv, and mismatched head dims raise ValueError (or TypeError); a
    NotImplementedError or a garbage output is not an answer."""
    q, k, v = make_inputs(Case(1, 4, 2, 6, 5, 16, True, 0.25), 3, torch.float32, device)
    bad = {"causal with Tq > Tk": ((q, k, v), True),
           "Hq not a multiple of Hkv": ((q[:, :3], k, v), False),
           "head dims differ": ((q, k[..., :8], v[..., :8]), False)}
    for what, ((qq, kk, vv), causal) in bad.items():
        with pytest.raises((ValueError, TypeError)):
            impl(qq, kk, vv, causal=causal, scale=0.25)
            pytest.fail(f"{impl.name} accepted an invalid call ({what})")


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

