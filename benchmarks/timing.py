"""The in-test timer the benchmarks share for ratios measured side by side in one run.

pytest-benchmark times the benchmarked call itself; a benchmark that states a ratio (prefill vs
decode, split vs unsplit, with vs without the cache) also times its comparison points with
:func:`median_seconds`, so the ratio exists even when pytest-benchmark is disabled (CI smoke runs).
"""
from __future__ import annotations

import math
import statistics
import time

import torch


def sync(device: str) -> None:
    """Wait for queued device work (a no-op on the CPU)."""
    if device == "cuda":
        torch.cuda.synchronize()


def seconds_once(fn, device: str, setup=None) -> float:
    """Wall time in seconds of one ``fn()``, the device synchronized before and after;
    ``setup()`` runs untimed first."""
    if setup:
        setup()
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def median_seconds(fn, device: str, repeats: int, setup=None, warmup: bool = True) -> float:
    """Median wall time in seconds of ``fn()`` over ``repeats`` runs, the device synchronized
    before and after each run; ``setup()`` runs untimed before each; one untimed warm-up call
    first (compile, autotune) unless ``warmup`` is False."""
    if warmup:
        if setup:
            setup()
        fn()
    return statistics.median([seconds_once(fn, device, setup) for _ in range(repeats)])


#: Most timed rounds a benchmark takes, however short its call.
MAX_ROUNDS = 2000


def rounds(benchmark, seconds_per_call: float, minimum: int) -> int:
    """Timed rounds for ``benchmark.pedantic``: enough calls of ``seconds_per_call`` to fill
    pytest-benchmark's ``--benchmark-max-time`` (as its own non-pedantic mode does), at least
    ``minimum``, at most :data:`MAX_ROUNDS`; ``minimum`` when the benchmark is disabled.

    A fixed small count (10 rounds of a 0.3 ms call) leaves the median at the mercy of a few
    disturbed rounds: on a shared CPU its run-to-run spread was 8-10% (the gate's calibration,
    ``perf/calibrate.py``); filling the time budget brings hundreds of rounds."""
    if benchmark.disabled or not seconds_per_call > 0:
        return minimum
    budget = float(getattr(benchmark, "_max_time", 0.0) or 0.0)
    return int(min(MAX_ROUNDS, max(minimum, math.ceil(budget / seconds_per_call))))


def paired_ratio(fn_a, fn_b, device: str, repeats: int, setup_a=None, setup_b=None) -> float:
    """Median over ``repeats`` of time(fn_a) / time(fn_b), the two timed back to back in
    alternating order (a, b, b, a, ...), so that a change of load on a shared machine moves both
    sides of a ratio alike; ``setup_a``/``setup_b`` run untimed before each; one untimed warm-up
    call of each first."""
    def once(fn, setup):
        return seconds_once(fn, device, setup)

    once(fn_a, setup_a)
    once(fn_b, setup_b)
    ratios = []
    for i in range(repeats):
        if i % 2:
            tb, ta = once(fn_b, setup_b), once(fn_a, setup_a)
        else:
            ta, tb = once(fn_a, setup_a), once(fn_b, setup_b)
        ratios.append(ta / tb)
    return statistics.median(ratios)
