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
import math
import sys
from dataclasses import dataclass

import pytest
import torch
from hypothesis import note, reject
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.errors import Unsatisfiable

from conformance.contracts.attention import AttentionShape
from conformance.device import triton_interpreted
from conformance.outcomes import unsupported
from conformance.tolerance import (
    assert_close,
)
from properties import strategies as S
from reference import attention as ref

DTYPES = [pytest.param(d, id=str(d).replace("torch.", "")) for d in S.FLOAT_DTYPES]



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
        q = S.randn(qs, seed, scale=case.amp).round().clamp(-64, 64)
        k = S.randn(ks, seed + 1, scale=case.amp).round().clamp(-64, 64)
        if case.magnitude == "late":
            k[:, :, :late_from(case.Tk)] = (k[:, :, :late_from(case.Tk)] / 16).round()
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
        reason = f"{getattr(impl, 'name', impl)} refuses {q.dtype}, D={case.D}: {exc}"
        if currently_in_test_context():
            _Support.refused.append(reason)
            note(reason)
            reject()
        unsupported(reason)
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
        unsupported(f"{_Support.refused[0]} (and every other example)")


def check_against_reference(out, q, k, v, case: Case, what: str = "attention output"):
    """The tolerance policy: out vs the float64 naive reference (out_ref) of the same inputs
    (16-bit outputs: element by element against out_ref rounded to their dtype)."""
    assert out.shape == q.shape, f"output shape {tuple(out.shape)} != q's {tuple(q.shape)}"
    assert out.dtype == q.dtype, f"output dtype {out.dtype} != q's {q.dtype}"
    assert out.device == q.device, f"output on {out.device}, inputs on {q.device}"
    out_ref = ref.attention_naive(q, k, v, causal=case.causal, scale=case.scale, dtype=torch.float64)
    return assert_close(out, out_ref, what=what)


# explicit examples run first in every profile: together they break every zoo entry


class KernelLaunchCapture:
    """Stands in for a Triton kernel: records the arguments of every launch, then launches."""

    def __init__(self, kernel, seen):
        self.kernel, self.seen = kernel, seen

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.seen.extend(list(args) + list(kwargs.values()))
            return self.kernel[grid](*args, **kwargs)
        return launch
