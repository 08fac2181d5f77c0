"""The laws of integer weight quantization and of every scheme's product (claims QT-1, QT-2,
QT-9; lecture 001 §5.1–5.2), written against the
``quantization`` contract (``conformance/contracts/quantization/contract.py``) and run over every
registered implementation.

- QT-1: every element of dequantize(quantize(w)) lies within half a step of w, the step of its
  own group by the contract's formula (absmax or zero point), for 2..8 bits and every
  granularity, on weights with all-zero groups, one-sign groups, a single huge outlier,
  subnormal elements, odd shapes and several groups per row (``properties/quantization/cases.py``).
- QT-2: quantize(dequantize(.)) is idempotent, exactly (float32 and float64 outputs: the only
  formats that hold code x scale exactly), and packing round trips exactly.
- QT-9: matmul(x, qw) equals x @ dequantize(qw).T by the tolerance rule ``quant-matmul``, for
  every scheme the contract takes (integer; FP8 and FP4 at their own 8 and 4 bits, in float32
  and bfloat16: ``QT9_FLOATING``), the cancelling one-sign row included; an NVFP4
  product rounding its weights to bfloat16 in a float32 call (zoo
  ``nvfp4_bf16_weights_in_float32``: 190 x the bound on that row) is rejected.
- Act-order (GPTQ's ``g_idx``, for implementations whose quantize accepts it): QT-1 per g_idx
  group and QT-9, on drawn column-to-group assignments that are never the identity.

The methods and the model experiments (QT-3..QT-8) are in ``properties/quantization/test_quantization_methods.py``;
the FP8 and FP4 laws in ``fp8.py`` and ``fp4.py``, the kernels' launch laws in ``kernels.py``.

The known-bad implementations (``properties/quantization/zoo.py``) are each shown rejected, and
the pinned examples are shown to reach the boundary classes in every Hypothesis profile.
"""
from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from hypothesis import note

from inference_conformance.conformance import results
from inference_conformance.conformance.contracts import quantization as contract
from inference_conformance.conformance.contracts.quantization import bounds as quantization_bounds
from inference_conformance.conformance.laws import Kills, Law, refusal
from inference_conformance.conformance.tolerance import check_within
from inference_conformance.properties import strategies
from inference_conformance.properties.quantization.claims_cases import check_qt2_idempotent
from inference_conformance.properties.quantization.cases import (
    DTYPES,
    EXAMPLE_SEEDS,
    EXAMPLES,
    QCase,
    accepted_scheme,
    act_order_cases,
    check_matmul,
    check_own_scale,
    integer_only,
    make_g_idx,
    make_weight,
    make_x,
    number_format,
    pinned,
    product_case,
    quant_cases,
    quantize,
    scheme,
    symmetric,
)

TECH = "quantization"
QT1_ZOO = ("floor_not_round", "scale_pow2_clamped", "scales_wrong_groups", "zero_point_off_by_one", "finer_groups",
           "zero_points_wrong_interleave")
ACT_ORDER_ZOO = ("g_idx_ignored",)
ACT_ORDER_KERNEL_ZOO = ("triton_kernel_ignores_g_idx",)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# -------------------------------------------------------------------------------------- QT-1
def law_half_step(run, device, dtype, case, seed):
    """QT-1: |dequantize(quantize(w)) - w| <= s/2 elementwise, s the step of the element's group
    (the contract's ``half_step_bound``); output of w's shape, dtype and device."""
    note(str(case))
    w = make_weight(case, seed, dtype, device)
    qw = quantize(run.impl, w, case, run=run)
    d = run.impl.dequantize(qw)
    assert tuple(d.shape) == tuple(w.shape), f"dequantize returned {tuple(d.shape)}, w is {tuple(w.shape)}"
    assert d.dtype == w.dtype, f"dequantize returned {d.dtype}, w is {w.dtype}"
    assert d.device == w.device, f"dequantize returned a tensor on {d.device}, w is on {w.device}"
    declared = accepted_scheme(run.impl, case)
    bound = quantization_bounds.half_step_bound(w, case.bits, case.granularity, symmetric(run.impl),
                                                scheme=declared)
    check_within(d, w, bound, what=f"reconstruction of w ({case})", rule="QT-1 half step").check()
    check_levels(d, case)
    if declared is not None:
        check_own_scale(run.impl, qw, w, d, case, declared)


def check_levels(d: torch.Tensor, case) -> None:
    """w_hat = (u - z) * s with one s and z per requested group and u in 0..2^b - 1: at most 2^b
    distinct values in each group (finer groups than asked pass the half-step bound; this sees
    them)."""
    N, K = d.shape
    g = K if case.granularity == "channel" else (N * K if case.granularity == "tensor" else case.granularity)
    rows = d.detach().to("cpu", torch.float64)
    groups = rows.reshape(1, -1) if case.granularity == "tensor" else rows.reshape(N * (K // g), g)
    worst = max(int(torch.unique(row).numel()) for row in groups)
    assert worst <= 2 ** case.bits, (f"a group of the requested granularity {case.granularity!r} holds {worst} "
                                     f"distinct dequantized values, more than 2^{case.bits} = {2 ** case.bits} "
                                     f"levels: the scales do not follow the requested groups ({case})")


def _record_worst(run) -> None:
    """QT-1's row: the run's worst element, in half steps."""
    if run.worst is not None:
        results.record("QT-1", measured=run.worst.error, bound=run.worst.bound, unit="max |w - w_hat| / (s/2)",
                       rule="every element within half a step of its group (s/2 (1 + 2^-12) + half an ulp of "
                            "the output)")


#: QT-1's law: its cases must reach every boundary class of the contract's coverage table.
QT1 = Law(claim="QT-1", technique=TECH, body=law_half_step, given={"case": quant_cases(), "seed": strategies.seeds},
          examples=pinned(zip(EXAMPLES, EXAMPLE_SEEDS)), dtypes=DTYPES, kills=(Kills(QT1_ZOO, (torch.float64,)),),
          coverage=contract.COVERAGE, require_coverage=True, applies=integer_only,
    test="test_qt1_within_half_step",
    doc="QT-1 for every implementation and dtype; the cases must reach every boundary class.", after=_record_worst,
    zoo_tests=("test_qt1_zoo_rejected",))


# -------------------------------------------------------------------------------------- QT-2
def law_idempotent(run, device, dtype, case, seed):
    """QT-2: with d = dequantize(quantize(w)), dequantize(quantize(d)) == d exactly. An example
    inside a verified declared scheme (``accepted_scheme``) is refused by the suite: the scheme's
    own step is not QT-2's, and QT-1's own-scale law judges it."""
    note(str(case))
    declared = accepted_scheme(run.impl, case)
    if declared is not None:
        with refusal(run, f"the suite, for {getattr(run.impl, 'name', run.impl)}"):
            raise NotImplementedError(f"differs by design: {declared} ({quantization_bounds.SCHEMES[declared]}), "
                                      "not the contract's absmax step that QT-2 states")
    check_qt2_idempotent(run.impl, make_weight(case, seed, dtype, device), case, run=run)


#: QT-2's law, for the absmax implementations (the claim's scheme), in float64 and float32.
QT2 = Law(claim="QT-2", technique=TECH, body=law_idempotent, given={"case": quant_cases(), "seed": strategies.seeds},
          examples=pinned(zip(EXAMPLES, EXAMPLE_SEEDS)), dtypes=(torch.float64, torch.float32),
          applies=lambda impl: integer_only(impl) or (None if symmetric(impl) or scheme(impl) else (
              "QT-2 is the absmax claim; round-to-nearest zero-point quantization with a rounded scale is not "
              "idempotent in general (test_qt2_zero_point_rounding_is_not_idempotent)")),
    test="test_qt2_idempotent",
    doc="""QT-2 for the absmax implementations (the claim's scheme); a zero-point scheme is skipped
    with the reason (see test_qt2_zero_point_rounding_is_not_idempotent).""")


# -------------------------------------------------------------------------------------- QT-9
def law_matmul(run, device, dtype, case, seed):
    """QT-9: matmul(x, qw) equals x @ dequantize(qw).T (tolerance rule ``quant-matmul``), for
    every scheme (integer, FP8, FP4: :func:`product_case`)."""
    case = product_case(run.impl, case)
    note(str(case))
    w = make_weight(case, seed, dtype, device, extreme=False)
    qw = quantize(run.impl, w, case, run=run)
    x = make_x(case, seed, dtype, device)
    with refusal(run, f"{getattr(run.impl, 'name', run.impl)} refuses matmul in {dtype} ({case})"):
        out = run.impl.matmul(x, qw)
    check_matmul(out, x, run.impl.dequantize(qw), case)


#: QT-9's law (its pinned launch cases in ``kernels.py``). A Triton kernel under the interpreter gets half the drawn
#: examples (the pinned ones always run).
QT9 = Law(
    claim="QT-9", technique="quantization", body=law_matmul,
    given={"case": quant_cases(), "seed": strategies.seeds}, examples=pinned(zip(EXAMPLES, EXAMPLE_SEEDS)),
    dtypes=DTYPES, kills=(Kills(("nibbles_swapped_in_matmul",), (torch.float64,)),),
    interpreted_examples=lambda n: max(5, n // 2), applies=integer_only,
    test="test_qt9_matmul_equals_dequantize_then_multiply",
    zoo_tests=("test_qt9_zoo_rejected",))


def _floating_only(impl) -> str | None:
    return None if number_format(impl) != "int" else "an integer scheme: QT9 (every dtype) judges its product"


#: QT-9's law for the FP8 and FP4 schemes: the same body and pinned cases (at the format's own
#: bits, the cancelling one-sign row included), in float32 and bfloat16 (as QT-11's and QT-13's
#: product laws before it; the Triton FP kernels have no float64 ``tl.dot``: in float64 they
#: refuse every example, which only costs draws).
QT9_FLOATING = dataclasses.replace(
    QT9, dtypes=(torch.float32, torch.bfloat16), applies=_floating_only,
    kills=(Kills(("nvfp4_bf16_weights_in_float32", "nvfp4_bf16_scales_in_float32"), (torch.float32,)),),
    test="test_qt9_fp8_fp4_matmul_equals_dequantize_then_multiply",
    zoo_tests=("test_qt9_narrowed_product_rejected",))


# ------------------------------------------------------------------- act-order (g_idx), QT-1/QT-9
#: Pinned act-order cases: groups of different magnitudes (and an all-zero one), so a column
#: dequantized with another group's scale shows; K // g = 4 and 3 groups, decode and tiled M;
#: the last two span several K tiles of the Triton kernels (test_act_order_examples_reach_both_launches):
#: K = 128 at M = 1 is two split-K ranges of the decode launch, K = 192 at M = 20 three K tiles
#: of the tiled launch, and the drawn g_idx moves columns between them.
ACT_ORDER_EXAMPLES = (QCase(3, 32, 4, 8, ("normal", "zero", "pos", "outlier"), M=5),
                      QCase(2, 48, 3, 16, ("normal", "neg", "normal"), M=17),
                      QCase(3, 128, 4, 16, ("normal", "zero", "outlier", "pos"), M=1),
                      QCase(2, 192, 3, 32, ("normal", "neg", "normal"), M=20))


def accepts_g_idx(impl) -> bool:
    """True when the implementation's quantize takes the optional ``g_idx`` keyword."""

    try:
        params = inspect.signature(impl.quantize).parameters
    except (TypeError, ValueError):
        return False
    return "g_idx" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def law_act_order_half_step(run, device, dtype, case, seed):
    """QT-1 under act-order: every element within half a step of its g_idx group."""
    g_idx = make_g_idx(case, seed, device)
    note(f"{case}, g_idx={g_idx.tolist()}")
    w = make_weight(case, seed, dtype, device)
    d = run.impl.dequantize(quantize(run.impl, w, case, g_idx, run=run))
    assert tuple(d.shape) == tuple(w.shape) and d.dtype == w.dtype, (tuple(d.shape), d.dtype)
    bound = quantization_bounds.half_step_bound(w, case.bits, case.granularity, symmetric(run.impl), g_idx=g_idx)
    check_within(d, w, bound, what=f"reconstruction of w under g_idx ({case})", rule="QT-1 half step per g_idx group").check()


def law_act_order_matmul(run, device, dtype, case, seed):
    """QT-9 under act-order: matmul(x, qw) equals x @ dequantize(qw).T."""
    g_idx = make_g_idx(case, seed, device)
    note(f"{case}, g_idx={g_idx.tolist()}")
    w = make_weight(case, seed, dtype, device, extreme=False)
    qw = quantize(run.impl, w, case, g_idx, run=run)
    x = make_x(case, seed, dtype, device)
    check_matmul(run.impl.matmul(x, qw), x, run.impl.dequantize(qw), case, what="matmul(x, qw) under g_idx")


def needs_g_idx(impl) -> str | None:
    """None, or why the act-order laws do not apply to ``impl``."""
    if not accepts_g_idx(impl):
        return f"{impl.name}'s quantize does not take the optional g_idx keyword (act-order)"
    return None


#: The act-order laws' pinned examples: ACT_ORDER_EXAMPLES, seeds 1, 2, ...
_ACT_ORDER_PINNED = pinned((c, i + 1) for i, c in enumerate(ACT_ORDER_EXAMPLES))
ACT_ORDER_QT1 = Law(claim="QT-1", technique=TECH, body=law_act_order_half_step,
                    given={"case": act_order_cases(), "seed": strategies.seeds}, examples=_ACT_ORDER_PINNED,
                    dtypes=(torch.float64, torch.bfloat16), kills=(Kills(ACT_ORDER_ZOO, (torch.float64,)),),
                    applies=needs_g_idx,
    test="test_act_order_within_half_step",
    zoo_tests=("test_act_order_zoo_rejected",))
ACT_ORDER_QT9 = Law(claim="QT-9", technique=TECH, body=law_act_order_matmul,
                    given={"case": act_order_cases(), "seed": strategies.seeds}, examples=_ACT_ORDER_PINNED,
                    dtypes=(torch.float32, torch.bfloat16),
                    kills=(Kills(ACT_ORDER_KERNEL_ZOO, (torch.float32,),
                                 doc="A Triton kernel that reads group k // g despite the g_idx: dequantize is "
                                     "right (QT-1 passes), the product is not."),),
                    interpreted_examples=lambda n: max(5, n // 2), applies=needs_g_idx,
    test="test_act_order_matmul",
    zoo_tests=("test_act_order_kernel_zoo_rejected",))
