"""The KV-cache formats' quantize and dequantize (claim QT-12): bytes held, measured from the stored
tensors, and time, torch against the float64 reference, in one run.

Each test quantizes and dequantizes the keys and values of one layer of Llama-3-8B's shape (8 KV
heads of 128) over ``T`` tokens in one format (int8, FP8 E4M3, int4 KIVI with R = 128, G = 32),
and records the bytes held (``bytes_held``, from the tensors; ``bytes_ratio_vs_bf16`` against
bfloat16's 2 bytes a value), the bytes moved per round trip (the input read, the stored cache
written and read, the output written), GB/s, and the time ratio to the float64 reference
(``over_reference``). With ``--impl kv_format=module:attr`` the rows ``impl``, ``impl2``, ...
time the outside implementations.

Goal for the report (not asserted; GPU): int8 and FP8 hold 0.52 of bfloat16's bytes at 4K tokens.
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.benchmarks.timing import median_seconds, rounds
from inference_conformance.conformance import results
from inference_conformance.conformance.contracts.quantization.kv import KV_FORMATS, kv_format
from inference_conformance.conformance.bench_rows import bench_backends, bench_implementation, outside_info, outside_refusals
from inference_conformance.properties.kv_format.cases import held_bytes
from inference_conformance.properties.strategies import randn

#: Tokens per device; Llama-3-8B's layer: 8 KV heads of 128.
SIZES = {"cuda": (4096, 32768), "cpu": (256,)}
HKV, D = 8, 128
FORMATS = {"int8": KV_FORMATS["int8"], "fp8_e4m3fn": KV_FORMATS["fp8_e4m3fn"],
           "int4_kivi_r128_g32": kv_format("int4_kivi", 128, 32)}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def pytest_generate_tests(metafunc):
    from inference_conformance.conformance.device import current_device

    if metafunc.definition.name == "test_bench_kv_format":
        sizes = SIZES[current_device()]
        metafunc.parametrize("T", sizes, ids=[f"T{t}" for t in sizes])


def _ops(backend: str, device: str):
    return bench_implementation("kv_format", backend, device)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("backend", bench_backends("kv_format", ("torch",)))
def test_bench_kv_format(benchmark, device, backend, fmt, T):
    ops, ref = _ops(backend, device), _ops("reference", device)
    f = FORMATS[fmt]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    k = randn((1, HKV, T, D), 1, dtype=dtype, device=device)
    v = randn((1, HKV, T, D), 2, dtype=dtype, device=device)
    repeats = 3 if benchmark.disabled else 10

    def run():
        return ops.dequantize_kv(ops.quantize_kv(k, v, format=f))

    with outside_refusals("kv_format", backend):
        t = median_seconds(run, device, repeats)
        held = held_bytes(ops.quantize_kv(k, v, format=f))
    t_ref = median_seconds(lambda: ref.dequantize_kv(ref.quantize_kv(k, v, format=f)), device, 3)
    values = 2 * HKV * T * D
    nbytes = 2 * values * dtype.itemsize + 2 * held
    results.bench_info(benchmark, technique="kv_format", backend=backend, device=device,
                       dtype=str(dtype).replace("torch.", ""), format=fmt, T=T, bytes=nbytes, flops=0.0, median_s=t,
                       gbytes_per_s=nbytes / t / 1e9, bytes_held=held, bytes_ratio_vs_bf16=held / (2 * values),
                       reference_median_s=t_ref, over_reference=t / t_ref, **outside_info("kv_format", backend))
    benchmark.pedantic(run, rounds=rounds(benchmark, t, repeats), warmup_rounds=0)
