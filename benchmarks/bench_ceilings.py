"""This device's ceilings (copy bandwidth, matmul peak per dtype) and its accelerator intensity.

Claim AI-4: accelerator intensity = FLOP/s / bytes/s (lecture: H100 about 295, from spec sheets).
Here both are measured on the machine running the suite (perf/ceilings.py), so other
benchmarks' fractions of ceiling and roofline bounds refer to the same device. The timed body
is one copy of the tensor the bandwidth ceiling was measured on.
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.conformance import results
from inference_conformance.perf.ceilings import fraction_of_ceiling, measure_ceilings
from inference_conformance.reference.roofline import ACCELERATORS


def _spec_for(device_name: str):
    for key, acc in ACCELERATORS.items():
        if key in device_name.upper():
            return acc
    return None


@pytest.mark.claim("AI-4")
def test_bench_ceilings(benchmark, device):
    c = measure_ceilings(device, quick=False)
    peaks, bw = c["matmul_flops_per_s"], c["copy_bytes_per_s"]
    intensity = {dt: f / bw for dt, f in peaks.items()}

    n = c["sizes"]["copy_bytes"] // 4
    src = torch.rand(n, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)

    def copy():
        dst.copy_(src)
        if device == "cuda":
            torch.cuda.synchronize()

    benchmark(copy)
    torch.testing.assert_close(dst, src, rtol=0, atol=0)

    info = {"claim": "AI-4", "device": device, "device_name": c["device_name"], "threads": c["threads"],
            "copy_bytes_per_s": bw, "matmul_flops_per_s": peaks,
            "accelerator_intensity": intensity, "method": c["method"], "sizes": c["sizes"]}
    stats = getattr(benchmark, "stats", None)
    if stats is not None and getattr(stats, "stats", None) is not None:
        info["timed_copy"] = fraction_of_ceiling(0, 2 * n * 4, stats.stats.median, c, dtype="float32")
    spec = _spec_for(c["device_name"]) if device == "cuda" else None
    if spec is not None:
        info["spec"] = {"name": spec.name, "bandwidth_fraction": bw / spec.bandwidth,
                        "bf16_peak_fraction": peaks.get("bfloat16", 0.0) / spec.peak_flops,
                        "spec_intensity": spec.intensity}
    results.bench_info(benchmark, **info)

    assert bw > 0 and all(f > 0 for f in peaks.values())
    # the lecture's figure is an H100's: on any other device the two are shown apart, never compared
    same = "H100" in c["device_name"].upper()
    results.record("AI-4", measured=intensity["bfloat16"],
                   lecture="H100 ≈ 295 (spec sheet)" if same else None,
                   unit=f"FLOP/byte measured on {c['device_name']} (bf16 matmul peak / copy bandwidth)"
                        + ("" if same else "; the lecture's H100 ≈ 295 is another device's"),
                   rule=f"{device}: {c['device_name']}", copy_bytes_per_s=bw, matmul_flops_per_s=peaks,
                   per_dtype_intensity=intensity)
