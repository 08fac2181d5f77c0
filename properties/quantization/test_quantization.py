"""Laws of weight quantization (claims QT-1, QT-2, QT-9; lecture 001 §5.1–5.2), written against the
``quantization`` contract (``conformance/contracts/quantization.py``) and run over every
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

The methods and the model experiments (QT-3..QT-8) are in ``properties/quantization/test_quantization_methods.py``.

The known-bad implementations (``properties/quantization/zoo.py``) are each shown rejected, and
the pinned examples are shown to reach the boundary classes in every Hypothesis profile.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, note, settings
from hypothesis import strategies as st

from inference_conformance.conformance import results
from inference_conformance.conformance.contracts import quantization as contract, quantization_bounds
from inference_conformance.conformance.laws import Kills, Law, refusal
from inference_conformance.conformance.tolerance import check_close, check_within
from inference_conformance.properties import strategies as S
from inference_conformance.properties.quantization.claims_cases import check_qt2_idempotent, check_qt2_packing
from inference_conformance.properties.quantization.cases import (
    DTYPES,
    EXAMPLE_SEEDS,
    EXAMPLES,
    QT9,
    QT9_FLOATING,
    QCase,
    act_order_cases,
    check_matmul,
    make_g_idx,
    make_weight,
    make_x,
    pinned,
    quant_cases,
    integer_only,
    quantize,
    accepted_scheme,
    check_own_scale,
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
QT1 = Law(claim="QT-1", technique=TECH, body=law_half_step, given={"case": quant_cases(), "seed": S.seeds},
          examples=pinned(zip(EXAMPLES, EXAMPLE_SEEDS)), dtypes=DTYPES, kills=(Kills(QT1_ZOO, (torch.float64,)),),
          coverage=contract.COVERAGE, require_coverage=True, applies=integer_only)

test_qt1_within_half_step = QT1.conformance_test(
    "test_qt1_within_half_step",
    doc="QT-1 for every implementation and dtype; the cases must reach every boundary class.", after=_record_worst)
(test_qt1_zoo_rejected,) = QT1.make_zoo_tests("test_qt1_zoo_rejected")


@pytest.mark.claim("QT-1")
@pytest.mark.suite_own("the suite's pinned examples reach every boundary class")
def test_qt1_coverage_table():
    """The boundary classes each pinned example reaches (reported)."""
    QT1.record_pinned_coverage("every class is reached in every Hypothesis profile")


def test_qt1_bound_is_the_lecture_step():
    """The contract's step is the lecture's: s = max|w| / (2^(b-1) - 1) for absmax (0.323 at 4
    bits: 0.0461, exercise 6), (max - min) / (2^b - 1) with 0 in range for a zero point."""
    w = torch.tensor([[0.323, -0.1, 0.05, 0.0]], dtype=torch.float64)
    assert contract.step(w, 4, "tensor")[0, 0].item() == pytest.approx(0.323 / 7)
    assert contract.step(w, 4, "tensor", symmetric=False)[0, 0].item() == pytest.approx(0.423 / 15)
    pos = torch.tensor([[1.0, 2.0], [3.0, 0.5]], dtype=torch.float64)
    assert contract.step(pos, 2, "channel", symmetric=False)[:, 0].tolist() == pytest.approx([2 / 3, 1.0])
    assert contract.step(pos, 3, 1)[1].tolist() == pytest.approx([1.0, 0.5 / 3])


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
QT2 = Law(claim="QT-2", technique=TECH, body=law_idempotent, given={"case": quant_cases(), "seed": S.seeds},
          examples=pinned(zip(EXAMPLES, EXAMPLE_SEEDS)), dtypes=(torch.float64, torch.float32),
          applies=lambda impl: integer_only(impl) or (None if symmetric(impl) or scheme(impl) else (
              "QT-2 is the absmax claim; round-to-nearest zero-point quantization with a rounded scale is not "
              "idempotent in general (test_qt2_zero_point_rounding_is_not_idempotent)")))

test_qt2_idempotent = QT2.conformance_test(
    "test_qt2_idempotent",
    doc="""QT-2 for the absmax implementations (the claim's scheme); a zero-point scheme is skipped
    with the reason (see test_qt2_zero_point_rounding_is_not_idempotent).""")


@pytest.mark.claim("QT-2")
@pytest.mark.suite_own("the asymmetric scheme's arithmetic itself")
def test_qt2_zero_point_rounding_is_not_idempotent():
    """Why QT-2 is stated for absmax only: with a zero point, the group's extremes need not land
    on the end codes. w = [-0.128, 1.059] at 8 bits: s = 1.187 / 255 (rounded up to 16 bits),
    z = round(27.498) = 27, and 1.059 / s = 227.4996 rounds to 227, so the codes are 0 and 254,
    not 255: the dequantized group spans 254 steps, and quantizing it again picks another scale.
    (Absmax has no such gap: the largest |w| always lands on code ±(2^(b-1) - 1).)"""
    from inference_conformance.reference import quantization as ref

    w = torch.tensor([[-0.128, 1.059]], dtype=torch.float64)
    qw = ref.quantize(w, bits=8, granularity="channel", symmetric=False)
    assert ref.unpack(qw.codes, 8, 2).tolist() == [[0, 254]]
    d = ref.dequantize(qw)
    d2 = ref.dequantize(ref.quantize(d, bits=8, granularity="channel", symmetric=False))
    assert not torch.equal(d, d2)


@pytest.mark.claim("QT-2")
@settings(max_examples=20)
@given(bits=st.integers(2, 8), R=st.integers(1, 4), L=st.integers(1, 41), seed=S.seeds)
@pytest.mark.suite_own("the suite's int packing helpers")
def test_qt2_packing_round_trips(bits, R, L, seed):
    """unpack(pack(u)) == u for random codes, in the reference and in the packed layout the
    kernels read (bit for bit the same bytes)."""
    from inference_conformance.optimized.quantization import packing as quant_torch
    from inference_conformance.reference import quantization as ref

    g = torch.Generator().manual_seed(seed)
    u = torch.randint(0, 2 ** bits, (R, L), generator=g)
    p_ref = check_qt2_packing(ref.pack, ref.unpack, u, bits)
    check_qt2_packing(quant_torch.pack, quant_torch.unpack, u, bits, layout=ref.pack)
    assert p_ref.shape[1] == -(-L // ref.codes_per_byte(bits))


@pytest.mark.claim("QT-2")
@pytest.mark.suite_own("the suite's packing and zero-point probes (the tools QT-2 reads codes with)")
def test_qt2_packing_order_and_zero_point_probes():
    """The documented nibble order (pack 0..7 at 4 bits -> 0x10 0x32 0x54 0x76; 0..3 at 2 bits ->
    0xE4) round trips, for codes and for packed zero points; the zero-point convention (stored
    value = z): a symmetric 4-bit group with zero 8 and code 8 is exactly 0."""
    from inference_conformance.reference import quantization as ref

    probes = ref.probe_packing()
    for bits, (got, round_trip, as_documented) in probes.items():
        assert as_documented, f"{bits}-bit packing gave bytes {[hex(b) for b in got]}, not the documented order"
        assert round_trip, f"{bits}-bit unpack(pack(pattern)) differs from the pattern"
    assert ref.probe_zero_point() == 0.0
    # the packed zero points of a real quantization use the same order: groups of one sign at
    # 4 bits have zero points 0 (all >= 0) and 15 (all <= 0); packed, the first is the low nibble
    w = torch.tensor([[1.0, 2.0, -1.0, -2.0]], dtype=torch.float64)
    qw = ref.quantize(w, bits=4, granularity=2, symmetric=False)
    assert qw.zeros.tolist() == [[0x00 | (15 << 4)]]
    results.record("QT-2", measured=1, bound=1, unit="probes passed",
                   rule="documented packing order and zero-point convention")


# -------------------------------------------------------------------------------------- QT-9
test_qt9_matmul_equals_dequantize_then_multiply = QT9.conformance_test("test_qt9_matmul_equals_dequantize_then_multiply")
(test_qt9_zoo_rejected,) = QT9.make_zoo_tests("test_qt9_zoo_rejected")
test_qt9_fp8_fp4_matmul_equals_dequantize_then_multiply = QT9_FLOATING.conformance_test(
    "test_qt9_fp8_fp4_matmul_equals_dequantize_then_multiply")
(test_qt9_narrowed_product_rejected,) = QT9_FLOATING.make_zoo_tests("test_qt9_narrowed_product_rejected")


@pytest.mark.claim("QT-9")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_qt9_rule_rejects_zero_and_constant_outputs(dtype):
    """The quant-matmul rule is no bare atol: an all-zero or a constant output fails it."""
    from inference_conformance.reference import quantization as ref

    case = EXAMPLES[0]
    w = make_weight(case, 1, dtype, "cpu", extreme=False)
    qw = ref.quantize(w, bits=case.bits, granularity=case.granularity)
    x = make_x(case, 1, dtype, "cpu")
    d = ref.dequantize(qw)
    out_ref, out_pt = x.double() @ d.double().T, x @ d.T
    for bad in (torch.zeros_like(out_pt), torch.full_like(out_pt, float(out_ref.mean()))):
        assert not check_close(bad, out_ref, out_pt=out_pt, rule="quant-matmul").ok
    assert check_close(ref.matmul(x, qw), out_ref, out_pt=out_pt, rule="quant-matmul").ok
    results.recorder().reset()          # the failing comparisons above are the point, not this test's error
    results.record("QT-9", measured=2, bound=2, unit="bad outputs (all-zero, constant) the rule rejects",
                   rule="quant-matmul is no bare atol")


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
    import inspect

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


def _need_g_idx(impl) -> str | None:
    """None, or why the act-order laws do not apply to ``impl``."""
    if not accepts_g_idx(impl):
        return f"{impl.name}'s quantize does not take the optional g_idx keyword (act-order)"
    return None


#: The act-order laws' pinned examples: ACT_ORDER_EXAMPLES, seeds 1, 2, ...
_ACT_ORDER_PINNED = pinned((c, i + 1) for i, c in enumerate(ACT_ORDER_EXAMPLES))
ACT_ORDER_QT1 = Law(claim="QT-1", technique=TECH, body=law_act_order_half_step,
                    given={"case": act_order_cases(), "seed": S.seeds}, examples=_ACT_ORDER_PINNED,
                    dtypes=(torch.float64, torch.bfloat16), kills=(Kills(ACT_ORDER_ZOO, (torch.float64,)),),
                    applies=_need_g_idx)
ACT_ORDER_QT9 = Law(claim="QT-9", technique=TECH, body=law_act_order_matmul,
                    given={"case": act_order_cases(), "seed": S.seeds}, examples=_ACT_ORDER_PINNED,
                    dtypes=(torch.float32, torch.bfloat16),
                    kills=(Kills(ACT_ORDER_KERNEL_ZOO, (torch.float32,),
                                 doc="A Triton kernel that reads group k // g despite the g_idx: dequantize is "
                                     "right (QT-1 passes), the product is not."),),
                    interpreted_examples=lambda n: max(5, n // 2), applies=_need_g_idx)

test_act_order_within_half_step = ACT_ORDER_QT1.conformance_test("test_act_order_within_half_step")
test_act_order_matmul = ACT_ORDER_QT9.conformance_test("test_act_order_matmul")
(test_act_order_zoo_rejected,) = ACT_ORDER_QT1.make_zoo_tests("test_act_order_zoo_rejected")
(test_act_order_kernel_zoo_rejected,) = ACT_ORDER_QT9.make_zoo_tests("test_act_order_kernel_zoo_rejected")


def test_act_order_examples_reach_both_launches():
    """The pinned act-order examples (run in every profile) reach both Triton launches with a
    g_idx that moves columns across K tiles: the decode launch (M <= GEMV_MAX_M) over several
    split-K ranges and the tiled launch (M > GEMV_MAX_M) over several K tiles."""
    qm = pytest.importorskip("inference_conformance.optimized.quantization.quant_matmul")

    def crosses(case, i, tile):            # some group holds columns of two K tiles
        g_idx = make_g_idx(case, i + 1, "cpu")
        return any(len(set((torch.nonzero(g_idx == grp)[:, 0] // tile).tolist())) > 1
                   for grp in range(case.K // case.group_size))

    gemv = [c for i, c in enumerate(ACT_ORDER_EXAMPLES) if c.M <= qm.GEMV_MAX_M
            and qm.gemv_splits(c.N, c.K, torch.device("cpu"))[0] >= 2 and crosses(c, i, qm.GEMV_BLOCKS[1])]
    tiled = [c for i, c in enumerate(ACT_ORDER_EXAMPLES) if c.M > qm.GEMV_MAX_M
             and -(-c.K // qm._blocks(c.M)[2]) >= 2 and crosses(c, i, qm._blocks(c.M)[2])]
    assert gemv and tiled, f"decode launch over several K ranges: {gemv}; tiled over several K tiles: {tiled}"


def test_act_order_examples_are_not_the_identity():
    """The pinned act-order examples move columns between groups (else g_idx would test nothing)."""
    for i, case in enumerate(ACT_ORDER_EXAMPLES):
        g_idx = make_g_idx(case, i + 1, "cpu")
        assert not torch.equal(g_idx, torch.arange(case.K) // case.group_size), case


@pytest.mark.technique(TECH)
def test_act_order_invalid_g_idx_raises(impl, device):
    """A bad g_idx raises ValueError/TypeError naming it: wrong length, a group index out of
    range, groups of unequal size, a float tensor, with a named granularity."""
    if _need_g_idx(impl):
        pytest.skip(_need_g_idx(impl))
    w = S.randn((4, 8), 1, dtype=torch.float32, device=device)
    good = torch.tensor([1, 0, 0, 1, 1, 0, 1, 0], device=device)
    bad = {"wrong length": (good[:-1], 4), "index out of range": (good + 1, 4),
           "unequal groups": (torch.tensor([0, 0, 0, 0, 0, 1, 1, 1], device=device), 4),
           "float": (good.float(), 4), "named granularity": (good, "channel")}
    for what, (g_idx, gran) in bad.items():
        with pytest.raises((ValueError, TypeError), match="g_idx"):
            impl.quantize(w, bits=4, granularity=gran, g_idx=g_idx)
            pytest.fail(f"{impl.name} accepted a bad g_idx ({what})")
