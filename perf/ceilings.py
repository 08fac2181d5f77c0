"""The device's own ceilings, measured: copy bandwidth and matmul peak per dtype.

Benchmarks report achieved FLOP/s and bytes/s as fractions of these measured ceilings (and of
the roofline bound at the kernel's intensity), so a figure means the same on a laptop CPU, a CI
runner and an H200. Spec sheets (``inference_conformance.reference.roofline.ACCELERATORS``) are what the lectures use
(claim AI-4); the measured ceilings are what a kernel can actually reach on this machine.

Method:
- copy bandwidth: ``dst.copy_(src)`` of one large contiguous tensor; bytes moved = 2 x size
  (read + write); median over many runs after warm-up runs.
- matmul peak: square ``a @ b`` (n x n) per dtype at a few sizes, 2n^3 FLOPs; the median of each
  size, the best size reported.
- timing: on CUDA, CUDA events around each run after a device synchronize (L2 is smaller than
  the copy, so the copy streams from HBM); on CPU, ``time.perf_counter`` around each run.

The measurement is cached per process and per (device, quick).
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Callable

import torch

from inference_conformance.perf.env import cpu_model
from inference_conformance.reference.roofline import attainable

_CACHE: dict[tuple[str, bool], dict] = {}

# (copy MiB, matmul sizes) per device and mode; CPU sizes keep the whole measurement to seconds.
# Quick mode is for tests and the report's header: its copy still exceeds most L2 caches (a
# 16 MiB source and destination), but small matmuls stay far below the CPU's peak.
_PLAN = {
    ("cpu", True): (16, (64, 128)),
    ("cpu", False): (64, (512, 1024)),
    ("cuda", True): (256, (2048, 4096)),
    ("cuda", False): (2048, (2048, 4096, 8192)),
}
_DTYPES = {"cpu": (torch.bfloat16, torch.float32),
           "cuda": (torch.bfloat16, torch.float16, torch.float32)}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _time_runs(fn: Callable[[], object], device: str, *, warmup: int, runs: int,
               budget_s: float) -> list[float]:
    """Seconds of each of up to ``runs`` calls of ``fn`` after ``warmup`` untimed calls; stops
    early (after at least 3 runs) once ``budget_s`` of timed work is spent."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    if device == "cuda":
        torch.cuda.synchronize()
        spent = 0.0
        for _ in range(runs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            t = start.elapsed_time(end) / 1e3
            times.append(t)
            spent += t
            if spent > budget_s and len(times) >= 3:
                break
        return times
    spent = 0.0
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        t = time.perf_counter() - t0
        times.append(t)
        spent += t
        if spent > budget_s and len(times) >= 3:
            break
    return times


def _measure_copy(device: str, mib: int, quick: bool) -> tuple[float, dict]:
    n = mib * 2**20 // 4
    src = torch.rand(n, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    times = _time_runs(lambda: dst.copy_(src), device, warmup=3 if quick else 5,
                       runs=10 if quick else 50, budget_s=0.1 if quick else 0.5)
    moved = 2 * src.numel() * src.element_size()
    med = statistics.median(times)
    return moved / med, {"bytes_moved": moved, "runs": len(times), "median_s": med}


def _measure_matmul(device: str, dtype: torch.dtype, sizes, quick: bool) -> tuple[float, dict]:
    best, per_size = 0.0, {}
    g = torch.Generator(device="cpu").manual_seed(0)
    for n in sizes:
        a = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
        b = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
        times = _time_runs(lambda: a @ b, device, warmup=2 if quick else 3,
                           runs=5 if quick else 20, budget_s=0.05 if quick else 0.3)
        flops = 2 * n**3 / statistics.median(times)
        per_size[n] = flops
        best = max(best, flops)
    return best, per_size


def measure_ceilings(device: str = "cpu", quick: bool = False) -> dict:
    """Measure this device's copy bandwidth and matmul peak; cached per process.

    device: "cpu" or "cuda"; quick: tiny sizes (well under a second on CPU) for tests.
    Returns a dict with ``copy_bytes_per_s`` (float, bytes/s, read + write),
    ``matmul_flops_per_s`` ({dtype name: FLOP/s, best size}), ``matmul_by_size``
    ({dtype name: {n: FLOP/s}}), ``method`` (str), ``sizes`` ({"copy_bytes": int,
    "matmul_n": [int]}), ``device``, ``device_name``, ``threads``, ``quick``.
    Raises ValueError for an unknown device or "cuda" without CUDA.
    """
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch.cuda.is_available() is False")
    key = (device, bool(quick))
    if key in _CACHE:
        return _CACHE[key]
    mib, sizes = _PLAN[key]
    copy_bw, copy_info = _measure_copy(device, mib, quick)
    peaks, by_size = {}, {}
    for dtype in _DTYPES[device]:
        peaks[_dtype_name(dtype)], by_size[_dtype_name(dtype)] = _measure_matmul(device, dtype, sizes, quick)
    if device == "cuda":
        name = torch.cuda.get_device_name()
        timer = "CUDA events per run, device synchronized, warm-up excluded"
        tf32 = f"; fp32 matmul allow_tf32={torch.backends.cuda.matmul.allow_tf32}"
    else:
        name = cpu_model()
        timer = "time.perf_counter per run, warm-up excluded"
        tf32 = ""
    out = {
        "device": device,
        "device_name": name,
        "threads": torch.get_num_threads(),
        "quick": bool(quick),
        "copy_bytes_per_s": copy_bw,
        "matmul_flops_per_s": peaks,
        "matmul_by_size": by_size,
        "method": (f"copy: dst.copy_(src), {mib} MiB fp32, bytes = read + write, median of "
                   f"{copy_info['runs']} runs; matmul: n x n @ n x n, 2n^3 FLOPs, median per size, "
                   f"best size; {timer}{tf32}"),
        "sizes": {"copy_bytes": copy_info["bytes_moved"] // 2, "matmul_n": list(sizes)},
    }
    _CACHE[key] = out
    return out


def fraction_of_ceiling(flops: float, bytes: float, seconds: float, ceilings: dict,
                        dtype: str = "bfloat16") -> dict:
    """How close a kernel that did ``flops`` FLOPs and moved ``bytes`` bytes in ``seconds`` came
    to this device's measured ceilings.

    Returns achieved_flops_per_s, achieved_bytes_per_s, intensity (FLOP/byte), flops_fraction
    (of the ``dtype`` matmul peak), bytes_fraction (of copy bandwidth), ridge (peak / bandwidth),
    attainable_flops_per_s (the roofline min(peak, intensity x bandwidth)), roofline_fraction
    (achieved / attainable = max(flops_fraction, bytes_fraction): the time the roofline allows
    divided by the time taken) and bound ("memory" or "compute").
    Raises ValueError for negative counts, non-positive seconds, or a dtype not measured.
    """
    for name, v in (("flops", flops), ("bytes", bytes)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"seconds must be a finite number > 0, got {seconds!r}")
    peaks = ceilings["matmul_flops_per_s"]
    if dtype not in peaks:
        raise ValueError(f"dtype {dtype!r} was not measured; measured: {sorted(peaks)}")
    peak, bw = float(peaks[dtype]), float(ceilings["copy_bytes_per_s"])
    achieved_f, achieved_b = flops / seconds, bytes / seconds
    ai = flops / bytes if bytes else math.inf
    bound_flops = peak if math.isinf(ai) else attainable(ai, peak, bw)
    ridge = peak / bw
    return {
        "achieved_flops_per_s": achieved_f,
        "achieved_bytes_per_s": achieved_b,
        "intensity": ai,
        "flops_fraction": achieved_f / peak,
        "bytes_fraction": achieved_b / bw,
        "ridge": ridge,
        "attainable_flops_per_s": bound_flops,
        # = achieved / attainable when flops > 0; also defined for a pure copy (flops = 0)
        "roofline_fraction": max(achieved_f / peak, achieved_b / bw),
        "bound": "memory" if ai < ridge else "compute",
    }
