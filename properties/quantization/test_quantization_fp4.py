"""Tests of the FP4 block formats beside their law (``laws/fp4.py``; lecture 001 §5.4; claim QT-13), written against the
``quantization`` contract (``conformance/contracts/quantization/fp4.py``: MXFP4's power-of-two
scale per block, NVFP4's E4M3 block scale times a float32 tensor scale, E2M1 values).

- QT-13, the values: every FP4 scheme of the registry (``number_format`` "mxfp4" / "nvfp4")
  reconstructs every element within half the E2M1 grid spacing at w / s times the block's scale
  s (the contract's ``fp4_bound``), comes back as ±6 s where |w| > 6 s (saturation), and equals
  the float64 reference's value exactly: the nearest grid point of its block, ties to the even
  code. Drawn weights include ``ties`` blocks, built so that their scale is known exactly and
  their values lie on the midpoints between grid points (a rounding that sends ties the wrong
  way stays within the half-step bound, so only the exact comparison sees it). Known-bad
  schemes (``properties/quantization/zoo_fp4.py``: the scale's exponent by ceil, nibbles swapped
  in packing, ties away from zero) are each rejected by that comparison.
- QT-13, the packing: two E2M1 codes a byte, the even k in the low nibble, round trip in the
  reference and the torch packer alike, odd K included.
- The product: an FP4 scheme's matmul equals x @ dequantize(qw).T by QT-9's law itself (every
  scheme, at 4 bits; the Triton kernel's decode (M <= 16) and tiled launches in
  ``test_quant_kernels.py``); figure: the small model's NLL with FP4 weights beside int4 g128
  and FP8.
"""
from __future__ import annotations


import pytest
import torch

from inference_conformance.conformance import results
from inference_conformance.conformance.contracts.quantization import fp4 as fp4_contract
from inference_conformance.conformance.tolerance import assert_exact
from inference_conformance.properties.quantization.laws.fp4 import FP4_EXAMPLES, GRID, TIES, make_fp4_weight
from inference_conformance.properties.quantization.zoo_fp4 import FP4_ZOO

TECH = "quantization"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.claim("QT-13")
@pytest.mark.suite_own("the suite's pinned tie blocks are ties")
def test_qt13_ties_blocks_are_ties():
    """The ``ties`` cells hold what they claim: under both formats' scale rules (the contract's
    fp4_scales) every element / s is a midpoint or a grid value, and some are midpoints."""
    case = FP4_EXAMPLES[0]["case"]
    w = make_fp4_weight(case, 1, torch.bfloat16, "cpu")
    for fmt, block in (("mxfp4", 32), ("nvfp4", 32)):
        q = (w.double() / fp4_contract.fp4_scales(w, fmt, block))[2, 32:]        # the second ties cell
        ok = torch.isin(q.abs(), torch.tensor(TIES + GRID + (6.0,), dtype=torch.float64))
        assert bool(ok.all()) and bool(torch.isin(q.abs(), torch.tensor(TIES, dtype=torch.float64)).any()), (fmt, q)


@pytest.mark.claim("QT-13")
@pytest.mark.suite_own("the suite's FP4 packing helpers")
def test_qt13_packing_round_trips():
    """Two E2M1 codes a byte, the even k low: the reference's and the torch packer's bytes are
    equal and unpack to the codes (odd K: the last byte's high nibble is 0); code 0b0111 is 6,
    0b1001 is -0.5, and the byte of (1.5, -6) is 0xF3."""
    from inference_conformance.optimized.quantization import fp4 as quant_fp4
    from inference_conformance.optimized.quantization import packing
    from inference_conformance.reference import quantization as ref
    from inference_conformance.reference.quantization import fp4 as ref_fp4

    u = torch.randint(16, (5, 33), generator=torch.Generator().manual_seed(0))
    packed = ref_fp4.pack_nibbles(u)
    assert_exact(packing.pack(u, 4), packed, what="torch packing vs the reference's")
    assert_exact(ref.pack(u, 4), packed, what="the integer reference's 4-bit packing vs the FP4 one")
    assert_exact(ref_fp4.unpack_nibbles(packed, 33), u, what="reference unpack(pack(u))")
    assert_exact(packing.unpack(packed, 4, 33).long(), u, what="torch unpack(pack(u))")
    assert int(packed[0, -1]) >> 4 == 0
    assert ref_fp4.E2M1_VALUES[7] == 6 and ref_fp4.E2M1_VALUES[9] == -0.5
    qw = quant_fp4.quantize_fp4(torch.tensor([[1.5, -6.0]]), bits=4, granularity=2, fmt="mxfp4")
    assert int(qw.codes[0, 0]) == 0xF3 and int(qw.scale_codes[0, 0]) == 127, (qw.codes, qw.scale_codes)


@pytest.mark.claim("QT-13")
@pytest.mark.suite_own("the law's exact-value check on a synthetic ties-away rounding")
def test_qt13_ties_away_passes_the_bound_but_not_the_exact_value():
    """Why QT-13 compares with the exact value: ties sent away from zero are within half a step
    (the bound) everywhere, and differ from the reference's nearest-even value on the ties."""
    from inference_conformance.reference.quantization import fp4 as ref

    case = FP4_EXAMPLES[1]["case"]
    w = make_fp4_weight(case, 2, torch.float32, "cpu")
    bad = FP4_ZOO["nvfp4_ties_away_from_zero"]
    d = bad.dequantize(bad.quantize(w, bits=4, granularity=16))
    assert bool(((d.double() - w.double()).abs() <= fp4_contract.fp4_bound(w, "nvfp4", 16)).all())
    good = ref.dequantize_fp4(ref.quantize_fp4(w, bits=4, granularity=16, fmt="nvfp4"))
    assert int((d != good).sum()) > 0


def _relative_weight_error(model, scheme, bits: int, granularity) -> float:
    """||W_hat - W|| / ||W|| over all of the model's block Linear weights (Frobenius; a group
    size not dividing K pads with zero columns, as quantize_model_weights does)."""
    from inference_conformance.reference.quantization.methods import named_block_linears

    num = den = 0.0
    for _, lin in named_block_linears(model):
        w = lin.weight.detach()
        pad = (-w.shape[1]) % granularity if isinstance(granularity, int) else 0
        d = scheme.dequantize(scheme.quantize(torch.nn.functional.pad(w, (0, pad)), bits=bits,
                                              granularity=granularity))[:, :w.shape[1]]
        num += float((d.double() - w.double()).pow(2).sum())
        den += float(w.double().pow(2).sum())
    return (num / den) ** 0.5


@pytest.mark.claim("QT-13")
@pytest.mark.suite_own("the small model's NLL with the suite's FP4, int4 and FP8 weights (the lecture's figure)")
def test_qt13_nll_with_fp4_weights_beside_int4_and_fp8():
    """QT-13's figure on the target model (float32, QT-3's 64 test documents): every block Linear
    weight-only MXFP4 (blocks of 32) and NVFP4 (blocks of 16), beside int4 absmax in groups of
    128 and FP8 E4M3 per channel (torch schemes). Rules: each FP4 NLL within 1% of unquantized
    (as QT-11's FP8), and the weights' relative error ordered FP8 < NVFP4 < MXFP4 (NVFP4's E4M3
    scale fits each block's max to 6 within 2^-4, MXFP4's power of two only within a factor 2,
    and its blocks are twice as long)."""
    from inference_conformance.optimized import quantization as quant_int
    from inference_conformance.optimized.quantization import fp4 as quant_fp4
    from inference_conformance.optimized.quantization import fp8 as quant_fp8
    from inference_conformance.reference.quantization.methods import quantize_model_weights
    from inference_conformance.smallworld import checkpoints, data

    model = checkpoints.load_model("target", dtype=torch.float32)
    docs = data.split("test", data.TEST_SUBSET)
    base = data.nll(model, docs)
    rows = {"mxfp4 weights (E8M0 scale per 32)": (quant_fp4.MXFP4, 4, 32),
            "nvfp4 weights (E4M3 scale per 16, float32 tensor scale)": (quant_fp4.NVFP4, 4, 16),
            "int4 absmax weights, groups of 128": (quant_int.SYMMETRIC, 4, 128),
            "fp8_e4m3fn weights per channel": (quant_fp8.FP8_E4M3, 8, "channel")}
    nll, err = {}, {}
    for k, (scheme, bits, gran) in rows.items():
        qd = (lambda w, bits, gran, scheme=scheme: scheme.dequantize(scheme.quantize(w, bits=bits, granularity=gran)))
        nll[k] = data.nll(quantize_model_weights(model, qd, bits=bits, granularity=gran), docs)
        err[k] = _relative_weight_error(model, scheme, bits, gran)
        results.record("QT-13", measured=round(nll[k], 4), unit="test NLL (nats/token)", bound=round(base * 1.01, 4),
                       lecture="FP4 on Blackwell", nll=nll[k],
                       rule=f"{k}; unquantized {base:.4f} ({100 * (nll[k] / base - 1):+.3f}%); FP4 within 1%",
                       what=f"relative weight error {err[k]:.4f}")
    mx, nv, _, f8 = (err[k] for k in rows)
    results.record("QT-13", measured=round(nv / mx, 3), bound=1.0, unit="relative weight error, NVFP4 / MXFP4",
                   rule="FP8 < NVFP4 < MXFP4", what=f"FP8 {f8:.4f}, NVFP4 {nv:.4f}, MXFP4 {mx:.4f}")
    fp4 = list(rows)[:2]
    assert all(abs(nll[k] / base - 1) <= 0.01 for k in fp4), {k: nll[k] / base - 1 for k in fp4}
    assert f8 < nv < mx, err


@pytest.mark.claim("QT-13")
@pytest.mark.parametrize("library", ["gguf", "torchao"])
@pytest.mark.suite_own("what the exact comparison finds in gguf's and torchao's FP4 formats, pinned as reproductions")
def test_qt13_outside_deviations(library):
    """What QT-13's exact comparison finds in the outside FP4 formats (where the library is
    installed; ``optimized/quantization/outside_fp4.py``): gguf-py's MXFP4 sends ties to the
    smaller magnitude (0.75 s -> 0.5 s, 1.75 s -> 1.5 s) and takes floor(log2 amax) in float32,
    where log2 of a value just below 2^k rounds up to k (the exponent one too large: 2^126 for
    max|w| = (2 - 2^-23) 2^125, whose contract value is 6 * 2^123); torchao's NVFP4 returns NaN
    for an all-zero weight (its tensor scale is 0)."""
    pytest.importorskip(library)
    from inference_conformance.optimized.quantization import outside_fp4 as ofp4

    if library == "gguf":
        w = torch.zeros(1, 32)
        w[0, :4] = torch.tensor([6.0, 0.75, 1.75, 2.5])
        d = ofp4.gguf_mxfp4.dequantize(ofp4.gguf_mxfp4.quantize(w, bits=4, granularity=32))
        assert d[0, 1:4].tolist() == [0.5, 1.5, 2.0], d[0, :4]                   # nearest even: 1, 2, 2
        w[0, 0] = torch.finfo(torch.float32).max / 4
        d = ofp4.gguf_mxfp4.dequantize(ofp4.gguf_mxfp4.quantize(w, bits=4, granularity=32))
        assert d[0, 0].item() == 2.0 ** 126, d[0, 0]
    else:
        z = torch.zeros(2, 16)
        assert bool(torch.isnan(ofp4.torchao_nvfp4.dequantize(ofp4.torchao_nvfp4.quantize(z, bits=4, granularity=16))).all())
