"""Laws of online softmax and FlashAttention (claims FA-1 .. FA-7; lecture 001 §3, exercises 3, 4).

Every law is written against the attention contract (``conformance/contracts/attention.py``)
and runs over every registered implementation; each lists the known-bad implementations it
must reject (``properties/zoo_attention.py``) and a zoo test shows it does.

Inputs are drawn to find the field's bugs: logits of real size and very large ones (up to
about ±5e4, integer-valued q, k with a power-of-four scale so that every correct implementation
computes them exactly and only the softmax is judged), Tq < Tk with causal masks and Tq > 1
(bottom-right alignment), grouped-query heads with ratios 1..3 and distinct values per KV head,
odd head dims (1, 59, 72, 80, 111, 136, 256), lengths one off a tile, scales other than
1/sqrt(D). Under the Triton interpreter the drawn sizes are bounded (each program instance
costs milliseconds there); on GPU they are larger.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import sys
from dataclasses import dataclass

import pytest
import torch
from hypothesis import example, given, note, reject, settings
from hypothesis.control import currently_in_test_context
from hypothesis.errors import Unsatisfiable
from hypothesis import strategies as st

from conformance import results
from conformance.contracts.attention import AttentionShape
from conformance.device import triton_interpreted
from conformance.tolerance import assert_close, assert_exact, assert_scalar, max_abs_error
from conformance.zoo import expect_rejected
from properties import strategies as S
from reference import attention as ref

DTYPES = [pytest.param(d, id=str(d).replace("torch.", "")) for d in S.FLOAT_DTYPES]
ZOO_ALL = ("no_max_subtract", "top_left_causal", "gqa_modulo", "drops_last_key", "ignores_scale",
           "split_no_rescale")


# ----------------------------------------------------------------------------------------------
# FA-1, FA-2: softmax and online softmax, with the lecture's numbers
# ----------------------------------------------------------------------------------------------

LECTURE_SCORES = [1000.0, 999.0, 998.0, 10.0]


@pytest.mark.claim("FA-1")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_fa1_textbook_softmax_overflows_max_subtracted_does_not(dtype):
    x = torch.tensor(LECTURE_SCORES, dtype=dtype)
    naive = ref.softmax_textbook(x)
    assert torch.isnan(naive[:3]).all(), f"textbook softmax of {LECTURE_SCORES} should overflow, got {naive}"
    p = ref.softmax(x)
    lecture = [0.665, 0.245, 0.090, 0.000]
    assert_exact(torch.round(p.double() * 1000).long(), torch.tensor([round(v * 1000) for v in lecture]),
                 what="max-subtracted softmax rounded to 3 decimals")
    assert abs(float(p.sum()) - 1.0) < 1e-6
    results.record("FA-1", measured=[round(float(v), 3) for v in p], lecture=lecture, unit="probability",
                   rule="softmax(x - max x), rounded to 3 decimals; textbook form gives nan",
                   textbook=[str(float(v)) for v in naive])


@pytest.mark.claim("FA-2")
def test_fa2_lecture_example_in_two_chunks():
    (m1, l1), (m2, l2) = ref.online_softmax_trace(LECTURE_SCORES, [2, 2])
    m_one, l_one = ref.softmax_stats(torch.tensor(LECTURE_SCORES, dtype=torch.float64))
    assert_exact(torch.tensor(m2), m_one, what="online m vs one-pass max")
    assert_scalar(l2, float(l_one), rel=1e-14, what="online l vs one-pass l")
    assert_scalar(m2, 1000.0, rel=0.0, what="m after two chunks")
    assert_scalar(l2, 1.503215, rel=5e-7, what="l after two chunks (lecture: 1.503215)")
    results.record("FA-2", measured={"m": m2, "l": round(l2, 6)}, lecture={"m": 1000, "l": 1.503215},
                   unit="(m, l)", rule="online softmax over [1000, 999] then [998, 10]",
                   one_pass_l=float(l_one), abs_diff_l=abs(l2 - float(l_one)))


@pytest.mark.claim("FA-2")
def test_fa2_exercise3_by_hand():
    trace = ref.online_softmax_trace([2.0, 1.0, 3.0], [2, 1])
    lecture = [(2.0, 1.368), (3.0, 1.503)]
    for (m, l), (m_lec, l_lec) in zip(trace, lecture):
        assert_scalar(m, m_lec, rel=0.0, what="m")
        assert_scalar(l, l_lec, rel=5e-4, what="l (lecture rounds to 3 decimals)")
    _, l_one = ref.softmax_stats(torch.tensor([2.0, 1.0, 3.0], dtype=torch.float64))
    assert_scalar(trace[-1][1], float(l_one), rel=1e-14, what="online l vs one-pass l")
    p, _, _ = ref.online_softmax(torch.tensor([2.0, 1.0, 3.0], dtype=torch.float64), [2, 1])
    assert_scalar(float(p[2]), 0.665, rel=1e-3, what="softmax(3) = 1/1.503")
    results.record("FA-2", measured=[(m, round(l, 3)) for m, l in trace], lecture=lecture, unit="(m, l) per chunk",
                   rule="exercise 3: [2, 1] then [3]")


@st.composite
def score_rows(draw):
    """(rows, n) float64 scores: normal, huge (±1e4..1e6) and -inf entries; every row keeps at
    least one finite entry. Returns (x, chunk sizes)."""
    rows = draw(st.integers(1, 4))
    n = draw(st.integers(1, 64))
    seed = draw(S.seeds)
    spread = draw(st.sampled_from([1.0, 30.0, 1e4, 1e6]))
    x = S.randn((rows, n), seed, scale=spread)
    kinds = draw(st.lists(st.sampled_from(["keep", "neginf", "huge", "tiny"]), min_size=n, max_size=n))
    for j, kind in enumerate(kinds):
        if kind == "neginf":
            x[:, j] = -math.inf
        elif kind == "huge":
            x[:, j] = x[:, j].sign() * 1e5 + x[:, j] * 1e-3
        elif kind == "tiny":
            x[:, j] = -1e6
    keep = draw(st.integers(0, n - 1))
    if torch.isneginf(x[:, keep]).any():
        x[:, keep] = S.randn((rows,), seed + 1)
    sizes, left = [], n
    while left:
        c = draw(st.integers(1, left))
        sizes.append(c)
        left -= c
    return x, sizes


@pytest.mark.claim("FA-2")
def test_fa2_online_softmax_equals_one_pass_for_any_chunking():
    worst = {"p": 0.0, "l": 0.0}

    @given(case=score_rows())
    def law(case):
        x, sizes = case
        note(f"chunks {sizes}")
        p_on, m_on, l_on = ref.online_softmax(x, sizes)
        p_one = ref.softmax(x)
        m_one, l_one = ref.softmax_stats(x)
        assert_exact(m_on, m_one, what="running max m")
        assert_close(l_on, l_one, what="running sum l")
        assert_close(p_on, p_one, what="online softmax")
        worst["p"] = max(worst["p"], max_abs_error(p_on, p_one))
        worst["l"] = max(worst["l"], max_abs_error(l_on, l_one) / float(l_one.abs().max()))

    law()
    results.record("FA-2", measured=worst["p"], lecture="identical to one pass (exact)", bound=1e-12,
                   unit="max |p_online - p_one_pass|", rule="float64, any chunking, -inf and ±1e5 entries",
                   max_rel_l=worst["l"])


# ----------------------------------------------------------------------------------------------
# FA-3: every implementation equals the float64 reference
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One attention call: sizes, mask, scale and how the inputs are drawn.

    ``magnitude``: "normal" (q, k, v ~ N(0, 1), scale = c/sqrt(D)) or "large" (q, k integers in
    [-64, 64] drawn with std ``amp``, scale a power of four: logits up to ~1e4-1e5, computed
    exactly by every correct implementation in every dtype)."""

    B: int
    Hq: int
    Hkv: int
    Tq: int
    Tk: int
    D: int
    causal: bool
    scale: float
    magnitude: str = "normal"
    amp: float = 1.0

    @property
    def shape(self) -> AttentionShape:
        return AttentionShape(self.B, self.Hq, self.Hkv, self.Tq, self.Tk, self.D)


def interpreter_cost(B: int, Hq: int, Tq: int, Tk: int) -> int:
    """Rough cost in program-tile units of the Triton kernels under the interpreter."""
    return B * Hq * -(-Tq // 16) * (2 + -(-Tk // 32))


#: Largest interpreter_cost drawn (interpreter: ~5 ms a unit); GPU draws are not bounded.
COST_BUDGET = 36


def fit_budget(case: Case) -> Case:
    """``case`` shrunk (batch, then heads, then query length) until its interpreter cost is
    within COST_BUDGET: for Triton kernels run under the interpreter, which cost ~5 ms a unit."""
    B, hq, hkv, Tq = case.B, case.Hq, case.Hkv, case.Tq
    if interpreter_cost(B, hq, Tq, case.Tk) > COST_BUDGET:
        B = 1
    if interpreter_cost(B, hq, Tq, case.Tk) > COST_BUDGET:
        hq, hkv = (hq // hkv, 1) if hkv > 1 else (hq, hkv)
    while interpreter_cost(B, hq, Tq, case.Tk) > COST_BUDGET and hq > 1:
        hq, hkv = hq - 1, 1
    while interpreter_cost(B, hq, Tq, case.Tk) > COST_BUDGET:
        Tq = max(1, Tq // 2)
    return dataclasses.replace(case, B=B, Hq=hq, Hkv=hkv, Tq=Tq)


def runs_interpreted(impl) -> bool:
    """True for a Triton kernel run under the interpreter (its module imports triton): only
    those get their drawn sizes bounded; a PyTorch implementation is checked at full size."""
    if not triton_interpreted():
        return False
    module = sys.modules.get(impl.target.split(":", 1)[0]) if ":" in impl.target else None
    return module is None or getattr(module, "triton", None) is not None


@st.composite
def cases(draw, max_len: int = 239, bounded: bool | None = None):
    """Attention calls. GQA shapes mix small ratios (including non powers of two) with the
    production ones (8 KV heads, groups of 4 and 8); head dims from 1 to 256. ``bounded``
    (default: under the interpreter) applies :func:`fit_budget` to every draw; laws that know
    their implementation draw unbounded and fit only interpreted Triton kernels."""
    hq, hkv = draw(st.one_of(S.gqa_heads(max_kv=3, max_group=3),
                             st.sampled_from([(8, 8), (8, 2), (16, 2), (32, 8), (12, 4)])))
    B = draw(st.integers(1, 4))
    D = draw(st.one_of(S.head_dims(), st.sampled_from([160, 200, 256])))
    causal = draw(st.booleans())
    a, b = draw(S.lengths(max_len)), draw(S.lengths(max_len))
    Tq, Tk = (min(a, b), max(a, b)) if causal else (a, b)
    magnitude = draw(st.sampled_from(["normal", "normal", "large"]))
    if magnitude == "large":
        scale = draw(st.sampled_from([1.0, 0.25, 0.0625, -0.25]))
        amp = draw(st.sampled_from([3.0, 12.0, 40.0]))
    else:
        scale = draw(st.sampled_from([1.0, 0.3, 1.7, 3.0, -1.0, 0.0])) / math.sqrt(D)
        amp = 1.0
    case = Case(B, hq, hkv, Tq, Tk, D, causal, scale, magnitude, amp)
    bounded = triton_interpreted() if bounded is None else bounded
    return fit_budget(case) if bounded else case


def make_inputs(case: Case, seed: int, dtype: torch.dtype, device: str):
    """(q, k, v) for ``case`` from ``seed`` (drawn in float64, then cast: every dtype sees the
    same values up to rounding); distinct values per KV head."""
    qs = (case.B, case.Hq, case.Tq, case.D)
    ks = (case.B, case.Hkv, case.Tk, case.D)
    if case.magnitude == "large":
        q = S.randn(qs, seed, scale=case.amp).round().clamp(-64, 64)
        k = S.randn(ks, seed + 1, scale=case.amp).round().clamp(-64, 64)
    else:
        q = S.randn(qs, seed)
        k = S.randn(ks, seed + 1)
    v = S.randn(ks, seed + 2)
    return tuple(t.to(device=device, dtype=dtype) for t in (q, k, v))


class _Support:
    """Examples an implementation ran and refused, per law run (see :func:`run_law`)."""

    ran = 0
    refused: list = []


def call(impl, q, k, v, case: Case, **kw):
    """Call the implementation. A NotImplementedError inside a Hypothesis law discards that
    example only (the law goes on with other draws; :func:`run_law` turns "every example
    refused" into "unsupported"); outside a law it skips the test as "unsupported". Never a pass."""
    try:
        out = impl(q, k, v, causal=case.causal, scale=case.scale, **kw)
    except NotImplementedError as exc:
        reason = f"unsupported: {getattr(impl, 'name', impl)} refuses {q.dtype}, D={case.D}: {exc}"
        if currently_in_test_context():
            _Support.refused.append(reason)
            note(reason)
            reject()
        pytest.skip(reason)
    _Support.ran += 1
    return out


def run_law(law, *args, **kwargs):
    """Run a Hypothesis law; if the implementation refused every example it was given, the
    test is "unsupported" (a skip), never a pass."""
    _Support.ran, _Support.refused = 0, []
    try:
        law(*args, **kwargs)
    except Unsatisfiable:
        pass
    if _Support.ran == 0 and _Support.refused:
        pytest.skip(f"{_Support.refused[0]} (and every other example)")


def check_against_reference(out, q, k, v, case: Case, what: str = "attention output"):
    """The tolerance policy: out vs the float64 naive reference (out_ref) and, for 16-bit
    outputs, the naive same-dtype computation (out_pt)."""
    assert out.shape == q.shape, f"output shape {tuple(out.shape)} != q's {tuple(q.shape)}"
    assert out.dtype == q.dtype, f"output dtype {out.dtype} != q's {q.dtype}"
    assert out.device == q.device, f"output on {out.device}, inputs on {q.device}"
    out_ref = ref.attention_naive(q, k, v, causal=case.causal, scale=case.scale, dtype=torch.float64)
    out_pt = None
    if q.dtype in (torch.float16, torch.bfloat16):
        out_pt = ref.attention_naive(q, k, v, causal=case.causal, scale=case.scale)
    return assert_close(out, out_ref, out_pt=out_pt, what=what)


# explicit examples run first in every profile: together they break every zoo entry
EXAMPLE_GQA_CAUSAL = Case(B=1, Hq=6, Hkv=2, Tq=5, Tk=37, D=59, causal=True, scale=0.3 / math.sqrt(59))
EXAMPLE_GQA_CAUSAL_POW2 = Case(B=1, Hq=6, Hkv=2, Tq=5, Tk=37, D=64, causal=True, scale=0.3 / 8)
EXAMPLE_LARGE_LOGITS = Case(B=1, Hq=3, Hkv=1, Tq=17, Tk=33, D=16, causal=False, scale=0.25,
                            magnitude="large", amp=40.0)


@given(case=cases(bounded=False), seed=S.seeds)
@example(case=EXAMPLE_GQA_CAUSAL, seed=7)
@example(case=EXAMPLE_GQA_CAUSAL_POW2, seed=7)
@example(case=EXAMPLE_LARGE_LOGITS, seed=11)
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
    q, k, v = make_inputs(case, seed, dtype, device)
    saved = fa.TWO_STAGE_OVERRIDE
    fa.TWO_STAGE_OVERRIDE = True
    try:
        if kernel == "flash_attention":
            out = fa.flash_attention(q, k, v, causal=case.causal, scale=case.scale)
        else:
            out = fd.flash_decoding(q, k, v, causal=case.causal, scale=case.scale, num_splits=num_splits)
    finally:
        fa.TWO_STAGE_OVERRIDE = saved
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
@pytest.mark.kills("split_no_rescale")
def test_fa7_zoo_rejected(bad_impl, device):
    expect_rejected(law_split_equals_unsplit, bad_impl, device, torch.float64)


@pytest.mark.claim("FA-7")
@settings(max_examples=8)
@given(case=decode_cases(), seed=S.seeds, num_splits=st.integers(1, 300))
def test_fa7_reference_split_merge(case, seed, num_splits):
    """The plain-PyTorch split-KV merge (reference.attention.split_kv_attention) is exact too."""
    q, k, v = make_inputs(case, seed, torch.float64, "cpu")
    out = ref.split_kv_attention(q, k, v, causal=case.causal, scale=case.scale, num_splits=num_splits)
    check_against_reference(out, q, k, v, case, what=f"reference split-KV ({num_splits} splits)")


# ----------------------------------------------------------------------------------------------
# FA-4, FA-5: the traffic and memory model (analytic)
# ----------------------------------------------------------------------------------------------


@pytest.mark.claim("FA-4")
def test_fa4_traffic_model():
    d = B = 128
    ratios = {}
    for T in (1024, 4096, 32768):
        std = sum(ref.standard_attention_traffic(T, d).values())
        fa = sum(ref.flash_attention_traffic(T, d, B).values())
        assert_scalar(std, 4 * T * d + 4 * T * T, rel=0.0, what=f"standard traffic at T={T}")
        assert_scalar(fa, 2 * T * d * (T // B) + 2 * T * d, rel=0.0, what=f"FlashAttention traffic at T={T}")
        ratios[T] = std / fa
    # the saving tends to 2x (4T^2 vs 2T^2 d/B with d = B) ...
    assert_scalar(ratios[32768], 2.0, rel=0.02, what="traffic saving at T=32K, d=B=128")
    # ... while the intermediate memory drops from O(T^2) to O(T): its ratio grows linearly in T
    mem = {T: ref.score_matrix_bytes(T, 2) / ref.flash_score_bytes(T, B, 2) for T in (1024, 4096, 32768)}
    assert_scalar(mem[32768] / mem[1024], 32.0, rel=0.0, what="score-memory ratio grows as T")
    results.record("FA-4", measured=round(ratios[32768], 3), lecture="about 2x (d = B = 128)", unit="x less HBM traffic",
                   rule="(4Td + 4T^2) / (2Td(T/B) + 2Td), counted by walking the loops",
                   per_T={str(t): round(r, 4) for t, r in ratios.items()},
                   score_memory_ratio={str(t): m for t, m in mem.items()})


@pytest.mark.claim("FA-5")
def test_fa5_exercise4_score_memory():
    T, heads, fp16 = 32 * 1024, 32, 2
    GiB, MiB = 2 ** 30, 2 ** 20
    per_head = ref.score_matrix_bytes(T, fp16)
    flash_head = ref.flash_score_bytes(T, 128, fp16)
    assert_scalar(per_head / GiB, 2.0, rel=0.0, what="S per head (GiB)")
    assert_scalar(per_head * heads / GiB, 64.0, rel=0.0, what="S per layer (GiB)")
    assert_scalar(flash_head / MiB, 8.0, rel=0.0, what="FlashAttention scores per head (MiB)")
    assert_scalar(flash_head * heads / MiB, 256.0, rel=0.0, what="FlashAttention scores per layer (MiB)")
    results.record("FA-5", measured={"S per head GB": per_head / GiB, "S per layer GB": per_head * heads / GiB,
                                     "flash per head MB": flash_head / MiB, "flash per layer MB": flash_head * heads / MiB},
                   lecture={"S per head GB": 2, "S per layer GB": 64, "flash per head MB": 8, "flash per layer MB": 256},
                   unit="bytes (GB = 2^30, MB = 2^20)", rule="T=32K, 32 heads, fp16, blocks of 128")


# ----------------------------------------------------------------------------------------------
# FA-6: memory linear in T (measured on GPU)
# ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.claim("FA-6")
@pytest.mark.parametrize("name", ["triton", "triton_splitkv", "torch"])
def test_fa6_peak_extra_memory_linear_in_T(name, device):
    from conformance import registry

    impl = {i.name: i for i in registry.builtins("attention", device)}[name]
    if impl.unavailable:
        pytest.skip(impl.unavailable)
    B, H, D = 1, 8, 64
    lengths, extra = (1024, 2048, 4096, 8192), {}
    for T in lengths:
        q, k, v = (S.randn((B, H, T, D), s, dtype=torch.bfloat16, device=device) for s in (1, 2, 3))
        impl(q, k, v, causal=True, scale=D ** -0.5)  # compile / autotune outside the measurement
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = impl(q, k, v, causal=True, scale=D ** -0.5)
        torch.cuda.synchronize()
        extra[T] = torch.cuda.max_memory_allocated() - base
        del out, q, k, v
    growth = extra[lengths[-1]] / max(extra[lengths[0]], 1)
    t_ratio = lengths[-1] / lengths[0]
    naive_scores = {T: B * H * T * T * 2 for T in lengths}
    results.record("FA-6", measured=round(growth, 2), lecture="linear in T (not T^2)",
                   bound=2 * t_ratio, unit=f"peak extra memory growth, T {lengths[0]} -> {lengths[-1]}",
                   rule=f"growth <= 2 x T ratio ({t_ratio:g}); T^2 would give {t_ratio ** 2:g}",
                   implementation_name=name, bytes={str(t): b for t, b in extra.items()},
                   naive_score_bytes={str(t): b for t, b in naive_scores.items()})
    assert growth <= 2 * t_ratio, f"peak extra memory grew {growth:.1f}x for {t_ratio:g}x longer T: {extra}"


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

    with pytest.raises(pytest.skip.Exception, match="unsupported"):
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
