"""The FP8 cast's throughput (claim QT-11): PyTorch's cast against the float64 reference, in one run.

Each test casts one float32 (CPU) or bfloat16 (CUDA) tensor of ``numel`` values to E4M3fn with
saturation (the cast a quantized KV cache or an FP8 matmul's activations go through), times the
backend and the float64 reference with synchronised medians, and records the bytes moved (numel
values read, numel bytes written), GB/s, the time ratio backend / reference (``over_reference``)
and the reference's median. The cast is memory-bound: a fused kernel's figure of merit is GB/s
against the device's copy bandwidth. With ``--impl fp8_cast=module:attr`` the rows ``impl``,
``impl2``, ... time the outside implementations.

Goal for the report (not asserted; GPU): the torch cast at >= 50% of the device's copy bandwidth.
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.benchmarks.timing import median_seconds, rounds
from inference_conformance.conformance import results
from inference_conformance.conformance.bench_rows import bench_backends, bench_implementation, outside_info, outside_refusals
from inference_conformance.properties.strategies import randn

#: Values per cast, per device.
SIZES = {"cuda": (1 << 20, 1 << 26), "cpu": (1 << 16,)}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def pytest_generate_tests(metafunc):
    from inference_conformance.conformance.device import current_device

    if metafunc.definition.name == "test_bench_fp8_cast":
        sizes = SIZES[current_device()]
        metafunc.parametrize("numel", sizes, ids=[f"n{n}" for n in sizes])


def _cast_fn(backend: str, device: str):
    return bench_implementation("fp8_cast", backend, device)


@pytest.mark.parametrize("backend", bench_backends("fp8_cast", ("torch",)))
def test_bench_fp8_cast(benchmark, device, backend, numel):
    fn = _cast_fn(backend, device)
    ref = _cast_fn("reference", device)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x = randn((numel,), 1, dtype=dtype, device=device, scale=100.0)
    repeats = 3 if benchmark.disabled else 20

    def run():
        return fn(x, format="e4m3fn", saturate=True)

    with outside_refusals("fp8_cast", backend):
        t = median_seconds(run, device, repeats)
    t_ref = median_seconds(lambda: ref(x, format="e4m3fn", saturate=True), device, max(3, repeats // 4))
    nbytes = numel * (dtype.itemsize + 1)
    results.bench_info(benchmark, technique="fp8_cast", backend=backend, device=device,
                       dtype=str(dtype).replace("torch.", ""), numel=numel, bytes=nbytes, flops=0.0, median_s=t,
                       gbytes_per_s=nbytes / t / 1e9, reference_median_s=t_ref, over_reference=t / t_ref,
                       **outside_info("fp8_cast", backend))
    benchmark.pedantic(run, rounds=rounds(benchmark, t, repeats), warmup_rounds=0)
