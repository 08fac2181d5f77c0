"""Bad input to quantization and to the Triton quantized matmul's host wrapper: a clear
TypeError / ValueError that names the argument, raised before any kernel launch; and an
outside implementation checked with ``--impl quantization=module:attr``."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inference_conformance.conformance import registry

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("one_torch_thread")

IMPLS = {i.name: i for i in registry.builtins("quantization") if i.unavailable is None}


def _w(device, dtype=torch.float32):
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(0)).to(device=device, dtype=dtype)


QUANTIZE_CASES = {
    "bits 1": (dict(bits=1, granularity="channel"), ValueError, r"bits must be in 2\.\.8, got 1"),
    "bits 9": (dict(bits=9, granularity="channel"), ValueError, r"bits must be in 2\.\.8, got 9"),
    "bits float": (dict(bits=4.0, granularity="channel"), TypeError, "bits must be an int"),
    "group not dividing K": (dict(bits=4, granularity=3), ValueError, r"granularity \(group size\) 3 must divide K = 8"),
    "group 0": (dict(bits=4, granularity=0), ValueError, r"group size\) must be >= 1"),
    "unknown granularity": (dict(bits=4, granularity="row"), ValueError, "granularity must be 'tensor', 'channel'"),
    "bool granularity": (dict(bits=4, granularity=True), TypeError, "granularity must be"),
}


@pytest.mark.parametrize("which", list(IMPLS))
@pytest.mark.parametrize("what", list(QUANTIZE_CASES))
def test_quantize_rejects_bad_arguments(which, what, device):
    kwargs, error, match = QUANTIZE_CASES[what]
    with pytest.raises(error, match=match):
        IMPLS[which].quantize(_w(device), **kwargs)


@pytest.mark.parametrize("which", list(IMPLS))
def test_bad_weights_and_activations_name_the_argument(which, device):
    impl = IMPLS[which]
    w = _w(device)
    bits = 8 if getattr(impl.namespace, "number_format", "int").startswith("fp8") else 4   # FP8: 8 bits only
    with pytest.raises(ValueError, match=r"w must have 2 dimensions \(N, K\)"):
        impl.quantize(w[0], bits=bits, granularity="channel")
    with pytest.raises(TypeError, match="w has dtype torch.int32"):
        impl.quantize(w.int(), bits=bits, granularity="channel")
    with pytest.raises(ValueError, match="w must be finite"):
        impl.quantize(w / 0, bits=bits, granularity="channel")
    with pytest.raises(ValueError, match="w must not be empty"):
        impl.quantize(w[:, :0], bits=bits, granularity="channel")
    qw = impl.quantize(w, bits=bits, granularity=4)
    x = torch.randn(3, 8).to(device)
    with pytest.raises(ValueError, match="x has K = 7 columns; the quantized weight has K = 8"):
        impl.matmul(x[:, :7], qw)
    with pytest.raises(TypeError, match="x has dtype torch.float16"):
        impl.matmul(x.half(), qw)
    with pytest.raises(ValueError, match=r"x must have 2 dimensions \(M, K\)"):
        impl.matmul(x[0], qw)
    with pytest.raises(TypeError, match="qw must be"):
        impl.dequantize((qw,))


@pytest.mark.parametrize("which", [n for n in IMPLS if "fp8" in n])
def test_fp8_schemes_refuse_other_bits_after_validating(which, device):
    """An FP8 scheme stores 8 bits: bits 4 is NotImplementedError (reported "unsupported"), but
    bits 9 is still the contract's ValueError, raised first."""
    impl = IMPLS[which]
    with pytest.raises(NotImplementedError, match="8 bits"):
        impl.quantize(_w(device), bits=4, granularity="channel")
    with pytest.raises(ValueError, match="bits must be in"):
        impl.quantize(_w(device), bits=9, granularity="channel")


def test_kernel_wrapper_checks_the_fp8_arguments(device):
    """The Triton wrapper's FP8 mode: an unknown number_format, bits other than 8, zero points
    passed with FP8 codes raise ValueError naming the argument, before any launch."""
    qm = pytest.importorskip("inference_conformance.optimized.quantization.quant_matmul")
    from inference_conformance.optimized.quantization import fp8 as quant_torch

    w = torch.randn(6, 32).to(device)
    qw = quant_torch.quantize_fp8(w, bits=8, granularity="channel", fmt="fp8_e4m3fn")
    x = torch.randn(2, 32).to(device)
    args = dict(group_size=32, N=6, K=32)
    with pytest.raises(ValueError, match="number_format"):
        qm.quant_matmul(x, qw.codes, qw.scales, None, bits=8, number_format="fp8_e4m3", **args)
    with pytest.raises(ValueError, match="bits must be 8"):
        qm.quant_matmul(x, qw.codes, qw.scales, None, bits=4, number_format="fp8_e4m3fn", **args)
    with pytest.raises(ValueError, match="zeros must be None"):
        qm.quant_matmul(x, qw.codes, qw.scales, torch.zeros(6, 1, dtype=torch.uint8, device=device), bits=8,
                        number_format="fp8_e4m3fn", **args)


@pytest.mark.parametrize("which", [n for n in IMPLS if "fp4" in n])
def test_fp4_schemes_refuse_other_bits_after_validating(which, device):
    """An FP4 scheme (MXFP4, NVFP4) stores 4 bits: bits 8 is NotImplementedError, bits 9 still
    the contract's ValueError, raised first; an unknown format names ``number_format``."""
    from inference_conformance.optimized.quantization import fp4 as quant_fp4
    from inference_conformance.reference.quantization import fp4 as ref_fp4

    impl = IMPLS[which]
    with pytest.raises(NotImplementedError, match="4 bits"):
        impl.quantize(_w(device), bits=8, granularity="channel")
    with pytest.raises(ValueError, match="bits must be in"):
        impl.quantize(_w(device), bits=9, granularity="channel")
    for ops in (quant_fp4, ref_fp4):
        with pytest.raises(ValueError, match="number_format"):
            ops.quantize_fp4(_w(device), bits=4, granularity=4, fmt="fp4")


def test_kernel_wrapper_checks_the_fp4_arguments(device):
    """The Triton wrapper's FP4 mode: bits other than 4 and zero points with E2M1 codes raise
    ValueError naming the argument, before any launch."""
    qm = pytest.importorskip("inference_conformance.optimized.quantization.quant_matmul")
    from inference_conformance.optimized.quantization import fp4 as quant_fp4

    qw = quant_fp4.quantize_fp4(torch.randn(6, 32).to(device), bits=4, granularity=16, fmt="nvfp4")
    x, s = torch.randn(2, 32).to(device), qw.block_scales(torch.float32)
    args = dict(group_size=16, N=6, K=32, number_format="fp4_e2m1")
    with pytest.raises(ValueError, match="bits must be 4"):
        qm.quant_matmul(x, qw.codes, s, None, bits=8, **args)
    with pytest.raises(ValueError, match="zeros must be None"):
        qm.quant_matmul(x, qw.codes, s, torch.zeros(6, 2, dtype=torch.uint8, device=device), bits=4, **args)


def test_kv_format_arguments_name_themselves():
    """KV-cache formats: an unknown kind, residual/group on a per-token kind, a group < 1 and
    k, v of different shapes raise ValueError naming the argument."""
    from inference_conformance.conformance.contracts.quantization.kv import kv_format
    from inference_conformance.optimized.quantization import kv as quant_torch
    from inference_conformance.reference.quantization import kv as ref

    for kwargs, name in ((dict(kind="int3"), "kind"), (dict(kind="int8", residual=4), "residual"),
                         (dict(kind="int4_kivi", group=0), "group"), (dict(kind="int4_kivi", residual=-1), "residual")):
        with pytest.raises(ValueError, match=name):
            kv_format(**kwargs)
    k = torch.zeros(1, 2, 5, 4)
    for ops in (ref, quant_torch):
        with pytest.raises(ValueError, match="k and v"):
            ops.quantize_kv(k, k[:, :, :4], kv_format("int8"))


def test_kernel_wrapper_checks_the_packed_tensors(device):
    """The host wrapper of the Triton kernel: packed codes of the wrong dtype or shape, scales
    that do not match the groups, zero points of another shape, bits outside 2..8, an act-order
    g_idx of the wrong dtype, length or range (an int64 g_idx is taken as int32 is)."""
    qm = pytest.importorskip("inference_conformance.optimized.quantization.quant_matmul")
    from inference_conformance.optimized import quantization as quant_torch
    from inference_conformance.optimized.quantization.packing import unpack

    w = torch.randn(6, 32).to(device)
    qw = quant_torch.quantize(w, bits=4, granularity=8)
    x = torch.randn(2, 32).to(device)
    kw = dict(bits=4, group_size=8, N=6, K=32)
    good = (x, qw.codes, qw.scales, qw.zeros)
    torch.testing.assert_close(qm.quant_matmul(*good, **kw), x @ quant_torch.dequantize(qw).T)
    g_idx = (torch.arange(32) % 4).to(device=device, dtype=torch.int32)       # act-order: a valid g_idx
    qa = quant_torch.quantize(w, bits=4, granularity=8, g_idx=g_idx)
    torch.testing.assert_close(qm.quant_matmul(x, qa.codes, qa.scales, qa.zeros, **kw, g_idx=g_idx.long()),
                               x @ quant_torch.dequantize(qa).T)
    bad = {
        "codes int32": ((x, qw.codes.int(), qw.scales, qw.zeros), kw, TypeError, "codes must be uint8"),
        "codes unpacked": ((x, unpack(qw.codes, 4, 32).to(torch.uint8), qw.scales, qw.zeros), kw,
                           ValueError, r"codes must have shape \(N, ceil\(K / 2\)\) = \(6, 16\)"),
        "scales of another grouping": ((x, qw.codes, qw.scales[:, :2], qw.zeros), kw, ValueError,
                                       r"scales must have shape \(N, K // group_size\) = \(6, 4\)"),
        "scales float64": ((x, qw.codes, qw.scales.double(), qw.zeros), kw, TypeError, "scales must be float32"),
        "zeros of another shape": ((x, qw.codes, qw.scales, qw.zeros[:3]), kw, ValueError, "zeros must have the scales' shape"),
        "zeros int64": ((x, qw.codes, qw.scales, qw.zeros.long()), kw, TypeError, "zeros must be uint8"),
        "bits 9": (good, dict(kw, bits=9), ValueError, r"bits must be in 2\.\.8"),
        "group size not dividing K": (good, dict(kw, group_size=5), ValueError, "group_size must be an int >= 1 dividing K"),
        "x wrong K": ((x[:, :31],) + good[1:], kw, ValueError, "x has K = 31"),
        "x int": ((x.int(),) + good[1:], kw, TypeError, "x has dtype torch.int32"),
        "g_idx float": (good, dict(kw, g_idx=g_idx.float()), TypeError, "g_idx must be int32 or int64"),
        "g_idx a list": (good, dict(kw, g_idx=g_idx.tolist()), TypeError, "g_idx must be a torch.Tensor"),
        "g_idx wrong length": (good, dict(kw, g_idx=g_idx[:-1]), ValueError, r"g_idx must have shape \(K,\) = \(32,\)"),
        "g_idx out of range": (good, dict(kw, g_idx=g_idx + 1), ValueError, r"g_idx values must lie in \[0, 4\)"),
        "g_idx negative": (good, dict(kw, g_idx=g_idx - 1), ValueError, r"g_idx values must lie in \[0, 4\)"),
    }
    for what, (args, kwargs, error, match) in bad.items():
        with pytest.raises(error, match=match):
            qm.quant_matmul(*args, **kwargs)
    with pytest.raises(NotImplementedError, match="float64"):
        qm.quant_matmul(x.double(), qw.codes, qw.scales, qw.zeros, **kw)


def test_outside_implementation_via_impl_option(tmp_path):
    """``--impl quantization=my_quantization:...`` from another directory: the conforming
    example passes QT-1 and the floor-rounding one fails it."""
    env = dict(os.environ, CI="true", PYTHONPATH=os.pathsep.join([str(ROOT / "examples"), str(ROOT)]))
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "inference_conformance.properties.quantization.laws.integer",
           "-p", "no:cacheprovider", "-q",
           "--device=cpu", "--impl", "quantization=my_quantization:quantization",
           "--impl", "quantization=my_quantization:wrong_quantization",
           "-k", "test_qt1_within_half_step and float32"]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-2000:]
    assert "1 failed, 1 passed" in r.stdout, r.stdout[-3000:]
    assert "my_quantization:wrong_quantization" in r.stdout.split("short test summary")[-1]
