"""The attention contract's NaN rule: a NaN in the inputs is NaN in exactly the output rows
(for a NaN in v: the components) that see it, and every other element is what it would be
without the NaN (a key the causal mask hides must not leak). One law over every implementation,
with two known-bad ones (a "safe softmax" that zeroes NaN rows; a mask added as -inf)."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import strategies as st

from inference_conformance.conformance.laws import Kills, Law, refusal
from inference_conformance.conformance.tolerance import assert_close, assert_exact
from inference_conformance.reference.attention import attention as attention_ref

TECH = "attention"
DTYPES = (torch.float64, torch.float32, torch.bfloat16)

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning")]


@dataclass(frozen=True)
class NanCase:
    """One NaN placed in ``where`` ("q", "k" or "v") at batch ``b``, head ``h`` (a query head for
    q, a KV head for k and v), position ``t`` and component ``d``."""

    causal: bool
    Tq: int
    Tk: int
    where: str
    b: int
    h: int
    t: int
    d: int
    B: int = 2
    Hq: int = 4
    Hkv: int = 2
    D: int = 8


def expected_nan(c: NanCase) -> torch.Tensor:
    """(B, Hq, Tq, D) bool: where the contract says the output is NaN."""
    return _masks(c)[0]


def unspecified(c: NanCase) -> torch.Tensor:
    """(B, Hq, Tq, D) bool: where the contract leaves the output unspecified (a NaN value under
    a key the mask hides: component d of the rows that cannot see it, 0 x NaN)."""
    return _masks(c)[1]


def _masks(c: NanCase) -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.zeros(c.B, c.Hq, c.Tq, c.D, dtype=torch.bool)
    free = torch.zeros_like(mask)
    if c.where == "q":
        mask[c.b, c.h, c.t, :] = True
        return mask, free
    group = c.Hq // c.Hkv
    heads = range(c.h * group, (c.h + 1) * group)
    rows = [i for i in range(c.Tq) if not c.causal or c.t <= i + (c.Tk - c.Tq)]
    for h in heads:
        for i in range(c.Tq):
            if i not in rows:
                free[c.b, h, i, c.d] = c.where == "v"
            elif c.where == "k":
                mask[c.b, h, i, :] = True
            else:
                mask[c.b, h, i, c.d] = True
    return mask, free


#: A NaN seen by every row, one seen only by the last rows (a key the causal mask hides from
#: the others), one in a query row, one in a value; the decode shape (Tq = 1) and Tq = Tk.
CASES = (
    NanCase(True, 5, 9, "k", 1, 0, 8, 3),    # the last key: only the last query sees it
    NanCase(True, 5, 9, "k", 0, 1, 2, 0),    # an early key: every row sees it
    NanCase(True, 6, 6, "v", 1, 1, 4, 5),    # Tq = Tk: rows 4, 5 see it, component 5 only
    NanCase(False, 5, 9, "k", 0, 0, 8, 1),   # no mask: every row sees every key
    NanCase(True, 5, 9, "q", 1, 2, 3, 7),    # a query row
    NanCase(False, 1, 33, "q", 0, 3, 0, 0),  # decode
    NanCase(True, 1, 33, "v", 1, 0, 32, 2),  # decode: the newest value
)


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


NAN_RULE = Law(
    claim="FA-3", technique=TECH, body=law_nan_in_exactly_the_rows_that_see_it,
    given={"case": st.sampled_from(CASES)}, examples=tuple(dict(case=c) for c in CASES), explicit_only=True, dtypes=DTYPES,
    kills=(Kills(("nan_rows_zeroed", "additive_mask_leaks_nan"), (torch.float64,)),))

#: Findings, in the suite's expectation files (expectations/, applied to the built-ins in every
#: run, strict: a fix fails the run until its entry goes): PyTorch's CPU SDPA ("torch") breaks
#: the rule in every dtype (expectations/attention-torch.toml).
test_fa3_nan_in_exactly_the_rows_that_see_it = NAN_RULE.conformance_test("test_fa3_nan_in_exactly_the_rows_that_see_it")
(test_fa3_nan_zoo_rejected,) = NAN_RULE.make_zoo_tests("test_fa3_nan_zoo_rejected")


def test_the_expected_nan_elements_follow_the_mask():
    """The rule's own oracle on two cases worked by hand."""
    last_key = expected_nan(CASES[0])
    assert last_key[1, :2, 4].all() and not last_key[1, :2, :4].any() and not last_key[0].any()
    assert not last_key[1, 2:].any()                  # KV head 0 feeds query heads 0 and 1 only
    value = expected_nan(CASES[2])
    assert value[1, 2:, 4:, 5].all() and value.sum() == 2 * 2
