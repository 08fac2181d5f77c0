"""Laws of weight quantization (claims QT-1, QT-2, QT-9; lecture 001 §5.1–5.2), written against the
``quantization`` contract (``conformance/contracts/quantization.py``) and run over every
registered implementation.

- QT-1: every element of dequantize(quantize(w)) lies within half a step of w, the step of its
  own group by the contract's formula (absmax or zero point), for 2..8 bits and every
  granularity, on weights with all-zero groups, one-sign groups, a single huge outlier,
  subnormal elements, odd shapes and several groups per row (``properties/quantization_cases.py``).
- QT-2: quantize(dequantize(.)) is idempotent, exactly (float32 and float64 outputs: the only
  formats that hold code x scale exactly), and packing round trips exactly.
- QT-9: matmul(x, qw) equals x @ dequantize(qw).T by the tolerance rule ``quant-matmul``.

The known-bad implementations (``properties/zoo_quantization.py``) are each shown rejected, and
the pinned examples are shown to reach the boundary classes in every Hypothesis profile.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, note, settings
from hypothesis import strategies as st

from conformance import results
from conformance.contracts import quantization as contract
from conformance.device import triton_interpreted
from conformance.tolerance import assert_exact, check_close, check_within
from conformance.zoo import expect_rejected
from properties import strategies as S
from properties.attention_cases import _Support, run_law
from properties.quantization_cases import (
    DTYPES,
    REQUIRED_CLASSES,
    QCase,
    boundary_classes,
    make_weight,
    make_x,
    quant_cases,
    quantize,
    symmetric,
)

TECH = "quantization"
QT1_ZOO = ("floor_not_round", "scale_pow2_clamped", "scales_wrong_groups", "zero_point_off_by_one",
           "zero_points_wrong_interleave")
QT9_ZOO = ("nibbles_swapped_in_matmul",)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

_SEEN: list[QCase] = []

#: Pinned: together they reject every zoo entry and reach every boundary class in every profile.
EXAMPLES = (
    QCase(3, 32, 4, 8, ("normal", "zero", "pos", "neg", "outlier", "subnormal"), M=5),   # kills all six
    QCase(5, 33, 8, "channel", ("normal", "outlier"), M=1),                             # int8 per channel, odd K
    QCase(4, 7, 2, "tensor", ("pos", "normal"), M=17),                                  # 2 bits per tensor, tiled
    QCase(2, 5, 3, 1, ("neg", "subnormal", "zero"), M=2),                               # a scale per element
    QCase(2, 64, 6, 16, ("subnormal", "neg", "pos"), M=16),
    QCase(6, 128, 8, 32, ("normal",), M=20),                                            # int8 groups
    QCase(4, 128, 4, 64, ("normal", "outlier"), M=1),                                   # int4 g64 decode
    QCase(3, 24, 5, 12, ("zero", "pos"), M=3),
    QCase(3, 4, 7, 2, ("subnormal", "outlier"), M=2),                                  # subnormal-only groups
    QCase(1, 2, 2, 1, ("normal",), M=1),                             # one row, a scale per element
    QCase(1, 43, 4, "tensor", ("pos",), M=1),       # one-sign weights: a product with heavy cancellation
)
#: The seed of each pinned example (the last one's seed 52 cancels heavily: bfloat16
#: tiles truncated instead of rounded, as Triton's interpreter casts, fail QT-9 there).
EXAMPLE_SEEDS = tuple(range(1, len(EXAMPLES))) + (52,)

#: Fewer drawn examples where a Triton kernel runs interpreted (the pinned ones always run).
FEW = settings(max_examples=max(5, settings.default.max_examples // 2)) if triton_interpreted() else settings()


def _examples(law):
    for case, seed in zip(EXAMPLES, EXAMPLE_SEEDS):
        law = example(case=case, seed=seed)(law)
    return law


# -------------------------------------------------------------------------------------- QT-1
@given(case=quant_cases(), seed=S.seeds)
@_examples
def law_half_step(impl, device, dtype, case, seed):
    """QT-1: |dequantize(quantize(w)) - w| <= s/2 elementwise, s the step of the element's group
    (the contract's ``half_step_bound``); output of w's shape, dtype and device."""
    _SEEN.append(case)
    note(str(case))
    w = make_weight(case, seed, dtype, device)
    qw = quantize(impl, w, case)
    d = impl.dequantize(qw)
    assert tuple(d.shape) == tuple(w.shape), f"dequantize returned {tuple(d.shape)}, w is {tuple(w.shape)}"
    assert d.dtype == w.dtype, f"dequantize returned {d.dtype}, w is {w.dtype}"
    assert d.device == w.device, f"dequantize returned a tensor on {d.device}, w is on {w.device}"
    bound = contract.half_step_bound(w, case.bits, case.granularity, symmetric(impl))
    check_within(d, w, bound, what=f"reconstruction of w ({case})", rule="QT-1 half step").check()


def _record_worst(claim: str, unit: str, rule: str) -> None:
    w = results.current.worst
    if w is not None:
        results.record(claim, measured=w.error, bound=w.bound, unit=unit, rule=rule)


@pytest.mark.technique(TECH)
@pytest.mark.claim("QT-1")
@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d).replace("torch.", "") for d in DTYPES])
def test_qt1_within_half_step(impl, device, dtype):
    """QT-1 for every implementation and dtype; the cases must reach every boundary class."""
    _SEEN.clear()
    run_law(law_half_step, impl, device, dtype)
    reached = set().union(*(boundary_classes(c) for c in _SEEN)) if _SEEN else set()
    missing = sorted(REQUIRED_CLASSES - reached)
    if not _Support.refused:
        assert not missing, f"the law's cases never reached {missing}"
    _record_worst("QT-1", "max |w - w_hat| / (s/2)",
                  "every element within half a step of its group (s/2 (1 + 2^-12) + half an ulp of the output)")


@pytest.mark.technique(TECH)
@pytest.mark.claim("QT-1")
@pytest.mark.kills(*QT1_ZOO)
def test_qt1_zoo_rejected(bad_impl, device):
    expect_rejected(law_half_step, bad_impl, device, torch.float64)


@pytest.mark.claim("QT-1")
def test_qt1_coverage_table():
    """The boundary classes each pinned example reaches (reported)."""
    table = {}
    for i, case in enumerate(EXAMPLES):
        for cls in boundary_classes(case):
            table.setdefault(cls, []).append(f"example {i}")
    missing = sorted(REQUIRED_CLASSES - set(table))
    results.record("QT-1", measured=len(REQUIRED_CLASSES) - len(missing), bound=len(REQUIRED_CLASSES),
                   unit="boundary classes reached by the pinned examples",
                   rule="every class is reached in every Hypothesis profile",
                   coverage={k: v for k, v in sorted(table.items())})
    assert not missing, f"pinned examples miss {missing}"


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
@given(case=quant_cases(), seed=S.seeds)
@_examples
def law_idempotent(impl, device, dtype, case, seed):
    """QT-2: with d = dequantize(quantize(w)), dequantize(quantize(d)) == d exactly."""
    note(str(case))
    w = make_weight(case, seed, dtype, device)
    d = impl.dequantize(quantize(impl, w, case))
    d2 = impl.dequantize(quantize(impl, d, case))
    assert_exact(d2, d, what=f"dequantize(quantize(d)) vs d ({case})")


@pytest.mark.technique(TECH)
@pytest.mark.claim("QT-2")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_qt2_idempotent(impl, device, dtype):
    """QT-2 for the absmax implementations (the claim's scheme); a zero-point scheme is skipped
    with the reason (see test_qt2_zero_point_rounding_is_not_idempotent)."""
    if not symmetric(impl):
        pytest.skip("QT-2 is the absmax claim; round-to-nearest zero-point quantization with a "
                    "rounded scale is not idempotent in general (test_qt2_zero_point_rounding_is_not_idempotent)")
    run_law(law_idempotent, impl, device, dtype)


@pytest.mark.claim("QT-2")
def test_qt2_zero_point_rounding_is_not_idempotent():
    """Why QT-2 is stated for absmax only: with a zero point, the group's extremes need not land
    on the end codes. w = [-0.128, 1.059] at 8 bits: s = 1.187 / 255 (rounded up to 16 bits),
    z = round(27.498) = 27, and 1.059 / s = 227.4996 rounds to 227, so the codes are 0 and 254,
    not 255: the dequantized group spans 254 steps, and quantizing it again picks another scale.
    (Absmax has no such gap: the largest |w| always lands on code ±(2^(b-1) - 1).)"""
    from reference import quantization as ref

    w = torch.tensor([[-0.128, 1.059]], dtype=torch.float64)
    qw = ref.quantize(w, bits=8, granularity="channel", symmetric=False)
    assert ref.unpack(qw.codes, 8, 2).tolist() == [[0, 254]]
    d = ref.dequantize(qw)
    d2 = ref.dequantize(ref.quantize(d, bits=8, granularity="channel", symmetric=False))
    assert not torch.equal(d, d2)


@pytest.mark.claim("QT-2")
@settings(max_examples=20)
@given(bits=st.integers(2, 8), R=st.integers(1, 4), L=st.integers(1, 41), seed=S.seeds)
def test_qt2_packing_round_trips(bits, R, L, seed):
    """unpack(pack(u)) == u for random codes, in the reference and in the packed layout the
    kernels read (bit for bit the same bytes)."""
    from optimized import quant_torch
    from reference import quantization as ref

    g = torch.Generator().manual_seed(seed)
    u = torch.randint(0, 2 ** bits, (R, L), generator=g)
    p_ref, p_opt = ref.pack(u, bits), quant_torch.pack(u, bits)
    assert_exact(p_opt, p_ref, what="packed bytes (optimized layout vs reference)")
    assert_exact(ref.unpack(p_ref, bits, L), u, what="reference unpack(pack(u))")
    assert_exact(quant_torch.unpack(p_opt, bits, L).to(torch.int64), u, what="optimized unpack(pack(u))")
    assert p_ref.shape[1] == -(-L // ref.codes_per_byte(bits))


@pytest.mark.claim("QT-2")
def test_qt2_packing_order_and_zero_point_probes():
    """The documented nibble order (pack 0..7 at 4 bits -> 0x10 0x32 0x54 0x76; 0..3 at 2 bits ->
    0xE4) round trips, for codes and for packed zero points; the zero-point convention (stored
    value = z): a symmetric 4-bit group with zero 8 and code 8 is exactly 0."""
    from reference import quantization as ref

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
def check_matmul(out, x, d, case, what="matmul(x, qw)"):
    """The tolerance policy's ``quant-matmul`` rule: out vs x @ d.T in float64 (out_ref), with the
    naive dequantize-then-multiply in x's dtype (out_pt)."""
    assert tuple(out.shape) == (case.M, case.N), f"matmul returned {tuple(out.shape)}, expected {(case.M, case.N)}"
    assert out.dtype == x.dtype, f"matmul returned {out.dtype}, x is {x.dtype}"
    out_ref = x.double() @ d.double().T
    out_pt = x @ d.T
    return check_close(out, out_ref, out_pt=out_pt, rule="quant-matmul", what=f"{what} ({case})").check()


@FEW
@given(case=quant_cases(), seed=S.seeds)
@_examples
def law_matmul(impl, device, dtype, case, seed):
    """QT-9: matmul(x, qw) equals x @ dequantize(qw).T (tolerance rule ``quant-matmul``)."""
    note(str(case))
    w = make_weight(case, seed, dtype, device, extreme=False)
    qw = quantize(impl, w, case)
    x = make_x(case, seed, dtype, device)
    check_matmul(impl.matmul(x, qw), x, impl.dequantize(qw), case)


@pytest.mark.technique(TECH)
@pytest.mark.claim("QT-9")
@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d).replace("torch.", "") for d in DTYPES])
def test_qt9_matmul_equals_dequantize_then_multiply(impl, device, dtype):
    run_law(law_matmul, impl, device, dtype)


@pytest.mark.technique(TECH)
@pytest.mark.claim("QT-9")
@pytest.mark.kills(*QT9_ZOO)
def test_qt9_zoo_rejected(bad_impl, device):
    expect_rejected(law_matmul, bad_impl, device, torch.float64)


@pytest.mark.claim("QT-9")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_qt9_rule_rejects_zero_and_constant_outputs(dtype):
    """The quant-matmul rule is no bare atol: an all-zero or a constant output fails it."""
    from reference import quantization as ref

    case = EXAMPLES[0]
    w = make_weight(case, 1, dtype, "cpu", extreme=False)
    qw = ref.quantize(w, bits=case.bits, granularity=case.granularity)
    x = make_x(case, 1, dtype, "cpu")
    d = ref.dequantize(qw)
    out_ref, out_pt = x.double() @ d.double().T, x @ d.T
    for bad in (torch.zeros_like(out_pt), torch.full_like(out_pt, float(out_ref.mean()))):
        assert not check_close(bad, out_ref, out_pt=out_pt, rule="quant-matmul").ok
    assert check_close(ref.matmul(x, qw), out_ref, out_pt=out_pt, rule="quant-matmul").ok
    results.current.reset()          # the failing comparisons above are the point, not this test's error
    results.record("QT-9", measured=2, bound=2, unit="bad outputs (all-zero, constant) the rule rejects",
                   rule="quant-matmul is no bare atol")


# ------------------------------------------------------------------------------- bad input
def _bad_calls(w, x, qw):
    return {
        "bits 1": lambda impl: impl.quantize(w, bits=1, granularity="channel"),
        "bits 9": lambda impl: impl.quantize(w, bits=9, granularity="channel"),
        "bits as a string": lambda impl: impl.quantize(w, bits="4", granularity="channel"),
        "bits True": lambda impl: impl.quantize(w, bits=True, granularity="channel"),
        "group size not dividing K": lambda impl: impl.quantize(w, bits=4, granularity=5),
        "group size 0": lambda impl: impl.quantize(w, bits=4, granularity=0),
        "unknown granularity": lambda impl: impl.quantize(w, bits=4, granularity="row"),
        "float granularity": lambda impl: impl.quantize(w, bits=4, granularity=4.0),
        "w 1-D": lambda impl: impl.quantize(w[0], bits=4, granularity="channel"),
        "w integer": lambda impl: impl.quantize(w.to(torch.int32), bits=4, granularity="channel"),
        "w not a tensor": lambda impl: impl.quantize(w.tolist(), bits=4, granularity="channel"),
        "w with NaN": lambda impl: impl.quantize(torch.where(w > 0, w, float("nan")), bits=4, granularity="channel"),
        "x with the wrong K": lambda impl: impl.matmul(x[:, :-1], qw(impl)),
        "x of another dtype": lambda impl: impl.matmul(x.double(), qw(impl)),
        "x 1-D": lambda impl: impl.matmul(x[0], qw(impl)),
        "qw not a quantized weight": lambda impl: impl.dequantize(w),
        "matmul of a raw weight": lambda impl: impl.matmul(x, w),
    }


@pytest.mark.technique(TECH)
def test_invalid_calls_raise(impl, device):
    """Every invalid call raises ValueError or TypeError (never NotImplementedError, never a
    result): bits outside 2..8, a group size that does not divide K, an unknown granularity, w of
    the wrong rank or dtype, x of the wrong K or dtype, a qw that is not a quantized weight."""
    w = S.randn((4, 8), 1, dtype=torch.float32, device=device)
    x = S.randn((3, 8), 2, dtype=torch.float32, device=device)
    cache = {}

    def qw(impl):
        if "qw" not in cache:
            cache["qw"] = impl.quantize(w, bits=4, granularity=4)
        return cache["qw"]

    for what, call in _bad_calls(w, x, qw).items():
        with pytest.raises((ValueError, TypeError)):
            call(impl)
            pytest.fail(f"{impl.name} accepted an invalid call ({what})")


# -------------------------------------------------------------------------------------- QT-7
def _smooth_product_law(migrate, x, w, alpha):
    """(x / s) @ (w * s).T equals x @ w.T by the float64 rule (exact class)."""
    xs, ws, _ = migrate(x, w, alpha)
    return check_close(xs @ ws.T, x @ w.T, what=f"smoothed product (alpha={alpha:g})").check()


def _migrate_wrong_axis(x, w, alpha):
    """A known-bad migration: the weight scaled along its output rows instead of its input columns."""
    from reference.quantization import smoothquant_scales

    s = smoothquant_scales(x, w, alpha)
    ws = w.clone()
    n = min(w.shape[0], s.shape[0])
    ws[:n] = w[:n] * s[:n, None]
    return x / s, ws, s


@pytest.mark.claim("QT-7")
@settings(max_examples=10)
@given(M=st.integers(1, 12), N=st.integers(1, 12), K=st.integers(2, 40), alpha=st.floats(0.0, 1.0),
       outlier=st.sampled_from([1.0, 100.0]), seed=S.seeds)
@example(M=8, N=6, K=16, alpha=0.5, outlier=100.0, seed=3)
def test_qt7_smoothquant_migration_keeps_the_product(M, N, K, alpha, outlier, seed):
    """QT-7: SmoothQuant's s_j = max|X_j|^alpha / max|W_j|^(1-alpha), x diag(s)^-1 · diag(s) w^T,
    leaves the float64 product unchanged (float64 rule, 1e-12 relative), with an outlier
    activation channel (x100, as QT-5 builds it); a wrong-axis migration is rejected."""
    from reference.quantization import smoothquant_migrate

    x = S.randn((M, K), seed)
    x[:, seed % K] *= outlier
    w = S.randn((N, K), seed + 1) * 0.07
    _smooth_product_law(smoothquant_migrate, x, w, alpha)
    if alpha > 0.05 and outlier > 1 and N > 1:
        with pytest.raises(AssertionError):
            _smooth_product_law(_migrate_wrong_axis, x, w, alpha)
        results.current.reset()


@pytest.mark.claim("QT-7")
def test_qt7_smoothing_flattens_the_outlier_channel():
    """At alpha = 0.5 the outlier channel's activation range shrinks to the geometric mean of
    the activation and weight ranges: the max / median channel ratio drops (the point of
    migrating), while the product stays equal (recorded)."""
    from reference.quantization import smoothquant_migrate

    x = S.randn((64, 32), 5)
    x[:, 5] *= 100.0
    w = S.randn((48, 32), 6) * 0.07
    xs, ws, s = smoothquant_migrate(x, w, 0.5)
    v = _smooth_product_law(smoothquant_migrate, x, w, 0.5)

    def ratio(t):
        m = t.abs().amax(dim=0)
        return float(m.max() / m.median())

    before, after = ratio(x), ratio(xs)
    assert after < before / 5, f"max/median activation channel ratio {before:.1f} -> {after:.1f}"
    rel = v.error / float((x @ w.T).abs().max())
    results.record("QT-7", measured=rel, bound=1e-12,
                   unit="max |(x/s)(w s)^T - x w^T| / max|x w^T|",
                   rule="float64 rule: product unchanged by the migration (the W8A8 NLL half of QT-7 is not measured)",
                   what=f"activation max/median channel ratio {before:.1f} -> {after:.1f} at alpha 0.5")


# -------------------------------------------------------------------------------------- QT-4
@pytest.mark.claim("QT-4")
def test_qt4_exercise6_step_and_snr():
    """Exercise 6 (lecture 001 §5.2): max|w| = 0.323, std 0.067, per-tensor 4 bits: s = 0.323 / 7
    ≈ 0.046 and, with rounding noise uniform on [-s/2, s/2] (variance s²/12), SNR = std² / (s²/12)
    ≈ 25 (14 dB); one outlier of 3.0 makes s = 3 / 7 ≈ 0.43 and SNR ≈ 0.3. Then the same on a
    weight drawn to those figures (65,536 N(0, 0.067²) values, the largest set to 0.323), quantized
    by the reference: the measured SNR matches the formula without the outlier; with it nearly
    every weight rounds to 0, so the noise is the weight itself and the measured SNR is about 1
    (0 dB), not 0.3: the uniform-noise model stops holding once s is several standard deviations."""
    import math

    from conformance.tolerance import assert_scalar
    from reference import quantization as ref

    std, wmax = 0.067, 0.323
    s = wmax / 7
    snr = std ** 2 / (s ** 2 / 12)
    s_out = 3.0 / 7
    snr_out = std ** 2 / (s_out ** 2 / 12)
    assert_scalar(s, 0.046, rel=0.01, what="step at 4 bits, per tensor")
    assert_scalar(snr, 25, rel=0.03, what="SNR (uniform rounding noise)")
    assert_scalar(10 * math.log10(snr), 14, rel=0.03, what="SNR in dB")
    assert_scalar(s_out, 0.43, rel=0.01, what="step with an outlier of 3.0")
    assert_scalar(snr_out, 0.3, rel=0.03, what="SNR with the outlier (formula)")

    w = S.randn((512, 128), 11) * std
    w.view(-1)[w.abs().argmax()] = wmax

    def measured_snr(w):
        d = ref.dequantize(ref.quantize(w, bits=4, granularity="tensor"))
        return float(w.var() / ((w - d) ** 2).mean())

    snr_w = measured_snr(w)
    w_out = w.clone()
    w_out[0, 0] = 3.0
    snr_w_out = measured_snr(w_out)
    assert abs(snr_w / snr - 1) < 0.1, f"measured SNR {snr_w:.2f} vs the formula's {snr:.2f}"
    assert 0.8 < snr_w_out < 1.3, f"with the outlier the measured SNR is {snr_w_out:.2f}"
    results.current.reset()
    results.record("QT-4", measured=round(snr, 2), lecture="s ≈ 0.046, SNR ≈ 25 (14 dB); outlier: s ≈ 0.43, SNR ≈ 0.3",
                   unit="SNR (formula std² / (s²/12))",
                   rule="exercise 6 recomputed: s = 0.0461, SNR 25.3 (14.0 dB); outlier: s = 0.429, SNR 0.29",
                   what=(f"measured on a drawn weight by the reference quantizer: SNR {snr_w:.1f}; with the "
                         f"outlier {snr_w_out:.2f} (the uniform-noise formula's 0.29 does not hold there)"))


# -------------------------------------------------------------------------------------- QT-5
@pytest.mark.claim("QT-5")
def test_qt5_outlier_construction_keeps_the_function():
    """QT-5 on the shipped target model in float64: channel 5 of every block's norms x100 and the
    matching input columns of the next Linear layers /100 leave the logits equal (float64 rule)
    and the test NLL unchanged, while the first block's normalized activations get an outlier
    channel (its max |value| far above every other channel's; lecture: 286.0 vs 4.6, median 2.8)."""
    from reference.quantization import make_outlier_channel
    from smallworld import checkpoints, data

    model = checkpoints.load_model("target", dtype=torch.float64)
    outl = make_outlier_channel(model, channel=5, factor=100.0)
    docs = data.split("test", data.TEST_SUBSET)
    inputs, _ = data.pad_batch(data.encode(docs[:16]))
    with torch.no_grad():
        check_close(outl(inputs), model(inputs), what="logits after the outlier construction").check()
    nll, nll_outl = data.nll(model, docs), data.nll(outl, docs)
    assert abs(nll_outl - nll) <= 1e-9 * nll, f"NLL {nll} -> {nll_outl}"

    seen = []
    hook = outl.blocks[0].attn_norm.register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    with torch.no_grad():
        outl(inputs)
    hook.remove()
    per_channel = seen[0].abs().amax(dim=(0, 1))                       # (d_model,)
    top2 = per_channel.topk(2).values.tolist()
    median = float(per_channel.median())
    assert int(per_channel.argmax()) == 5 and top2[0] > 20 * top2[1], (top2, median)
    results.record("QT-5", measured=round(top2[0], 1), lecture="NLL 1.3481 unchanged; channel max 286.0, next 4.6, median 2.8",
                   unit="max |activation| of the outlier channel (first block's norm output)",
                   rule="logits equal by the float64 rule; NLL equal to 1e-9",
                   what=(f"target model, {data.TEST_SUBSET} test documents: NLL {nll:.4f} -> {nll_outl:.4f}; channel "
                         f"max {top2[0]:.1f}, next {top2[1]:.2f}, median {median:.2f}"))


# -------------------------------------------------------------------------------------- QT-3
QT3_BITS = (8, 6, 4, 3, 2)
QT3_GRANULARITIES = ("tensor", "channel", 128, 32)


@pytest.mark.claim("QT-3")
def test_qt3_nll_vs_bits_and_granularity():
    """QT-3 on the shipped target model (float32, the first 64 test documents), weight-only
    round-to-nearest absmax on every block Linear (groups padded with zero columns where they do
    not divide K = 328), bits {8, 6, 4, 3, 2} x granularity {tensor, channel, group 128, group 32}.
    The lecture's statements, as rules on the relative NLL increase: 8 and 4 bits almost lossless
    (<= 1% at every granularity), 3 bits lose a little (the worst granularity loses more than 1%,
    at most 10%), 2 bits per tensor collapse (>= +50%) while groups of 32 stay usable (<= +5%);
    a 16-bit scale per group of 32 costs 0.5 extra bits per value. Every (bits, granularity) NLL
    is recorded for the report's plot."""
    from optimized import quant_torch
    from reference.quantization import bits_per_value, quantize_model_weights
    from smallworld import checkpoints, data

    model = checkpoints.load_model("target", dtype=torch.float32)
    docs = data.split("test", data.TEST_SUBSET)
    base = data.nll(model, docs)

    def qd(w, bits, granularity):
        return quant_torch.dequantize(quant_torch.quantize(w, bits=bits, granularity=granularity))

    loss = {}
    for bits in QT3_BITS:
        for gran in QT3_GRANULARITIES:
            nll = data.nll(quantize_model_weights(model, qd, bits=bits, granularity=gran), docs)
            loss[bits, gran] = nll / base - 1
            results.record("QT-3", measured=round(nll, 4), lecture="8/4 bits almost lossless; 3 bits lose a little; "
                           "2 bits per tensor collapse, small groups usable", unit="test NLL (nats/token)",
                           rule=f"weight-only RTN absmax, {bits} bits, granularity {gran}; unquantized {base:.4f}",
                           bits=bits, nll=nll, granularity=gran, implementation="torch",
                           bits_per_value=bits_per_value(bits, gran, 328, 128))
    table = {f"{b}/{g}": f"{100 * v:+.2f}%" for (b, g), v in loss.items()}

    assert max(loss[8, g] for g in QT3_GRANULARITIES) <= 0.01, table
    assert max(loss[4, g] for g in QT3_GRANULARITIES) <= 0.01, table
    assert 0.01 < max(loss[3, g] for g in QT3_GRANULARITIES) <= 0.10, table
    assert loss[2, "tensor"] >= 0.5 and loss[2, 32] <= 0.05, table
    assert bits_per_value(4, 32, 328, 128) - 4 == 0.5


# ------------------------------------------------------------------------------ QT-6, QT-7
@pytest.mark.claim("QT-6", "QT-7")
def test_qt6_qt7_activation_quantization_with_an_outlier_channel():
    """QT-6 and QT-7's second half on the target model with QT-5's outlier channel (float32, the
    first 32 test documents): W8A8 (weights per channel at 8 bits, activations dynamic per tensor
    or per token) at 8 and 6 activation bits; the lecture's statements as rules: per-tensor and
    per-token activation quantization collapse at 6 bits (NLL >= +20%); LLM.int8()'s
    decomposition (input columns above 6.0 kept in float) recovers fully (<= +0.5%); after
    SmoothQuant (alpha 0.5, 16 validation documents for calibration) W8A8 per token at 8 bits
    keeps the NLL (<= +0.5%), and so does 6 bits per tensor, which collapsed without it."""
    from reference.quantization import make_outlier_channel, smoothquant_model, w8a8_model
    from smallworld import checkpoints, data

    model = checkpoints.load_model("target", dtype=torch.float32)
    outl = make_outlier_channel(model)
    docs = data.split("test", 32)
    cal, _ = data.pad_batch(data.encode(data.split("val", 16)))
    smooth = smoothquant_model(outl, cal, alpha=0.5)
    base = data.nll(model, docs)
    nll = {}
    with torch.no_grad():
        for bits in (8, 6):
            for g in ("tensor", "token"):
                nll[f"W8A{bits} per {g}"] = data.nll(w8a8_model(outl, act_bits=bits, act_granularity=g), docs)
        nll["LLM.int8()"] = data.nll(w8a8_model(outl, int8_decomposition=True), docs)
        nll["SmoothQuant W8A8 per token"] = data.nll(w8a8_model(smooth, act_bits=8, act_granularity="token"), docs)
        nll["SmoothQuant W8A6 per tensor"] = data.nll(w8a8_model(smooth, act_bits=6, act_granularity="tensor"), docs)
    rel = {k: v / base - 1 for k, v in nll.items()}
    for k, v in nll.items():
        claim = "QT-7" if k.startswith("SmoothQuant") else "QT-6"
        results.record(claim, measured=round(v, 4), unit="test NLL (nats/token), outlier model",
                       lecture="collapse at 6 bits; LLM.int8() recovers fully" if claim == "QT-6" else "W8A8 after smoothing keeps NLL",
                       rule=f"{k}; unquantized {base:.4f} ({100 * rel[k]:+.2f}%)", nll=v)
    table = {k: f"{100 * v:+.2f}%" for k, v in rel.items()}
    assert rel["W8A6 per tensor"] >= 0.2 and rel["W8A6 per token"] >= 0.2, table
    assert abs(rel["LLM.int8()"]) <= 0.005, table
    assert abs(rel["SmoothQuant W8A8 per token"]) <= 0.005, table
    assert abs(rel["SmoothQuant W8A6 per tensor"]) <= 0.005, table


# -------------------------------------------------------------------------------------- QT-8
@pytest.mark.claim("QT-8")
def test_qt8_gptq_and_awq_no_worse_than_rtn_on_calibration():
    """QT-8 on the target model's layers (float64): for wq and w_up (groups of 32) and w_down
    (per channel, K = 328) of every block, at 4 and 3 bits, with calibration inputs from 16
    validation documents (each layer's own inputs), GPTQ's error-compensated rounding and AWQ's
    activation-aware scaling reconstruct the layer's output X W^T on the calibration set with
    a squared error no larger than round-to-nearest's at the same bits and groups."""
    from reference.quantization import awq, gptq, rtn_absmax
    from smallworld import checkpoints, data

    model = checkpoints.load_model("target", dtype=torch.float64)
    cal, _ = data.pad_batch(data.encode(data.split("val", 16)))
    layers, seen, hooks = {}, {}, []
    for i, b in enumerate(model.blocks):
        for name, lin in (("wq", b.attn.wq), ("w_up", b.mlp.w_up), ("w_down", b.mlp.w_down)):
            layers[i, name] = lin
            hooks.append(lin.register_forward_pre_hook(
                lambda m, a, key=(i, name): seen.__setitem__(key, a[0].detach().reshape(-1, a[0].shape[-1]))))
    with torch.no_grad():
        model(cal)
    for h in hooks:
        h.remove()
    ratios = {}
    for key, lin in layers.items():
        X, w = seen[key], lin.weight.detach()
        ref_out = X @ w.T
        g = 32 if w.shape[1] % 32 == 0 else w.shape[1]
        for bits in (4, 3):
            def err(wq):
                return float(((X @ wq.T - ref_out) ** 2).sum())
            e_rtn = err(rtn_absmax(w, bits, g))
            ratios[f"block{key[0]}.{key[1]} {bits}b"] = (err(gptq(w, X, bits, g)) / e_rtn, err(awq(w, X, bits, g)) / e_rtn)
    worst_gptq = max(r[0] for r in ratios.values())
    worst_awq = max(r[1] for r in ratios.values())
    for method, worst, median in (("GPTQ", worst_gptq, sorted(r[0] for r in ratios.values())[len(ratios) // 2]),
                                  ("AWQ", worst_awq, sorted(r[1] for r in ratios.values())[len(ratios) // 2])):
        results.record("QT-8", measured=round(worst, 3), bound=1.0, lecture=f"{method} no worse than round-to-nearest",
                       unit=f"{method} / RTN squared output error on the calibration set (worst of {len(ratios)} layers x bits)",
                       rule="<= 1 for every layer and bit width", what=f"{method} median ratio {median:.3f}")
    assert worst_gptq <= 1.0 and worst_awq <= 1.0, ratios
