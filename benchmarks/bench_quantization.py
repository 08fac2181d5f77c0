"""Weight-only quantized matmul timings (QT-10): the Triton kernel with int8 per-channel and int4
groups of 128 (``optimized/quantization/quant_matmul.py``) against bf16 ``torch.matmul`` on the same
decode-shaped product, side by side in one run.

Each test builds x (M, K) and a Linear weight (N, K) of a Llama-7B/8B shape, quantizes it once and
times the quantized product and the 16-bit product with synchronised medians, so the ratio is
recorded even when pytest-benchmark is disabled. extra_info: median latency, bytes one call must
read (``bytes``: packed weights + scales + zero points + x + out), effective GB/s, the bf16
latency and ``speedup_vs_bf16``, and the issue's goal text. On a GPU the M = 1 rows record QT-10
(holds when the quantized product is faster than bf16). On the CPU the Triton rows are skipped
(the interpreter's timings mean nothing) and the vectorized PyTorch path runs one small shape as
a smoke test; QT-10 stays "not measured" there. With ``--impl quantization=module:attr`` the rows
``impl``, ``impl2``, ... time the outside implementations' ``quantize`` (once, untimed) and
``matmul`` instead (extra_info ``implementation``: the target; no ``bytes``, their packed form is
their own; ``inference_conformance.conformance.plugin.bench_backends``).

Goals (not asserted; GPU, shapes of >= 64 MB of bf16 weights): at M = 1 int8 >= 1.7x bf16 and
int4 g128 >= 2.5x; int4 >= 2x up to M = 16; never below 0.9x bf16 up to M = 128.

M runs 1..128 on a GPU: up to ``GEMV_MAX_M`` the kernel takes its decode launch (split-K), above
it the tiled one; each row records which (``path``). W8A8 (``optimized/quantization/w8a8_matmul.py``): the
whole W8A8 Linear (per-token activation quantization on the host, then the int8 x int8 -> int32
kernel) and the kernel alone (``kernel_median_s``) against the same bf16 product; on the CPU
its PyTorch twin runs the small shape as a smoke test.
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.benchmarks.timing import median_seconds, paired_ratios, ratio_estimate
from inference_conformance.conformance import results
from inference_conformance.conformance.trends import QT10_QUANTIZED_DECODE
from inference_conformance.conformance.bench_rows import bench_backends, outside_backends, outside_info, outside_refusals
from inference_conformance.properties.strategies import randn

#: (N, K) Linear shapes per device: Llama-2-7B q/o (4096²), up (11008 x 4096), down (4096 x 11008),
#: Llama-3-8B up (14336 x 4096).
SHAPES = {"cuda": ((4096, 4096), (11008, 4096), (4096, 11008), (14336, 4096)), "cpu": ((256, 256),)}
MS = {"cuda": (1, 2, 4, 8, 16, 32, 64, 128), "cpu": (1,)}
#: backend -> (bits, granularity)
SCHEMES = {"int8_channel": (8, "channel"), "int4_g128": (4, 128)}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def pytest_generate_tests(metafunc):
    from inference_conformance.conformance.device import current_device

    device = current_device()
    if metafunc.definition.name == "test_bench_quantized_kv_decode":
        metafunc.parametrize("batch,context", KV_SHAPES[device], ids=[f"B{b}-T{t}" for b, t in KV_SHAPES[device]])
    if metafunc.definition.name in ("test_bench_quant_matmul", "test_bench_w8a8"):
        metafunc.parametrize("N,K", SHAPES[device], ids=[f"N{n}-K{k}" for n, k in SHAPES[device]])
        metafunc.parametrize("M", MS[device], ids=[f"M{m}" for m in MS[device]])


def _goal(scheme: str, M: int, weight_bytes_bf16: int) -> str:
    if weight_bytes_bf16 < 64 * 2 ** 20:
        return "never below 0.9x bf16" if M <= 128 else ""
    if M == 1:
        return "speedup_vs_bf16 >= 1.7" if scheme == "int8_channel" else "speedup_vs_bf16 >= 2.5"
    if M <= 16 and scheme == "int4_g128":
        return "speedup_vs_bf16 >= 2.0"
    return "speedup_vs_bf16 >= 0.9"


@pytest.mark.claim("QT-10")
@pytest.mark.parametrize("backend", bench_backends("quantization", ("triton", "torch")))
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_bench_quant_matmul(benchmark, device, backend, scheme, N, K, M):
    if backend == "triton" and device != "cuda":
        pytest.skip("Triton runs under the interpreter on the CPU: its timings mean nothing (use --device cuda)")
    bits, gran = SCHEMES[scheme]
    from inference_conformance.optimized import quantization as quant_torch

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    w = randn((N, K), 0, dtype=dtype, device=device, scale=0.05)
    x = randn((M, K), 1, dtype=dtype, device=device)
    outside = outside_backends("quantization").get(backend)
    if outside is not None:
        impl, quantize = outside, outside.quantize
    else:
        quantize = quant_torch.quantize
        if backend == "triton":
            from inference_conformance.optimized.quantization import TRITON_SYMMETRIC as impl
        else:
            impl = quant_torch.SYMMETRIC
    repeats = 5 if benchmark.disabled else 50
    # an outside implementation may refuse the scheme: "unsupported", as in the laws
    with outside_refusals("quantization", backend):
        qw = quantize(w, bits=bits, granularity=gran)

        def run():
            return impl.matmul(x, qw)

        t = median_seconds(run, device, repeats)
    t_dense = median_seconds(lambda: x @ w.T, device, repeats)
    info = dict(technique="quantization", backend=f"{backend}_{scheme}", device=device,
                dtype=str(dtype).replace("torch.", ""), M=M, N=N, K=K, bits=bits, granularity=gran,
                flops=2.0 * M * N * K, median_s=t, dense_median_s=t_dense, speedup_vs_bf16=t_dense / t,
                **outside_info("quantization", backend))
    if outside is None:
        nbytes = (qw.codes.numel() + qw.scales.numel() * qw.scales.element_size() + qw.zeros.numel()
                  + (M * K + M * N) * dtype.itemsize)
        info.update(bytes=nbytes, gbytes_per_s=nbytes / t / 1e9)
    if backend == "triton":
        from inference_conformance.optimized.quantization.quant_matmul import GEMV_MAX_M

        info["goal"] = _goal(scheme, M, N * K * 2)
        info["path"] = "gemv" if M <= GEMV_MAX_M else "tiled"
    results.bench_info(benchmark, **info)
    benchmark.pedantic(run, rounds=repeats, warmup_rounds=0)
    if backend == "triton" and device == "cuda" and M == 1:
        faster = ratio_estimate(paired_ratios(lambda: x @ w.T, run, device, repeats))
        results.record("QT-10", measured=round(faster.estimate, 3),
                       lecture="weight-only int8/int4 make memory-bound decode products faster by reading fewer bytes",
                       **QT10_QUANTIZED_DECODE.fields(faster),
                       unit="bf16 / quantized latency (same run)", rule=f"{scheme}, M={M}, N={N}, K={K}",
                       bits=bits, granularity=gran)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_bench_w8a8(benchmark, device, backend, N, K, M):
    """W8A8 Linear (activations per token, weights per channel, int32 accumulation) vs bf16."""
    if backend == "triton" and device != "cuda":
        pytest.skip("Triton runs under the interpreter on the CPU: its timings mean nothing (use --device cuda)")
    if backend == "torch" and device == "cuda":
        pytest.skip("the PyTorch twin accumulates in float64: a CPU smoke test, not a GPU baseline")
    from inference_conformance.optimized.quantization import w8a8_matmul as w8

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    w = randn((N, K), 0, dtype=dtype, device=device, scale=0.05)
    x = randn((M, K), 1, dtype=dtype, device=device)
    w_q, w_s = w8.quantize_weight(w)
    matmul = w8.w8a8_matmul if backend == "triton" else w8.w8a8_matmul_torch
    x_q, x_s = w8.quantize_activations(x)
    repeats = 5 if benchmark.disabled else 50

    def run():
        xq, xs = w8.quantize_activations(x)
        return matmul(xq, xs, w_q, w_s, out_dtype=dtype)

    t = median_seconds(run, device, repeats)
    t_kernel = median_seconds(lambda: matmul(x_q, x_s, w_q, w_s, out_dtype=dtype), device, repeats)
    t_dense = median_seconds(lambda: x @ w.T, device, repeats)
    nbytes = N * K + 4 * N + (M * K + M * N) * dtype.itemsize + M * K + 4 * M
    results.bench_info(benchmark, technique="quantization", backend=f"{backend}_w8a8", device=device,
                       dtype=str(dtype).replace("torch.", ""), M=M, N=N, K=K, bits=8, granularity="channel",
                       activations="int8 per token", flops=2.0 * M * N * K, bytes=nbytes, median_s=t,
                       gbytes_per_s=nbytes / t / 1e9, kernel_median_s=t_kernel, dense_median_s=t_dense,
                       speedup_vs_bf16=t_dense / t)
    benchmark.pedantic(run, rounds=repeats, warmup_rounds=0)


# ------------------------------------------------------------------ low-bit formats (QT-11, QT-12)
#: Quantized-KV decode shapes per device: (batch, context tokens); Llama-3-8B's attention (32
#: query heads over 8 KV heads of 128).
KV_SHAPES = {"cuda": ((8, 4096), (32, 4096)), "cpu": ((1, 256),)}
KV_BENCH_FORMATS = ("int8", "int4_kivi_r8_g8", "fp8_e4m3fn")


@pytest.mark.claim("QT-12")
@pytest.mark.parametrize("kv", KV_BENCH_FORMATS)
def test_bench_quantized_kv_decode(benchmark, device, kv, batch, context):
    """One decode step of attention over a quantized KV cache (``QuantizedKVCache``, the torch
    path: it dequantizes the held codes, then attends) against bf16 attention over the same
    cache in bf16. ``bytes``: what a fused kernel must read per step, the held codes, scales and
    full-precision tokens (measured from the tensors) plus q and the output; ``bf16_bytes`` the
    same for the bf16 cache; ``bytes_ratio_vs_bf16`` their ratio (the quantized format's memory
    gain, on any device). Times only mean something on a GPU (the torch path is no fused kernel:
    it writes the dequantized cache before attending)."""
    from inference_conformance.conformance.contracts.quantization.kv import KV_FORMATS
    from inference_conformance.optimized.quantization.kv import QuantizedKVCache
    from inference_conformance.reference.transformer import naive_attention

    Hq, Hkv, D = 32, 8, 128
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    k = randn((batch, Hkv, context, D), 0, dtype=dtype, device=device)
    v = randn((batch, Hkv, context, D), 1, dtype=dtype, device=device)
    q = randn((batch, Hq, 1, D), 2, dtype=dtype, device=device)
    fmt = KV_FORMATS[kv]
    cache = QuantizedKVCache(fmt)
    cache.attend(0, q, k[:, :, :-1], v[:, :, :-1])               # the context, held quantized
    held = cache.nbytes()
    repeats = 3 if benchmark.disabled else 20
    state = (dict(cache._segments), dict(cache._pending), dict(cache._quantized))

    def setup():                                                  # every timed step appends the same token
        cache._segments = {0: list(state[0][0])}
        cache._pending, cache._quantized = dict(state[1]), dict(state[2])

    def run():
        return cache.attend(0, q, k[:, :, -1:], v[:, :, -1:])

    t = median_seconds(run, device, repeats, setup=setup)
    kb, vb = k.to(torch.bfloat16), v.to(torch.bfloat16)
    qb = q.to(torch.bfloat16)
    t_dense = median_seconds(lambda: naive_attention(qb, kb, vb), device, repeats)
    io = 2 * q.numel() * 2
    bf16_bytes = 2 * k.numel() * 2 + io
    nbytes = held + io
    results.bench_info(benchmark, technique="quantization", backend=f"torch_kv_{kv}", device=device,
                       dtype=str(dtype).replace("torch.", ""), batch=batch, context_tokens=context, kv_format=fmt.name,
                       bits=fmt.code_bits, bytes=nbytes, bf16_bytes=bf16_bytes,
                       bytes_ratio_vs_bf16=nbytes / bf16_bytes, median_s=t, dense_median_s=t_dense,
                       flops=4.0 * batch * Hq * context * D)
    benchmark.pedantic(run, setup=setup, rounds=repeats, warmup_rounds=0)


@pytest.mark.claim("QT-11")
@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("scheme", ["fp8_e4m3fn_channel", "int8_channel"])
def test_bench_fp8_matmul(benchmark, device, backend, scheme):
    """Weight-only FP8 (E4M3 per channel) beside int8 per channel and bf16, at M = 1 on the
    first shape of the device: the Triton kernel (``optimized/quantization/quant_matmul.py``, FP8 bytes
    bitcast in registers; GPU only) and the torch path (dequantize, then torch.matmul).
    ``bytes``: the codes, scales and x/out one call must read."""
    if backend == "triton" and device != "cuda":
        pytest.skip("Triton runs under the interpreter on the CPU: its timings mean nothing (use --device cuda)")
    from inference_conformance.optimized.quantization import fp8 as quant_fp8
    from inference_conformance.optimized import quantization as quant_torch

    N, K = SHAPES[device][0]
    M = 1
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    w = randn((N, K), 0, dtype=dtype, device=device, scale=0.05)
    x = randn((M, K), 1, dtype=dtype, device=device)
    if backend == "triton":
        impl = quant_fp8.TRITON_FP8_E4M3 if scheme.startswith("fp8") else quant_torch.TRITON_SYMMETRIC
    else:
        impl = quant_fp8.FP8_E4M3 if scheme.startswith("fp8") else quant_torch.SYMMETRIC
    qw = impl.quantize(w, bits=8, granularity="channel")
    repeats = 5 if benchmark.disabled else 50

    def run():
        return impl.matmul(x, qw)

    t = median_seconds(run, device, repeats)
    t_dense = median_seconds(lambda: x @ w.T, device, repeats)
    held = sum(t_.numel() * t_.element_size() for t_ in (qw.codes, qw.scales, getattr(qw, "zeros", None))
               if isinstance(t_, torch.Tensor))
    nbytes = held + (M * K + M * N) * dtype.itemsize
    results.bench_info(benchmark, technique="quantization", backend=f"{backend}_{scheme}", device=device,
                       dtype=str(dtype).replace("torch.", ""), M=M, N=N, K=K, bits=8, granularity="channel",
                       number_format=getattr(impl, "number_format", "int"), flops=2.0 * M * N * K, bytes=nbytes,
                       median_s=t, dense_median_s=t_dense, speedup_vs_bf16=t_dense / t)
    benchmark.pedantic(run, rounds=repeats, warmup_rounds=0)


@pytest.mark.claim("QT-13")
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_bench_fp4_matmul(benchmark, device, backend):
    """Weight-only FP4 (MXFP4 blocks of 32, NVFP4 blocks of 16) beside int4 absmax g128, at M = 1
    on the first shape of the device, in one test so that the ratios share a run: the Triton
    kernel (E2M1 nibbles decoded in registers; GPU only) and the torch path (dequantize, then
    torch.matmul). extra_info: each median, ``bytes`` each call reads (FP4: the codes and the
    float32 block scales s_b * s_t the kernel reads, 4 bytes a block where the formats store 1),
    ``ratio_vs_int4_g128`` = int4's median / each FP4 median (above 1: FP4 faster) and
    ``speedup_vs_bf16``. Absolute times and ratios mean something on a GPU only."""
    if backend == "triton" and device != "cuda":
        pytest.skip("Triton runs under the interpreter on the CPU: its timings mean nothing (use --device cuda)")
    from inference_conformance.optimized import quantization as quant_torch
    from inference_conformance.optimized.quantization import fp4 as quant_fp4

    N, K = SHAPES[device][0]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    w = randn((N, K), 0, dtype=dtype, device=device, scale=0.05)
    x = randn((1, K), 1, dtype=dtype, device=device)
    tri = backend == "triton"
    schemes = {"int4_g128": (quant_torch.TRITON_SYMMETRIC if tri else quant_torch.SYMMETRIC, 128),
               "mxfp4": (quant_fp4.TRITON_MXFP4 if tri else quant_fp4.MXFP4, 32),
               "nvfp4": (quant_fp4.TRITON_NVFP4 if tri else quant_fp4.NVFP4, 16)}
    repeats = 5 if benchmark.disabled else 50
    runs, info = {}, {}
    for name, (impl, block) in schemes.items():
        qw = impl.quantize(w, bits=4, granularity=block)
        runs[name] = (lambda impl=impl, qw=qw: impl.matmul(x, qw))
        held = (qw.codes, qw.kernel_scales) if name != "int4_g128" else (qw.codes, qw.scales, qw.zeros)
        info[f"{name}_median_s"] = median_seconds(runs[name], device, repeats)
        info[f"{name}_bytes"] = sum(t_.numel() * t_.element_size() for t_ in held) + (K + N) * dtype.itemsize
    t_dense = median_seconds(lambda: x @ w.T, device, repeats)
    for name in ("mxfp4", "nvfp4"):
        info[f"{name}_ratio_vs_int4_g128"] = info["int4_g128_median_s"] / info[f"{name}_median_s"]
        info[f"{name}_speedup_vs_bf16"] = t_dense / info[f"{name}_median_s"]
    results.bench_info(benchmark, technique="quantization", backend=f"{backend}_fp4_vs_int4_g128", device=device,
                       dtype=str(dtype).replace("torch.", ""), M=1, N=N, K=K, bits=4, flops=2.0 * N * K,
                       median_s=info["mxfp4_median_s"], dense_median_s=t_dense, **info)
    benchmark.pedantic(runs["mxfp4"], rounds=repeats, warmup_rounds=0)
