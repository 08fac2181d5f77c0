"""The pinned benchmark environment: how a benchmark process runs (timer, intra-op threads, the
allocator's thresholds), alike for ``python -m inference_conformance.reports``, the A/B mode and the calibration, and
stored in every history entry so the gate can warn when a run and its baseline were measured
differently.
"""
from __future__ import annotations

#: glibc's allocator: a fixed mmap threshold (which also turns off its dynamic adjustment) and a
#: high trim threshold keep every allocation of a benchmark on the heap. With the defaults a CPU
#: process settles at random in one of two regimes (large tensors mmap'ed and page-faulted on
#: every call, or reused from the heap): the same naive attention call measured 5.3 ms in some
#: processes and 8.0 ms in others; pinned, 5.1-5.6 ms in every process (this 2-core machine).
MALLOC_PINS = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2 ** 20), "MALLOC_TRIM_THRESHOLD_": str(256 * 2 ** 20)}


def pinned_env(device: str, threads: int | None = None) -> dict[str, str]:
    """The environment of a benchmark process, so that runs of the same code time the same
    thing: on the CPU, ``threads`` intra-op threads (default 1: with one thread the process's
    CPU time is the work, whatever the neighbours on a shared runner) and the allocator pins
    (:data:`MALLOC_PINS`); on CUDA, ``threads`` only when given. ``threads=0``: torch's default."""
    if device == "cuda":
        return {"OMP_NUM_THREADS": str(threads)} if threads else {}
    threads = 1 if threads is None else threads
    return dict(MALLOC_PINS, **({"OMP_NUM_THREADS": str(threads)} if threads else {}))


#: pytest-benchmark's timer per timer name: process CPU time (insensitive to time slicing by the
#: neighbours of a shared CPU runner, with one intra-op thread) or wall time (GPUs).
TIMERS = {"cpu": "time.process_time", "wall": "time.perf_counter"}


def bench_settings(device: str, timer: str | None = None, threads: int | None = None) -> dict:
    """How a benchmark process runs on ``device``: {"timer", "env", "pytest_args"}; the default
    timer is "cpu" on the CPU and "wall" on CUDA, the environment :func:`pinned_env`. Stored in
    history entries: the gate warns when a run and its baseline were measured differently.
    Raises ValueError for an unknown ``timer``."""
    timer = timer or ("wall" if device == "cuda" else "cpu")
    if timer not in TIMERS:
        raise ValueError(f"timer must be one of {sorted(TIMERS)}, got {timer!r}")
    return {"timer": timer, "env": pinned_env(device, threads),
            "pytest_args": [f"--benchmark-timer={TIMERS[timer]}"]}


def is_pinned(device: str, environ: dict) -> bool:
    """Whether a process environment ``environ`` (a mapping of variable names to strings) holds
    the pinned benchmark environment of ``device`` ("cpu" or "cuda"): on the CPU the allocator
    pins (:data:`MALLOC_PINS`) with their values and a fixed ``OMP_NUM_THREADS``; on CUDA
    nothing is pinned beyond the timer, so always True. Raises ValueError for another device."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda":
        return True
    return all(environ.get(k) == v for k, v in MALLOC_PINS.items()) and bool(environ.get("OMP_NUM_THREADS"))
