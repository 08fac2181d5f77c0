"""Tests of weight quantization beside its laws (claims QT-1, QT-2, QT-9; lecture 001 §5.1–5.2;
the laws, what they check and their zoo tests in ``laws/integer.py``): the coverage table of QT-1's
pinned examples, the lecture's step, QT-2's zero-point counterexample and packing probes, QT-9's
rule against zero and constant outputs, and the act-order examples and bad ``g_idx`` calls. The
methods and the model experiments (QT-3..QT-8) are in ``test_quantization_methods.py``.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_conformance.conformance import results
from inference_conformance.conformance.contracts import quantization as contract
from inference_conformance.conformance.tolerance import check_close
from inference_conformance.properties import strategies
from inference_conformance.properties.quantization.claims_cases import check_qt2_packing
from inference_conformance.properties.quantization.laws.integer import (
    ACT_ORDER_EXAMPLES,
    QT1,
    needs_g_idx,
)
from inference_conformance.properties.quantization.cases import (
    EXAMPLES,
    make_g_idx,
    make_weight,
    make_x,
)

TECH = "quantization"

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# -------------------------------------------------------------------------------------- QT-1
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
@given(bits=st.integers(2, 8), R=st.integers(1, 4), L=st.integers(1, 41), seed=strategies.seeds)
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
    if needs_g_idx(impl):
        pytest.skip(needs_g_idx(impl))
    w = strategies.randn((4, 8), 1, dtype=torch.float32, device=device)
    good = torch.tensor([1, 0, 0, 1, 1, 0, 1, 0], device=device)
    bad = {"wrong length": (good[:-1], 4), "index out of range": (good + 1, 4),
           "unequal groups": (torch.tensor([0, 0, 0, 0, 0, 1, 1, 1], device=device), 4),
           "float": (good.float(), 4), "named granularity": (good, "channel")}
    for what, (g_idx, gran) in bad.items():
        with pytest.raises((ValueError, TypeError), match="g_idx"):
            impl.quantize(w, bits=4, granularity=gran, g_idx=g_idx)
            pytest.fail(f"{impl.name} accepted a bad g_idx ({what})")
