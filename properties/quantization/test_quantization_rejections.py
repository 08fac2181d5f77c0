"""The checks of QT-2..QT-8 (properties/quantization/claims_cases.py) and QT-10's trend rule
(conformance/trends.py) reject known-bad inputs: each test feeds the claim's own check the
suite's implementation, formula, model or figures (they must pass) and one with a bug a real
implementer could make (it must fail, by the check's own message).

Where the claim's measurement is an expensive model experiment (QT-3, QT-6, QT-7's NLL half)
the good input is the table that experiment recorded (``QT3_RECORDED``, ``QT67_RECORDED``: the
same form the experiment hands the check) and the bad one is measured here cheaply, or is the
table a named bug produces; QT-8's layer rule is measured here on the first block only.
"""
from __future__ import annotations

import copy
import math
from functools import partial

import pytest
import torch

from inference_conformance.conformance import trends
from inference_conformance.properties import strategies
from inference_conformance.properties.falsify import judges, rejects
from inference_conformance.properties.quantization.claims_cases import (
    QT3_RECORDED,
    QT3_RECORDED_BASE,
    QT8_NLL_HESSIAN_PERMUTED,
    QT8_NLL_RECORDED,
    QT8_RECORDED_BASE,
    QT67_RECORDED,
    check_qt2_idempotent,
    check_qt2_packing,
    check_qt3,
    check_qt4,
    check_qt4_measured,
    check_qt5,
    check_qt6,
    check_qt7_migration,
    check_qt7_w8a8,
    check_qt8_layers,
    check_qt8_nll,
    gptq_hessian_permuted,
    qt4_measured_snr,
    qt4_snr,
    qt4_weights,
    qt8_quantize,
    qt8_ratios,
    qt4_step,
)
from inference_conformance.properties.quantization.cases import QCase, make_weight
from inference_conformance.reference import quantization as ref
from inference_conformance.reference.quantization.methods import bits_per_value

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# -------------------------------------------------------------------------------------- QT-2
@pytest.mark.claim("QT-2")
def test_qt2_rejects_requantization_that_drifts():
    """The zoo's ``scale_pow2_clamped`` (s = max|w| / 2^(b-1), codes clamped to ±(2^(b-1) - 1)):
    the largest |d| lands one step below max|w|, so quantizing d again picks a smaller scale and
    the codes drift; the suite's absmax quantizer is idempotent on the same weight."""
    from inference_conformance.optimized import quantization as quant_torch
    from inference_conformance.properties.quantization.zoo import scale_pow2_clamped

    case = QCase(4, 32, 4, 8, ("normal", "outlier", "pos", "neg"))
    w = make_weight(case, 3, torch.float64, "cpu")
    rejects("QT-2", check_qt2_idempotent, (quant_torch.SYMMETRIC, w, case), (scale_pow2_clamped, w, case),
            match=r"QT-2: dequantize\(quantize\(d\)\) vs d, idempotence .* EXCEEDS")


def pack_high_first(u: torch.Tensor, bits: int) -> torch.Tensor:
    """A 4-bit pack that writes the first code of each byte in the high nibble (the reference's
    unpack reads it from the low one)."""
    return ref.pack(u.reshape(u.shape[0], -1, 2).flip(-1).reshape(u.shape), bits)


def unpack_signed_bytes(packed: torch.Tensor, bits: int, L: int) -> torch.Tensor:
    """A 4-bit unpack that reads the bytes as int8: the high nibble's arithmetic shift
    sign-extends, so codes 8..15 there come back as -8..-1."""
    p = packed.to(torch.int8).to(torch.int64)
    return torch.stack((p & 0xF, p >> 4), dim=-1).reshape(packed.shape[0], -1)[:, :L]


@pytest.mark.claim("QT-2")
@pytest.mark.parametrize("pack,unpack", [(pack_high_first, ref.unpack), (ref.pack, unpack_signed_bytes)],
                         ids=["nibbles_swapped", "sign_extended"])
def test_qt2_rejects_packing_that_does_not_round_trip(pack, unpack):
    """All 16 4-bit codes in every position: the reference pair round-trips; a pack writing the
    first code high, or an unpack sign-extending the high nibble, does not."""
    u = torch.arange(16).repeat(3, 2)
    rejects("QT-2", check_qt2_packing, (ref.pack, ref.unpack, u, 4), (pack, unpack, u, 4),
            match=r"QT-2: 4-bit unpack\(pack\(u\)\) vs u, packing round trip")


# -------------------------------------------------------------------------------------- QT-3
@pytest.mark.claim("QT-3")
def test_qt3_rejects_a_quantizer_that_drops_the_bits():
    """The recorded NLL table passes; the table a quantizer that ignores its bits argument
    (always 8 bits) produces, every row the 8-bit one, shows no loss at 3 bits and no collapse."""
    dropped = {(b, g): QT3_RECORDED[8, g] for b, g in QT3_RECORDED}
    rejects("QT-3", check_qt3, (QT3_RECORDED, QT3_RECORDED_BASE), (dropped, QT3_RECORDED_BASE),
            match=r"QT-3: 3 bits lose \+0\.00% NLL .* not 'a little'")


@pytest.mark.claim("QT-3")
def test_qt3_rejects_scale_bits_counted_at_8():
    """Storage counted with an 8-bit scale per group (a 16-bit scale is the claim's): 0.25 extra
    bits per value at groups of 32, not 0.5."""
    rejects("QT-3", check_qt3, (QT3_RECORDED, QT3_RECORDED_BASE),
            (QT3_RECORDED, QT3_RECORDED_BASE, partial(bits_per_value, scale_bits=8)),
            match=r"QT-3: a scale per group of 32 costs 0.25 extra bits")


# -------------------------------------------------------------------------------------- QT-4
@pytest.mark.claim("QT-4")
def test_qt4_rejects_step_over_two_to_the_b_minus_one():
    """s = max|w| / 2^(b-1) (8 at 4 bits, the asymmetric range's half) instead of 2^(b-1) - 1:
    s = 0.040, off the lecture's 0.046."""
    rejects("QT-4", check_qt4, (qt4_step, qt4_snr), (lambda wmax, bits: wmax / 2 ** (bits - 1), qt4_snr),
            match=r"QT-4: step at 4 bits, per tensor .* EXCEEDS")


@pytest.mark.claim("QT-4")
def test_qt4_rejects_snr_in_db_where_a_ratio_is_due():
    """The SNR returned in dB (14.0) where the exercise's 25 is a power ratio."""
    rejects("QT-4", check_qt4, (qt4_step, qt4_snr), (qt4_step, lambda std, s: 10 * math.log10(qt4_snr(std, s))),
            match=r"QT-4: SNR, uniform rounding noise .* EXCEEDS")


def snr_amplitude(w: torch.Tensor) -> float:
    """The measured SNR as an amplitude ratio, std(w) / rms(w - w_hat): the square root of the
    power ratio the exercise's 25 is."""
    from inference_conformance.reference import quantization as ref

    d = ref.dequantize(ref.quantize(w, bits=4, granularity="tensor"))
    return float(w.std() / ((w - d) ** 2).mean().sqrt())


@pytest.mark.claim("QT-4")
def test_qt4_rejects_a_measured_snr_of_amplitudes():
    """Exercise 6's drawn weight (65,536 values): the power ratio matches the formula's 25.3;
    the amplitude ratio (about 5) does not."""
    w, w_out = qt4_weights()
    snr = check_qt4()["snr"]
    rejects("QT-4", check_qt4_measured, (qt4_measured_snr(w), snr, qt4_measured_snr(w_out)),
            (snr_amplitude(w), snr, snr_amplitude(w_out)), match=r"QT-4: measured SNR \d\.\d+ not within 10%")


# -------------------------------------------------------------------------------------- QT-5
def outlier_column_multiplied(model, channel: int = 5, factor: float = 100.0):
    """QT-5's construction with the next Linear's input column multiplied by the factor instead
    of divided: the channel grows by factor² through the layer, the function changes."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for block in out.blocks:
            block.attn_norm.weight[channel] *= factor
            block.mlp_norm.weight[channel] *= factor
            for lin in (block.attn.wq, block.attn.wk, block.attn.wv, block.mlp.w_gate, block.mlp.w_up):
                lin.weight[:, channel] *= factor
    return out


@pytest.mark.claim("QT-5")
def test_qt5_rejects_the_column_multiplied_instead_of_divided():
    """The shipped target model (float64, 8 test documents, logits on 4): the suite's
    construction keeps the function and makes the outlier; the column multiplied does not."""
    from inference_conformance.reference.quantization.methods import make_outlier_channel
    from inference_conformance.smallworld import checkpoints, data

    model = checkpoints.load_model("target", dtype=torch.float64)
    docs = data.split("test", 8)
    inputs, _ = data.pad_batch(data.encode(docs[:4]))
    rejects("QT-5", check_qt5, (model, make_outlier_channel(model), docs, inputs),
            (model, outlier_column_multiplied(model), docs, inputs),
            match=r"QT-5: logits after the outlier construction: .* EXCEEDS")


# ------------------------------------------------------------------------------- QT-6, QT-7
def llm_int8_mask_from_weights(x: torch.Tensor, w: torch.Tensor, threshold: float = 6.0, bits: int = 8):
    """LLM.int8() with the outlier columns picked from the weight's max |w| (no weight exceeds
    6.0) instead of the activations': no column is kept in float, all are quantized."""
    from inference_conformance.reference.quantization.methods import fake_quantize_activations, fake_quantize_weight

    outlier = w.detach().abs().amax(dim=0) > threshold
    regular = ~outlier
    out = fake_quantize_activations(x[..., regular], bits, "token") @ fake_quantize_weight(w[:, regular], bits).T
    return out + x[..., outlier] @ w[:, outlier].T if bool(outlier.any()) else out


@pytest.mark.claim("QT-6")
def test_qt6_rejects_a_decomposition_that_keeps_the_wrong_columns():
    """The recorded table passes; LLM.int8() at 6 activation bits with its outlier columns
    chosen by the weights (measured here, the target model with QT-5's outlier, 32 test
    documents as the experiment) keeps none, and collapses as plain per-token W8A6 does."""
    from inference_conformance.reference.quantization.methods import block_linears, make_outlier_channel
    from inference_conformance.smallworld import checkpoints, data

    model = checkpoints.load_model("target", dtype=torch.float32)
    bad_model = copy.deepcopy(make_outlier_channel(model))
    for lin in block_linears(bad_model):
        lin.forward = (lambda x, w=lin.weight.detach().clone(): llm_int8_mask_from_weights(x, w, 6.0, 6))
    docs = data.split("test", 32)
    with torch.no_grad():
        rel = data.nll(bad_model, docs) / data.nll(model, docs) - 1
    rejects("QT-6", check_qt6, (QT67_RECORDED,), ({**QT67_RECORDED, "LLM.int8() at 6 bits": rel},),
            match=r"QT-6: LLM.int8\(\) at 6 bits changes the NLL by \+\d+\.\d+%: no full recovery")


def migrate_exponents_swapped(x: torch.Tensor, w: torch.Tensor, alpha: float):
    """SmoothQuant with s_j = max|W_j|^alpha / max|X_j|^(1-alpha) (the exponents' operands
    swapped): the product still holds, but the outlier channel is multiplied, not divided."""
    ax, aw = x.double().abs().amax(dim=0), w.double().abs().amax(dim=0)
    s = aw ** alpha / ax ** (1 - alpha)
    return x.double() / s, w.double() * s, s


def migrate_wrong_axis(x: torch.Tensor, w: torch.Tensor, alpha: float):
    """SmoothQuant's scales applied to the weight's output rows instead of its input columns."""
    from inference_conformance.reference.quantization.methods import smoothquant_scales

    s = smoothquant_scales(x, w, alpha)
    ws = w.double().clone()
    n = min(w.shape[0], s.shape[0])
    ws[:n] = ws[:n] * s[:n, None]
    return x.double() / s, ws, s


@pytest.mark.claim("QT-7")
@pytest.mark.parametrize("bad,match", [(migrate_exponents_swapped, r"QT-7: max/median activation channel ratio .* "
                                                                    r"not flattened"),
                                       (migrate_wrong_axis, r"QT-7: smoothed product \(alpha=0.5\): .* EXCEEDS")],
                         ids=["exponents_swapped", "wrong_axis"])
def test_qt7_rejects_a_migration_with_one_bug(bad, match):
    """The flattening test's input (64 x 32 activations, channel 5 x100, a 48 x 32 weight):
    the suite's migration keeps the product and flattens the channel; swapped exponents keep the
    product (any s does) but grow the outlier; the wrong axis changes the product."""
    from inference_conformance.reference.quantization.methods import smoothquant_migrate

    x = strategies.randn((64, 32), 5)
    x[:, 5] *= 100.0
    w = strategies.randn((48, 32), 6) * 0.07
    rejects("QT-7", check_qt7_migration, (smoothquant_migrate, x, w, 0.5), (bad, x, w, 0.5), match=match)


@pytest.mark.claim("QT-7")
def test_qt7_rejects_smoothing_not_folded_into_the_norm():
    """The recorded table passes; SmoothQuant with its scales multiplied into the Linear layers'
    columns but the 1/s never folded into the norms (measured here on the outlier model, alpha
    0.5, 16 validation documents to calibrate, 32 test documents, W8A8 per token) changes the
    function, and the NLL with it."""
    from inference_conformance.reference.quantization.methods import make_outlier_channel, smoothquant_model, w8a8_model
    from inference_conformance.smallworld import checkpoints, data

    model = checkpoints.load_model("target", dtype=torch.float32)
    outl = make_outlier_channel(model)
    cal, _ = data.pad_batch(data.encode(data.split("val", 16)))
    unfolded = smoothquant_model(outl, cal, alpha=0.5)
    with torch.no_grad():
        for b, b0 in zip(unfolded.blocks, outl.blocks):
            b.attn_norm.weight.copy_(b0.attn_norm.weight)
            b.mlp_norm.weight.copy_(b0.mlp_norm.weight)
    docs = data.split("test", 32)
    with torch.no_grad():
        rel = data.nll(w8a8_model(unfolded, act_bits=8, act_granularity="token"), docs) / data.nll(model, docs) - 1
    rejects("QT-7", check_qt7_w8a8, (QT67_RECORDED,), ({**QT67_RECORDED, "SmoothQuant W8A8 per token": rel},),
            match=r"QT-7: SmoothQuant W8A8 per token changes the NLL by \+\d+\.\d+%, not kept")


# -------------------------------------------------------------------------------------- QT-8
@pytest.fixture(scope="module")
def first_block():
    """The first block's seven Linear weights of the float64 target model, their inputs on 8
    validation documents (calibration) and on 16 others (held out)."""
    from inference_conformance.reference.quantization.methods import linear_inputs, named_block_linears
    from inference_conformance.smallworld import checkpoints, data

    model = checkpoints.load_model("target", dtype=torch.float64)
    val = data.split("val", 32)
    X = linear_inputs(model, data.pad_batch(data.encode(val[:8]))[0])
    H = linear_inputs(model, data.pad_batch(data.encode(val[16:32]))[0])
    weights = {key: lin.weight.detach() for key, lin in named_block_linears(model) if key[0] == 0}
    return weights, X, H


def _block_ratios(first_block, methods: dict) -> dict:
    from inference_conformance.reference.quantization.methods import rtn_absmax

    weights, X, H = first_block
    return qt8_ratios(qt8_quantize(weights, X, {"RTN": lambda w, x, b, g: rtn_absmax(w, b, g), **methods}, bits=(4,)),
                      weights, H)


@pytest.mark.claim("QT-8")
def test_qt8_rejects_awq_with_random_scales(first_block):
    """The first block at 4 bits, judged on held-out inputs with alpha = 0 not searched: AWQ
    beats round-to-nearest on the median layer; the same search over scales unrelated to the
    activations (random magnitudes) does not."""
    from inference_conformance.reference.quantization.methods import awq

    gen = torch.Generator().manual_seed(0)
    mags = {key: torch.rand(w.shape[1], generator=gen, dtype=torch.float64) * 10 + 0.01
            for key, w in first_block[0].items()}

    def awq_random(w, x, b, g):
        key = next(k for k, v in first_block[0].items() if v is w)
        return awq(w, x, b, g, identity=False, magnitudes=mags[key])

    good = _block_ratios(first_block, {"AWQ": partial(awq, identity=False)})
    bad = _block_ratios(first_block, {"AWQ random scales": awq_random})
    rejects("QT-8", check_qt8_layers, (good,), (bad,),
            match=r"QT-8: AWQ random scales at 4 bits: median layer's held-out error 1\.\d+x")


@pytest.mark.claim("QT-8")
def test_qt8_rejects_gptq_with_the_hessian_permuted(first_block):
    """The first block at 4 bits: GPTQ (column order and act-order) is no worse than
    round-to-nearest on every layer; GPTQ with act-order's order applied to the Hessian but not
    to the weight's columns spreads each error by the wrong correlations and is worse."""
    from inference_conformance.reference.quantization.methods import gptq

    good = _block_ratios(first_block, {"GPTQ": gptq, "GPTQ act-order": partial(gptq, act_order=True)})
    bad = _block_ratios(first_block, {"GPTQ Hessian permuted": gptq_hessian_permuted})
    rejects("QT-8", check_qt8_layers, (good,), (bad,),
            match=r"QT-8: GPTQ Hessian permuted at 4 bits: worst layer's held-out error \d+\.\d+x")


@pytest.mark.claim("QT-8")
def test_qt8_rejects_an_nll_table_with_gptq_worse_than_rtn():
    """The recorded NLL table passes; with the NLLs GPTQ with the Hessian permuted gives
    (``QT8_NLL_HESSIAN_PERMUTED``, the same evaluation) GPTQ is worse than round-to-nearest at
    both bit widths, though within 3% of unquantized."""
    bad = {**QT8_NLL_RECORDED, ("GPTQ", 4): QT8_NLL_HESSIAN_PERMUTED[4], ("GPTQ", 3): QT8_NLL_HESSIAN_PERMUTED[3]}
    rejects("QT-8", check_qt8_nll, (QT8_NLL_RECORDED, QT8_RECORDED_BASE), (bad, QT8_RECORDED_BASE),
            match=r"QT-8: GPTQ at 4 bits: NLL 2\.6113 above round-to-nearest's 2\.6017")


# ------------------------------------------------------------------------------------- QT-10
#: Multiplicative noise of 12 paired measurements, symmetric on the log scale (as in
#: properties/roofline/test_trend_rejections.py): geometric mean exactly the true ratio.
NOISE = [math.exp(s * e) for e in (0.1, 0.2, 0.3, 0.15, 0.25, 0.05) for s in (1, -1)]


@pytest.mark.claim("QT-10")
def test_qt10_rejects_a_quantized_product_slower_than_bf16():
    """bf16 / quantized decode latency: int4 reading a quarter of the bytes (2.5x) holds; a
    product that dequantizes the whole weight to bf16 before multiplying (it reads the codes and
    writes and reads a bf16 copy: 0.6x) fails; one at the mark is inconclusive."""
    rule = trends.QT10_QUANTIZED_DECODE
    judges("QT-10", rule.judge, {"holds": ([2.5 * n for n in NOISE],), "fails": ([0.6 * n for n in NOISE],),
                                 "inconclusive": ([rule.mark * n for n in NOISE],)})


def test_a_recorded_table_that_moved_is_called_stale():
    """The good inputs above are recorded tables; the live experiments check them each run
    (``check_recorded``): a figure moved past half a unit of its 4th decimal, or a key missing,
    fails naming it."""
    from inference_conformance.properties.quantization.claims_cases import check_recorded

    check_recorded(dict(QT3_RECORDED), QT3_RECORDED, "QT3_RECORDED")
    moved = {**QT3_RECORDED, (3, "tensor"): QT3_RECORDED[3, "tensor"] + 1e-3}
    with pytest.raises(AssertionError, match=r"QT3_RECORDED \(properties/quantization/claims_cases.py\) is stale.*\(3, 'tensor'\)"):
        check_recorded(moved, QT3_RECORDED, "QT3_RECORDED")
    with pytest.raises(AssertionError, match="keys"):
        check_recorded(dict(list(QT3_RECORDED.items())[1:]), QT3_RECORDED, "QT3_RECORDED")
