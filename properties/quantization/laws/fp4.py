"""The law of the FP4 block formats (claim QT-13; lecture 001 §5.4): every FP4 scheme of the
registry (``number_format`` "mxfp4" / "nvfp4") reconstructs every element within the contract's
``fp4_bound`` (``conformance/contracts/quantization/fp4.py``), comes back as ±6 s where |w| > 6 s,
and equals the float64 reference's value exactly (ties to the even code). Drawn weights include
``ties`` blocks whose values lie on the midpoints between grid points. Its zoo
(``zoo_fp4.py``) is rejected by the exact comparison; its product is QT-9's law (``integer.py``).
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import note
from hypothesis import strategies as st

from inference_conformance.conformance import results
from inference_conformance.conformance.contracts.quantization import fp4 as fp4_contract
from inference_conformance.conformance.laws import Kills, Law
from inference_conformance.conformance.tolerance import assert_exact, check_within
from inference_conformance.properties import strategies
from inference_conformance.properties.quantization.cases import QCase, make_weight, number_format, pinned, quant_cases, quantize
from inference_conformance.properties.quantization.zoo_fp4 import FP4_ZOO

TECH = "quantization"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _fp4_only(impl) -> str | None:
    fmt = number_format(impl)
    return None if fmt in fp4_contract.FP4_FORMATS else f"{getattr(impl, 'name', impl)} is not an FP4 scheme ({fmt})"


#: Midpoints between neighbouring E2M1 values, and grid values, in units of the block scale.
TIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
GRID = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0)


def make_fp4_weight(case: QCase, seed: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """The case's weight (``make_weight``), with every ``ties`` cell rebuilt: the tensor's other
    cells' max |w| is A; j the smallest integer >= -10 with 2688 * 2^j >= A (so NVFP4's tensor
    scale s_t = 2^j exactly); the first ties cell holds 2688 * 2^j (block scale 448 s_t), each
    later one c * 6 * 2^j with c = 2^i, i drawn in -3..8 (MXFP4's and NVFP4's scale both c 2^j);
    the cell's other elements are ±(tie or grid value) * c 2^j, all exact in every dtype."""
    w = make_weight(case, seed, dtype, "cpu").to(torch.float64)
    g = torch.Generator().manual_seed(seed + 31337)
    gs, cells = case.group_size, case.K // case.group_size
    ties = [i for i in range(case.N * cells) if case.kinds[i % len(case.kinds)] == "ties"]
    if not ties:
        return w.to(dtype).to(device)
    keep = torch.ones_like(w, dtype=torch.bool)
    for i in ties:
        keep[i // cells, (i % cells) * gs:(i % cells + 1) * gs] = False
    A = float(w[keep].abs().max()) if bool(keep.any()) else 0.0
    j = -10
    while 2688.0 * 2.0 ** j < A:
        j += 1
    values = torch.tensor(TIES + GRID, dtype=torch.float64)
    for n_tie, i in enumerate(ties):
        c = 448.0 if n_tie == 0 else 2.0 ** int(torch.randint(-3, 9, (1,), generator=g))
        cell = w[i // cells, (i % cells) * gs:(i % cells + 1) * gs]
        pick = values[torch.randint(len(values), (gs,), generator=g)]
        sign = torch.where(torch.rand(gs, generator=g) < 0.5, -1.0, 1.0).double()
        cell.copy_(pick * sign * c * 2.0 ** j)
        cell[int(torch.randint(gs, (1,), generator=g))] = 6 * c * 2.0 ** j
    return w.to(dtype).to(device)


@st.composite
def fp4_cases(draw) -> QCase:
    """QT-1's drawn cases at 4 bits, half of them with a ``ties`` kind among their cells."""
    c = draw(quant_cases())
    return replace(c, bits=4, kinds=c.kinds + (("ties",) if draw(st.booleans()) else ()))


#: Pinned: each zoo entry rejected; both formats' own blocks, odd K, a scale per element.
FP4_EXAMPLES = pinned((
    (QCase(3, 64, 4, 32, ("ties", "normal", "outlier", "zero", "subnormal", "ties"), M=5), 1),  # MXFP4's block
    (QCase(4, 32, 4, 16, ("ties", "normal", "neg", "ties"), M=1), 2),                         # NVFP4's block
    (QCase(2, 33, 4, "channel", ("normal", "pos"), M=17), 3),                                 # odd K
    (QCase(1, 16, 4, "tensor", ("ties",), M=16), 4),
    (QCase(2, 6, 4, 1, ("ties", "subnormal", "ties"), M=2), 5),                               # a scale per element
    (QCase(1, 16, 4, 16, ("zero",), M=1), 6),                                                 # an all-zero weight
))


def law_fp4_exact(run, device, dtype, case, seed):
    """QT-13: dequantize(quantize(w)) within the contract's fp4_bound, ±6 s exactly where
    |w| > 6 s, and equal to the reference's value (round to nearest even on the block's grid)."""
    from inference_conformance.reference.quantization import fp4 as ref

    note(str(case))
    w = make_fp4_weight(case, seed, dtype, device)
    d = run.impl.dequantize(quantize(run.impl, w, case, run=run))
    assert tuple(d.shape) == tuple(w.shape) and d.dtype == w.dtype and d.device == w.device, (d.shape, d.dtype)
    fmt = number_format(run.impl)
    check_within(d, w, fp4_contract.fp4_bound(w, fmt, case.granularity), what=f"{fmt} reconstruction ({case})",
                 rule="QT-13 half the grid spacing x the block scale").check()
    s = fp4_contract.fp4_scales(w, fmt, case.granularity).to(w.device)
    sat = w.double().abs() > 6 * s
    assert_exact(d[sat], (torch.sign(w.double()) * 6 * s)[sat].to(w.dtype), what=f"{fmt} saturation at ±6 s ({case})")
    expected = ref.dequantize_fp4(ref.quantize_fp4(w, bits=4, granularity=case.granularity, fmt=fmt))
    assert_exact(d, expected, what=f"{fmt} values vs the reference's nearest-even grid point ({case})")


def _record(run) -> None:
    if run.worst is not None:
        results.record("QT-13", measured=run.worst.error, bound=run.worst.bound, unit="max |w - w_hat| / bound",
                       rule="half the E2M1 spacing x the block scale; equal to the reference's nearest-even value")


QT13 = Law(claim="QT-13", technique=TECH, body=law_fp4_exact, given={"case": fp4_cases(), "seed": strategies.seeds},
           examples=FP4_EXAMPLES, dtypes=(torch.float64, torch.float32, torch.bfloat16, torch.float16),
           kills=(Kills(tuple(FP4_ZOO), (torch.float32,)),), applies=_fp4_only, max_examples=lambda n: max(4, n // 2),
    test="test_qt13_exact_nearest_even", after=_record,
    zoo_tests=("test_qt13_zoo_rejected",))
#: The product of every FP4 scheme is QT-9's law (``integer.py``: ``QT9``, its
#: pinned cases at 4 bits, the cancelling one-sign row included; both Triton launches in
#: ``kernels.py``), which rejects a product rounding its weights to bfloat16 in a
#: float32 call (``zoo_fp4.nvfp4_bf16_weights_in_float32``).
