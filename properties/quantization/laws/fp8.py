"""The law of the FP8 weight schemes (claim QT-11; lecture 001 §5.4): every FP8 scheme of the
registry (``number_format``) reconstructs every element within the contract's ``fp8_bound``
(``conformance/contracts/quantization/fp8.py``; per tensor, per channel, groups). Its product is
QT-9's law (``integer.py``)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import note
from hypothesis import strategies as st

from inference_conformance.conformance import results
from inference_conformance.conformance.contracts.quantization import fp8 as fp8_contract
from inference_conformance.conformance.laws import Kills, Law
from inference_conformance.conformance.tolerance import check_within
from inference_conformance.properties import strategies
from inference_conformance.properties.quantization.cases import (
    EXAMPLE_SEEDS,
    EXAMPLES,
    QCase,
    make_weight,
    number_format,
    pinned,
    quant_cases,
    quantize,
)

TECH = "quantization"
FORMATS = tuple(fp8_contract.FP8_FORMATS)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _fp8_only(impl) -> str | None:
    fmt = number_format(impl)
    if fmt in fp8_contract.FP8_FORMATS:
        return None
    return f"{impl.name} is not an FP8 scheme ({fmt}): " + ("QT-1 judges it" if fmt == "int" else "QT-13 judges it")


# --------------------------------------------------------------------- QT-11: the schemes
def fp8_cases() -> st.SearchStrategy[QCase]:
    """QT-1's drawn cases at 8 bits (an FP8 scheme's only width)."""
    return quant_cases().map(lambda c: replace(c, bits=8))


#: QT-1's pinned examples at 8 bits (all group kinds: zero, one-sign, outlier, subnormal groups).
FP8_EXAMPLES = pinned((replace(c, bits=8), s) for c, s in zip(EXAMPLES, EXAMPLE_SEEDS))


def law_fp8_within_half_ulp(run, device, dtype, case, seed):
    """QT-11: every element of dequantize(quantize(w)) within the contract's fp8_bound (half an
    ulp of the format at the group's scale); output of w's shape, dtype and device."""
    note(str(case))
    w = make_weight(case, seed, dtype, device)
    d = run.impl.dequantize(quantize(run.impl, w, case, run=run))
    assert tuple(d.shape) == tuple(w.shape) and d.dtype == w.dtype and d.device == w.device, (d.shape, d.dtype)
    fmt = number_format(run.impl)
    check_within(d, w, fp8_contract.fp8_bound(w, fmt, case.granularity), what=f"{fmt} reconstruction ({case})",
                 rule="QT-11 half ulp").check()


def _record_fp8(run) -> None:
    if run.worst is not None:
        results.record("QT-11", measured=run.worst.error, bound=run.worst.bound, unit="max |w - w_hat| / bound",
                       rule="every element within half an ulp of the FP8 format at its group's scale")


QT11 = Law(claim="QT-11", technique=TECH, body=law_fp8_within_half_ulp, given={"case": fp8_cases(), "seed": strategies.seeds},
           examples=FP8_EXAMPLES, dtypes=(torch.float64, torch.float32, torch.bfloat16),
           kills=(Kills(("fp8_e5m2_grid_as_e4m3_scheme", "fp8_double_rounding_scheme"), (torch.float64,)),),
           applies=_fp8_only,
           max_examples=lambda n: max(4, n // 2),
    test="test_qt11_within_half_ulp", after=_record_fp8,
    zoo_tests=("test_qt11_zoo_rejected",))
#: The product of every FP8 scheme is QT-9's law (``integer.py``: ``QT9``, its pinned cases at 8
#: bits; both Triton launches in ``kernels.py``).
