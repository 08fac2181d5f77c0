"""Laws of the quantized Triton kernels' own paths (claim QT-9; lecture 001 §5.2–5.3).

- The weight-only matmul's two launches (``optimized/quantization/quant_matmul.py``): the decode launch
  (split-K, M <= GEMV_MAX_M) and the tiled one (larger M). QT-9's law of
  ``properties/quantization/test_quantization.py`` (matmul equals x @ dequantize(qw).T, tolerance rule
  ``quant-matmul``) runs on pinned cases at M = 1, 16 and 17, K spanning several groups and
  several K splits, odd N and N past one column block, for every registered implementation;
  the launch is chosen by M (checked), and a decode launch that reads every row as the first
  token (zoo ``decode_rows_read_first_token``) is rejected at M = 16 while it passes M = 1 and
  M = 17.
- W8A8 (``optimized/quantization/w8a8_matmul.py``), the laws of ``properties/quantization/laws/w8a8.py``
  run here on the Triton and PyTorch products: the int32 accumulator equals the exact integer product
  (int64 on the host) element for element, including K = 4096 at codes of ±127, where sums reach
  K·127² = 66,064,384: beyond int16 (32,767), float16 (65,504; integers above 2048 round) and
  float32's exact integers (2^24). The scaled output equals the reference W8A8
  (``inference_conformance.reference.quantization.methods``: per-token activations, per-channel weights, both dequantized,
  multiplied in float64) by the tolerance policy's dtype rule: the integer part is exact, so the
  only roundings are the epilogue's three float32 products (each 2^-24 relative) and one rounding
  to the output dtype, which is what the float32 rule (1e-5 of the scale) and the 16-bit one-kernel
  rule (1 ulp of the correctly rounded float64 result + half an ulp of the scale) allow. A float16
  accumulator, per-token scales read by column and a truncating activation quantizer
  (``inference_conformance.properties.quantization.zoo.W8A8_ZOO``) are each rejected; bad arguments raise before a launch.
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.conformance import results
from inference_conformance.conformance.tolerance import assert_exact, check_close
from inference_conformance.conformance.zoo import expect_rejected
from inference_conformance.properties import strategies
from inference_conformance.properties.strategies import KernelLaunchCapture
from inference_conformance.properties.quantization.laws.kernels import QT9_BOTH_LAUNCHES, QT9_ONE_ROW_AND_TILED
from inference_conformance.properties.quantization.laws.w8a8 import (
    W8A8_ACCUMULATOR,
    W8A8_REFERENCE,
    W8Case,
    make_codes,
    make_floats,
)
from inference_conformance.properties.quantization.zoo import W8A8_ZOO

TECH = "quantization"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.technique(TECH)
@pytest.mark.claim("QT-9")
@pytest.mark.kills(*QT9_BOTH_LAUNCHES.kills[0].names)
def test_qt9_decode_zoo_rejected(bad_impl, device):
    """Rejected by the pinned M = 16 case; the bug stays invisible at M = 1 and on the tiled
    launch (M = 17), which is why the decode launch needs its own M > 1 examples."""
    QT9_ONE_ROW_AND_TILED(bad_impl, device, torch.float32)
    results.recorder().reset()
    expect_rejected(QT9_BOTH_LAUNCHES, bad_impl, device, torch.float32)


def test_decode_launch_is_chosen_by_M(monkeypatch, device):
    """M <= GEMV_MAX_M launches quant_gemv_kernel (with more than one K split here), larger M
    the tiled kernel; path= forces either and refuses the decode launch above GEMV_MAX_M."""
    from inference_conformance.optimized.quantization import quant_matmul as qm
    from inference_conformance.optimized import quantization as quant_torch

    seen = {"gemv": [], "tiled": []}
    monkeypatch.setattr(qm, "quant_gemv_kernel", KernelLaunchCapture(qm.quant_gemv_kernel, seen["gemv"]))
    monkeypatch.setattr(qm, "quant_matmul_kernel", KernelLaunchCapture(qm.quant_matmul_kernel, seen["tiled"]))
    w = strategies.randn((9, 256), 1, dtype=torch.float32, device=device)
    qw = quant_torch.quantize(w, bits=4, granularity=32)
    args = (qw.codes, qw.scales, qw.zeros)
    kw = dict(bits=4, group_size=32, N=9, K=256)
    assert qm.gemv_splits(9, 256, torch.device(device))[0] > 1
    for M, path in ((1, "gemv"), (qm.GEMV_MAX_M, "gemv"), (qm.GEMV_MAX_M + 1, "tiled")):
        seen["gemv"].clear(), seen["tiled"].clear()
        qm.quant_matmul(strategies.randn((M, 256), M, dtype=torch.float32, device=device), *args, **kw)
        assert seen[path] and not seen["tiled" if path == "gemv" else "gemv"], f"M = {M} did not take the {path} launch"
    x = strategies.randn((3, 256), 3, dtype=torch.float32, device=device)
    gemv = qm.quant_matmul(x, *args, **kw, path="gemv")
    tiled = qm.quant_matmul(x, *args, **kw, path="tiled")
    d = quant_torch.dequantize(qw)
    for out in (gemv, tiled):
        check_close(out, x.double() @ d.double().T, out_pt=x @ d.T, rule="quant-matmul").check()
    with pytest.raises(ValueError, match="path 'gemv' takes M <= 16"):
        qm.quant_matmul(strategies.randn((17, 256), 4, dtype=torch.float32, device=device), *args, **kw, path="gemv")
    with pytest.raises(ValueError, match="path must be"):
        qm.quant_matmul(x, *args, **kw, path="split")


# --------------------------------------------------------------------------------------- W8A8
W8A8_IMPLS = ("triton", "torch")


def _product(name: str):
    from inference_conformance.optimized.quantization import w8a8_matmul as w8

    return {"triton": w8.TRITON, "torch": w8.TORCH}[name]



@pytest.mark.claim("QT-9")
@pytest.mark.parametrize("which", W8A8_IMPLS)
@pytest.mark.suite_own("the suite's W8A8 kernel: no W8A8 contract yet, so an outside W8A8 kernel cannot be plugged in")
def test_w8a8_accumulator_is_exact(which, device):
    largest = max(W8A8_ACCUMULATOR(_product(which), device).observations)
    assert largest > 2 ** 24, f"the cases never reached sums beyond 2^24 (largest {largest})"
    results.record("QT-9", measured=0, bound=0, unit="accumulator elements differing from the int64 product",
                   rule="exact", what=f"largest |sum| reached {largest} (> 2^24, int16, float16)")


@pytest.mark.claim("QT-9")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("which", W8A8_IMPLS)
@pytest.mark.suite_own("the suite's W8A8 kernel: no W8A8 contract yet, so an outside W8A8 kernel cannot be plugged in")
def test_w8a8_equals_reference(which, device, dtype):
    W8A8_REFERENCE(_product(which), device, dtype)


def _bad(name: str):
    bad = W8A8_ZOO[name]
    bad.target = f"inference_conformance.properties.quantization.zoo:W8A8_ZOO[{name!r}]"
    return bad


@pytest.mark.claim("QT-9")
@pytest.mark.parametrize("name,law", [("w8a8_fp16_accumulator", "accumulator"),
                                      ("w8a8_token_scale_per_column", "reference"),
                                      ("w8a8_truncating_quantizer", "reference")])
def test_w8a8_zoo_rejected(name, law, device):
    if law == "accumulator":
        text = expect_rejected(W8A8_ACCUMULATOR, _bad(name), device)
    else:
        text = expect_rejected(W8A8_REFERENCE, _bad(name), device, torch.float32)
    results.record("QT-9", measured="rejected", unit="known-bad W8A8 product", rule=f"W8A8 {law} law",
                   what=f"{name}: {text[:120]}")


def test_w8a8_linear_is_the_composition(device):
    """w8a8_linear(x, w_q, w_scales): quantize x per token, then the kernel in x's dtype."""
    from inference_conformance.optimized.quantization import w8a8_matmul as w8

    x, w = make_floats(W8Case(3, 5, 40, "normal"), 1, torch.bfloat16, device)
    w_q, w_s = w8.quantize_weight(w)
    out = w8.w8a8_linear(x, w_q, w_s)
    assert out.dtype == torch.bfloat16
    assert_exact(out, w8.w8a8_matmul(*w8.quantize_activations(x), w_q, w_s, out_dtype=torch.bfloat16))


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's numpy on NaN/inf
@pytest.mark.parametrize("which", W8A8_IMPLS)
def test_w8a8_non_finite_token_stays_in_its_row(which, device):
    """Activations are not value-checked (no device round trip per forward): a token row with NaN
    or inf must come out non-finite, never as finite garbage, and leave the other rows exact."""
    impl = _product(which)
    x, w = make_floats(W8Case(4, 6, 40, "normal"), 2, torch.float32, device)
    w_q, w_s = impl.quantize_weight(w)
    clean = impl.w8a8_matmul(*impl.quantize_activations(x), w_q, w_s)
    for bad in (float("nan"), float("inf")):
        xb = x.clone()
        xb[1, 7] = bad
        out = impl.w8a8_matmul(*impl.quantize_activations(xb), w_q, w_s)
        assert not bool(torch.isfinite(out[1]).any()), f"a token holding {bad} gave finite outputs {out[1].tolist()}"
        rows = [0, 2, 3]
        assert_exact(out[rows], clean[rows], what=f"the other tokens' rows beside a {bad} token")


def test_w8a8_bad_input_raises(device):
    """Every invalid call raises TypeError / ValueError naming the argument, before a launch."""
    from inference_conformance.optimized.quantization import w8a8_matmul as w8

    x_q, w_q = make_codes(W8Case(3, 4, 8, "uniform"), 1, device)
    xs, ws = torch.ones(3, device=device), torch.ones(4, device=device)
    calls = {
        "x_q float": (TypeError, "x_q must be int8", (x_q.float(), xs, w_q, ws), {}),
        "w_q uint8": (TypeError, "w_q must be int8", (x_q, xs, w_q.to(torch.uint8), ws), {}),
        "x_q 1-D": (ValueError, "x_q must be a non-empty 2-D", (x_q[0], xs, w_q, ws), {}),
        "K differs": (ValueError, "w_q has K = 7 columns; x_q has K = 8", (x_q, xs, w_q[:, :7].contiguous(), ws), {}),
        "x_q strided along K": (ValueError, "x_q must be contiguous along K",
                                (torch.cat([x_q, x_q], 1)[:, ::2], xs, w_q, ws), {}),
        "w_q transposed": (ValueError, "w_q must be contiguous along K", (x_q, xs, w_q.T.contiguous().T, ws), {}),
        "x_scales per tensor": (ValueError, r"x_scales must have shape \(3,\)", (x_q, xs[:1], w_q, ws), {}),
        "w_scales (N, 1)": (ValueError, r"w_scales must have shape \(4,\)", (x_q, xs, w_q, ws[:, None]), {}),
        "w_scales float64": (TypeError, "w_scales must be float32", (x_q, xs, w_q, ws.double()), {}),
        "x_scales strided": (ValueError, "x_scales must be contiguous", (x_q, torch.ones(6, device=device)[::2], w_q, ws), {}),
        "w_q not a tensor": (TypeError, "w_q must be a torch.Tensor", (x_q, xs, w_q.tolist(), ws), {}),
        "out_dtype float64": (TypeError, "out_dtype must be", (x_q, xs, w_q, ws), {"out_dtype": torch.float64}),
    }
    for what, (exc, match, args, kwargs) in calls.items():
        for fn in (w8.w8a8_matmul, w8.w8a8_matmul_torch):
            with pytest.raises(exc, match=match):
                fn(*args, **kwargs)
                pytest.fail(f"{fn.__name__} accepted an invalid call ({what})")
    with pytest.raises(TypeError, match="x has dtype torch.int32"):
        w8.quantize_activations(x_q.int())
    with pytest.raises(ValueError, match="w must be finite"):
        w8.quantize_weight(torch.full((2, 3), float("nan"), device=device))
