"""Laws of softmax and online softmax (claims FA-1, FA-2; lecture 001 §3, exercise 3), with the
lecture's numbers: the textbook form overflows, the max-subtracted one does not, and online
softmax over any chunking gives the one-pass result with its (m, l)."""
from __future__ import annotations


import pytest
import torch

from inference_conformance.conformance import results
from inference_conformance.conformance.tolerance import (
    assert_scalar,
)
from inference_conformance.properties import strategies
from inference_conformance.properties.attention.laws import FA2
from inference_conformance.properties.attention.flash_cases import LECTURE_SCORES, check_fa1, check_fa2_exercise3, check_fa2_two_chunks
from inference_conformance.reference import attention as ref

pytestmark = pytest.mark.suite_own("online softmax itself (FA-1, FA-2): the lecture's arithmetic on the suite's softmax")

DTYPES = [pytest.param(d, id=str(d).replace("torch.", "")) for d in strategies.FLOAT_DTYPES]

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





@pytest.mark.claim("FA-2")
def test_fa2_online_softmax_equals_one_pass_for_any_chunking():
    seen = FA2(ref).observations
    results.record("FA-2", measured=max(o["p"] for o in seen), lecture="identical to one pass (exact)", bound=1e-12,
                   unit="max |p_online - p_one_pass|", rule="float64, any chunking, -inf and ±1e5 entries",
                   max_rel_l=max(o["l"] for o in seen))
