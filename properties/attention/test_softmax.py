"""Laws of softmax and online softmax (claims FA-1, FA-2; lecture 001 §3, exercise 3), with the
lecture's numbers: the textbook form overflows, the max-subtracted one does not, and online
softmax over any chunking gives the one-pass result with its (m, l)."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import note
from hypothesis import strategies as st

from inference_conformance.conformance import results
from inference_conformance.conformance.laws import Law
from inference_conformance.conformance.tolerance import (
    assert_close,
    assert_exact,
    assert_scalar,
    max_abs_error,
)
from inference_conformance.properties import strategies as S
from inference_conformance.properties.attention.flash_cases import LECTURE_SCORES, check_fa1, check_fa2_exercise3, check_fa2_two_chunks
from inference_conformance.reference import attention as ref

pytestmark = pytest.mark.suite_own("online softmax itself (FA-1, FA-2): the lecture's arithmetic on the suite's softmax")

DTYPES = [pytest.param(d, id=str(d).replace("torch.", "")) for d in S.FLOAT_DTYPES]

# ----------------------------------------------------------------------------------------------
# FA-1, FA-2: softmax and online softmax, with the lecture's numbers
# ----------------------------------------------------------------------------------------------



@pytest.mark.claim("FA-1")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_fa1_textbook_softmax_overflows_max_subtracted_does_not(dtype):
    naive, p = check_fa1(ref.softmax_textbook, ref.softmax, dtype)
    results.record("FA-1", measured=[round(float(v), 3) for v in p], lecture=[0.665, 0.245, 0.090, 0.000],
                   unit="probability", rule="softmax(x - max x), rounded to 3 decimals; textbook form gives nan",
                   textbook=[str(float(v)) for v in naive])


@pytest.mark.claim("FA-2")
def test_fa2_lecture_example_in_two_chunks():
    m2, l2 = check_fa2_two_chunks(ref.online_softmax_trace, ref.softmax_stats)
    _, l_one = ref.softmax_stats(torch.tensor(LECTURE_SCORES, dtype=torch.float64))
    results.record("FA-2", measured={"m": m2, "l": round(l2, 6)}, lecture={"m": 1000, "l": 1.503215},
                   unit="(m, l)", rule="online softmax over [1000, 999] then [998, 10]",
                   one_pass_l=float(l_one), abs_diff_l=abs(l2 - float(l_one)))


@pytest.mark.claim("FA-2")
def test_fa2_exercise3_by_hand():
    trace = check_fa2_exercise3(ref.online_softmax_trace, ref.softmax_stats)
    p, _, _ = ref.online_softmax(torch.tensor([2.0, 1.0, 3.0], dtype=torch.float64), [2, 1])
    assert_scalar(float(p[2]), 0.665, rel=1e-3, what="softmax(3) = 1/1.503")
    results.record("FA-2", measured=[(m, round(l, 3)) for m, l in trace], lecture=[(2.0, 1.368), (3.0, 1.503)],
                   unit="(m, l) per chunk", rule="exercise 3: [2, 1] then [3]")


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


@pytest.mark.claim("FA-2")
def test_fa2_online_softmax_equals_one_pass_for_any_chunking():
    seen = FA2(ref).observations
    results.record("FA-2", measured=max(o["p"] for o in seen), lecture="identical to one pass (exact)", bound=1e-12,
                   unit="max |p_online - p_one_pass|", rule="float64, any chunking, -inf and ±1e5 entries",
                   max_rel_l=max(o["l"] for o in seen))
