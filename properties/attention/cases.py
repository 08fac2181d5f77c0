"""Attention calls for the laws: the drawn and pinned cases, inputs from a seed, the call
(refusals become "unsupported", never passes) and the tolerance-policy check against the float64
reference. Shared by ``properties/test_attention*.py``.

Inputs are drawn to find the field's bugs: logits of real size and very large ones (up to
about ±5e4, integer-valued q, k with a power-of-four scale so that every correct implementation
computes them exactly and only the softmax is judged; pinned: large logits whose maximum arrives
after the first 64 and 128 keys, and, judged in 16 bits, large logits with scales that are not
powers of two), Tq < Tk with causal masks and Tq > 1
(bottom-right alignment), grouped-query heads with small ratios (1..3, not only powers of two)
and production ones (8 KV heads, groups of 4 and 8), distinct values per KV head, odd head dims
(1, 59, 72, 80, 111, 136) and 160..256, lengths one off a tile, negative, zero and other scales
than 1/sqrt(D). Only Triton kernels under the interpreter get their drawn sizes bounded (each
program instance costs milliseconds there).
"""
from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import strategies as st

from inference_conformance.conformance.contracts.attention import AttentionShape, causal_mask
from inference_conformance.conformance.device import triton_interpreted
from inference_conformance.conformance.laws import Run, dtype_id, refusal
from inference_conformance.conformance.tolerance import assert_close
from inference_conformance.properties import strategies
from inference_conformance.reference import attention as ref

DTYPES = [pytest.param(d, id=dtype_id(d)) for d in strategies.FLOAT_DTYPES]


@dataclass(frozen=True)
class Case:
    """One attention call: sizes, mask, scale and how the inputs are drawn.

    ``magnitude``: "normal" (q, k, v ~ N(0, 1), scale = c/sqrt(D)), "large" (q, k integers in
    [-64, 64] drawn with std ``amp``, scale a power of four: logits up to ~1e4-1e5, computed
    exactly by every correct implementation in every dtype; a pinned 16-bit case may take
    another scale) or "late" (as "large", with the keys before :func:`late_from` divided by 16:
    each row's maximum arrives in the last tile of 64 keys)."""

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
    within COST_BUDGET: for Triton kernels run under the interpreter, which cost ~5 ms a unit.
    Tk is never shrunk: a case whose keys alone exceed the budget runs with Tq = 1."""
    B, hq, hkv, Tq = case.B, case.Hq, case.Hkv, case.Tq
    if interpreter_cost(B, hq, Tq, case.Tk) > COST_BUDGET:
        B = 1
    if interpreter_cost(B, hq, Tq, case.Tk) > COST_BUDGET:
        hq, hkv = (hq // hkv, 1) if hkv > 1 else (hq, hkv)
    while interpreter_cost(B, hq, Tq, case.Tk) > COST_BUDGET and hq > 1:
        hq, hkv = hq - 1, 1
    while interpreter_cost(B, hq, Tq, case.Tk) > COST_BUDGET and Tq > 1:
        Tq = max(1, Tq // 2)
    return dataclasses.replace(case, B=B, Hq=hq, Hkv=hkv, Tq=Tq)


@st.composite
def cases(draw, max_len: int = 239, bounded: bool | None = None):
    """Attention calls. GQA shapes mix small ratios (including non powers of two) with the
    production ones (8 KV heads, groups of 4 and 8); head dims from 1 to 256. ``bounded``
    (default: under the interpreter) applies :func:`fit_budget` to every draw; laws that know
    their implementation draw unbounded and fit only interpreted Triton kernels."""
    hq, hkv = draw(st.one_of(strategies.gqa_heads(max_kv=3, max_group=3),
                             st.sampled_from([(8, 8), (8, 2), (16, 2), (32, 8), (12, 4)])))
    B = draw(st.integers(1, 6))
    D = draw(st.one_of(strategies.head_dims(), st.sampled_from([160, 200, 256])))
    causal = draw(st.booleans())
    a, b = draw(strategies.lengths(max_len)), draw(strategies.lengths(max_len))
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


def late_from(Tk: int) -> int:
    """First key of the "late" keys of a ``magnitude="late"`` case: the last tile of 64 keys
    (keys 64.. at Tk = 65, 128.. at Tk = 130, 192.. at Tk = 200): every key before it has its
    components divided by 16, so each row's largest logits arrive after the first 64 (and, past
    Tk = 128, the first 128) keys, far above the earlier tiles' maximum."""
    return 64 * ((Tk - 1) // 64)


def make_inputs(case: Case, seed: int, dtype: torch.dtype, device: str):
    """(q, k, v) for ``case`` from ``seed`` (drawn in float64, then cast: every dtype sees the
    same values up to rounding); distinct values per KV head."""
    qs = (case.B, case.Hq, case.Tq, case.D)
    ks = (case.B, case.Hkv, case.Tk, case.D)
    if case.magnitude in ("large", "late"):
        q = strategies.randn(qs, seed, scale=case.amp).round().clamp(-64, 64)
        k = strategies.randn(ks, seed + 1, scale=case.amp).round().clamp(-64, 64)
        if case.magnitude == "late":
            k[:, :, :late_from(case.Tk)] = (k[:, :, :late_from(case.Tk)] / 16).round()
    else:
        q = strategies.randn(qs, seed)
        k = strategies.randn(ks, seed + 1)
    v = strategies.randn(ks, seed + 2)
    return tuple(t.to(device=device, dtype=dtype) for t in (q, k, v))


def call(impl, q, k, v, case: Case, *, run: Run | None = None, **kw):
    """Call the implementation. Inside a law's example (``run`` given) the call is observed
    (:func:`call_profile`, for the contract's coverage table) and a NotImplementedError discards
    that example only (the law goes on with other draws; "every example refused" is
    "unsupported"); outside a law it skips the test as "unsupported". Never a pass."""
    if run is not None:
        run.observe(call_profile(q, k, case, kw.get("num_splits")))
    with refusal(run, f"{getattr(impl, 'name', impl)} refuses {q.dtype}, D={case.D}"):
        return impl(q, k, v, causal=case.causal, scale=case.scale, **kw)


def logit_profile(q, k, causal, scale) -> dict:
    """The logits' size and where their maximum arrives: ``max_logit`` (max |scale·q·k| over
    visible keys) and ``rise64`` / ``rise128`` (the largest, over rows, of the row's max logit
    after the first 64 / 128 keys minus its max over those keys; -inf if Tk is not larger)."""
    group = q.shape[1] // k.shape[1]
    kf = k.to(torch.float64).repeat_interleave(group, dim=1)
    s = (q.to(torch.float64) @ kf.transpose(-1, -2)) * float(scale)          # (B, Hq, Tq, Tk)
    Tq, Tk = s.shape[-2], s.shape[-1]
    if causal:
        s = s.masked_fill(~causal_mask(Tq, Tk, q.device), -math.inf)
    out = {"max_logit": float(torch.where(torch.isinf(s), 0.0, s.abs()).max())}
    for t in (64, 128):
        rise = -math.inf
        if Tk > t:
            d = s[..., t:].max(dim=-1).values - s[..., :t].max(dim=-1).values
            rise = float(torch.nan_to_num(d, nan=-math.inf).max())
        out[f"rise{t}"] = rise
    return out


def call_profile(q, k, case: Case, num_splits=None) -> dict:
    """One call as the contract's coverage table sees it (``COVERAGE``'s observations): the
    sizes, mask, scale, dtype, ``num_splits`` and the logits' :func:`logit_profile`."""
    return dict(B=case.B, Hq=case.Hq, Hkv=case.Hkv, Tq=case.Tq, Tk=case.Tk, D=case.D, causal=case.causal,
                scale=float(case.scale), dtype=q.dtype, num_splits=num_splits,
                **logit_profile(q, k, case.causal, case.scale))


def check_against_reference(out, q, k, v, case: Case, what: str = "attention output"):
    """The tolerance policy: out vs the float64 naive reference (out_ref) of the same inputs
    (16-bit outputs: element by element against out_ref rounded to their dtype)."""
    assert out.shape == q.shape, f"output shape {tuple(out.shape)} != q's {tuple(q.shape)}"
    assert out.dtype == q.dtype, f"output dtype {out.dtype} != q's {q.dtype}"
    assert out.device == q.device, f"output on {out.device}, inputs on {q.device}"
    out_ref = ref.attention_naive(q, k, v, causal=case.causal, scale=case.scale, dtype=torch.float64)
    return assert_close(out, out_ref, what=what)


# ---------------------------------------------------------------------------------------- FA-3
#: The known-bad implementations FA-3's law rejects in float64 (properties/attention/zoo.py).
ZOO_ALL = ("no_max_subtract", "top_left_causal", "gqa_modulo", "drops_last_key", "ignores_scale",
           "split_no_rescale", "diagonal_tile_unmasked", "sdpa_is_causal_always", "split_batch_stride_zero",
           "scale_rounded_to_float32", "stale_running_max", "chunk_diagonal_off_by_one",
           "prefix_offset_clamped_to_tile", "top_left_causal_in_large_batches")
#: FA-3, bfloat16: bugs whose error stays within a few 16-bit ulps (or vanishes in float64): rejected in bfloat16.
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
#: A causal chunk after a cached prefix in a batch of five (B >= 5, 1 < Tq < Tk): a kernel whose
#: path for large batches aligns the mask top-left is wrong only here; 10 programs of one key tile.
EXAMPLE_BATCH5_CHUNK = Case(B=5, Hq=2, Hkv=1, Tq=3, Tk=11, D=16, causal=True, scale=0.25)
#: A causal single query over a single key in a batch of five: a mask that hides the only key (a
#: fully masked row) in large batches is seen here.
EXAMPLE_BATCH5_SINGLE = Case(B=5, Hq=2, Hkv=1, Tq=1, Tk=1, D=16, causal=True, scale=0.25)
#: The scale classes (negative, zero, tiny, huge) crossed with every mask path (none, causal with
#: Tq = Tk, where SDPA's is_causal applies, and causal with Tq < Tk). The first is PyTorch's CPU
#: is_causal bug: B = 1, 8 heads, Tq = Tk = 2, D = 1, scale -1, NaN in float64.
SCALE_MASK_CASES = tuple(
    Case(B=1, Hq=8 if (scale, Tq) == (-1.0, 2) else 2, Hkv=8 if (scale, Tq) == (-1.0, 2) else 1,
         Tq=Tq, Tk=Tk, D=1 if (scale, Tq) == (-1.0, 2) else 8, causal=causal, scale=scale)
    for scale in (-1.0, 0.0, 1e-6, 16.0)
    for (Tq, Tk, causal) in ((2, 2, True), (3, 9, True), (5, 7, False)))


#: Pinned boundary shapes (inference_conformance.conformance.contracts.attention.COVERAGE): Tk at 127/128/129 (every
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
#: Large integer logits of up to 4,096 in float32 (D = 1, amplitude 40, no mask, two query rows,
#: 26 keys: two splits of 13 under the interpreter): a split-KV merge whose log-sum-exp is kept
#: in float32 rounds it by up to 2.4e-4 and fails the float32 rule (8.0e-5 relative here, the
#: bound 1e-5; the unsplit kernel and naive float32 attention stay near 1.4e-7). Seed 25.
EXAMPLE_SPLIT_LSE_ROUNDING = Case(B=1, Hq=8, Hkv=8, Tq=2, Tk=26, D=1, causal=False, scale=1.0,
                                  magnitude="large", amp=40.0)



def _seeded(cases, first_seed: int) -> tuple:
    """Pinned examples ``dict(case=c, seed=first_seed + i)`` for the i-th of ``cases``."""
    return tuple(dict(case=c, seed=first_seed + i) for i, c in enumerate(cases))


# ---------------------------------------------------------------------------------------- FA-7
def accepts_num_splits(impl) -> bool:
    """True when the implementation's attention takes a ``num_splits`` keyword (split-KV)."""
    fn = getattr(impl, "attention", impl)
    try:
        return "num_splits" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


@st.composite
def decode_cases(draw, interpreted: bool | None = None):
    """Decoding shapes: Tq small (1..4 draft tokens), Tk long relative to it (up to 160 for a
    Triton kernel under the interpreter, ``interpreted``; default: whether Triton runs
    interpreted)."""
    interpreted = triton_interpreted() if interpreted is None else interpreted
    hq, hkv = draw(strategies.gqa_heads(max_kv=2, max_group=2 if interpreted else 3))
    D = draw(strategies.head_dims())
    Tq = draw(st.sampled_from([1, 1, 2, 4]))
    Tk = draw(st.integers(max(Tq, 1), 160 if interpreted else 4096))
    causal = draw(st.booleans())
    magnitude = draw(st.sampled_from(["normal", "large"]))
    if magnitude == "large":
        return Case(1, hq, hkv, Tq, Tk, D, causal, draw(st.sampled_from([1.0, 0.25])), "large",
                    draw(st.sampled_from([12.0, 40.0])))
    return Case(1, hq, hkv, Tq, Tk, D, causal, draw(st.sampled_from([0.3, 1.0, 1.7])) / math.sqrt(D))



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
    # decode-shaped groups above 16 that are not multiples of 16 (the interpreter budget shrinks
    # the drawn and pinned FA-3 cases below them): 20 with two KV heads, 24 with one
    "decode-group20-Hkv2": Case(B=1, Hq=40, Hkv=2, Tq=1, Tk=40, D=8, causal=False, scale=0.3),
    "decode-group24-Hkv1": Case(B=1, Hq=24, Hkv=1, Tq=2, Tk=33, D=8, causal=True, scale=0.25),
    # large logits whose maximum arrives in the last tile, past the first 128 keys (a running
    # max frozen after the first tile overflows), and large logits with a scale that is not a
    # power of two (a scale folded into q in 16 bits moves them)
    "late-max-Tk300-causal": Case(B=2, Hq=4, Hkv=2, Tq=2, Tk=300, D=64, causal=True, scale=0.125,
                                  magnitude="late", amp=40.0),
    "large-scale0.09-group4": Case(B=2, Hq=8, Hkv=2, Tq=4, Tk=70, D=64, causal=False, scale=0.09,
                                   magnitude="large", amp=12.0),
}


