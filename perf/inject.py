"""A controlled, proportional slowdown of chosen benchmarks: the gate's power is measured against it.

A pytest plugin, active only when loaded explicitly (``pytest benchmarks -p inference_conformance.perf.inject``)
**and** when the environment variable ``BENCH_INJECT_SLOWDOWN`` is set, so normal runs (the
report, CI, ``python -m inference_conformance.reports``) never see it::

    BENCH_INJECT_SLOWDOWN="test_bench_decode[2048-B1H8-torch]=0.15" pytest benchmarks -p inference_conformance.perf.inject ...

Format: ``PATTERN=FRACTION[,PATTERN=FRACTION...]``; a benchmark whose node id contains PATTERN
has every timed call (``benchmark(fn)`` and ``benchmark.pedantic(fn, ...)``) followed by a busy
wait of FRACTION x that call's own duration, inside the timed region, both measured with
pytest-benchmark's timer (``--benchmark-timer``: wall time by default, CPU time with
``time.process_time``): the benchmark becomes (1 + FRACTION) times slower, whatever the
machine's speed at that moment, as a slower kernel would (a busy wait keeps the core occupied,
as work does; ``time.sleep`` would free it).

When ``BENCH_CEILINGS_OUT`` names a file, the plugin also measures the device's quick ceilings
(:func:`inference_conformance.perf.ceilings.measure_ceilings` with ``quick=True``) at the end of the session (holding
the lockstep token, :func:`inference_conformance.perf.lockstep.exclusive`, when the pass runs in lockstep) and
writes them there as JSON: the calibration (:mod:`inference_conformance.perf.calibrate`) uses them to test whether
normalising by the run's machine speed reduces the between-run noise.
"""
from __future__ import annotations

import functools
import json
import os
import time

import pytest

ENV = "BENCH_INJECT_SLOWDOWN"
CEILINGS_ENV = "BENCH_CEILINGS_OUT"


def parse(spec: str | None) -> list[tuple[str, float]]:
    """``"PAT=0.15,PAT2=0.3"`` -> [("PAT", 0.15), ("PAT2", 0.3)]; "" or None -> [].

    Raises ValueError when an item has no ``=``, an empty pattern, or a fraction that is not a
    finite number in (0, 10].
    """
    out = []
    for item in (spec or "").split(","):
        item = item.strip()
        if not item:
            continue
        pat, sep, frac = item.rpartition("=")
        if not sep or not pat:
            raise ValueError(f"{ENV}: expected PATTERN=FRACTION, got {item!r}")
        try:
            f = float(frac)
        except ValueError:
            raise ValueError(f"{ENV}: fraction of {pat!r} must be a number, got {frac!r}") from None
        if not (0 < f <= 10):
            raise ValueError(f"{ENV}: fraction of {pat!r} must be in (0, 10], got {f}")
        out.append((pat, f))
    return out


def fraction_for(nodeid: str, spec: list[tuple[str, float]]) -> float:
    """The slowdown fraction for a node id (the first matching pattern), 0.0 when none matches."""
    for pat, f in spec:
        if pat in nodeid:
            return f
    return 0.0


#: Longest stretch of the busy wait between two readings of the benchmark's clock (seconds).
SPIN_STEP_S = 5e-5


def busy_until(clock, end: float) -> None:
    """Keep the core busy until ``clock() >= end``. The clock is read every :data:`SPIN_STEP_S`
    of wall time, not in a tight loop: a CPU-time clock is a system call, and thousands of them
    disturb the caches the next call of the benchmark finds (the injected slowdown then
    overshoots its fraction)."""
    now = clock()
    while now < end:
        stop = time.perf_counter() + min(SPIN_STEP_S, end - now)
        while time.perf_counter() < stop:
            pass
        now = clock()


def slowed(fn, fraction: float, clock=time.perf_counter):
    """``fn`` followed by a busy wait of ``fraction`` x its own duration on ``clock``."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = clock()
        out = fn(*args, **kwargs)
        t1 = clock()
        busy_until(clock, t1 + fraction * (t1 - t0))
        return out

    return wrapper


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    spec = parse(os.environ.get(ENV))
    frac = fraction_for(item.nodeid, spec) if spec else 0.0
    bench = getattr(item, "funcargs", {}).get("benchmark") if frac else None
    if bench is not None:
        raw, raw_pedantic = bench._raw, bench._raw_pedantic
        clock = getattr(bench, "_timer", None) or time.perf_counter
        bench._raw = lambda fn, *a, **kw: raw(slowed(fn, frac, clock), *a, **kw)
        bench._raw_pedantic = lambda target, *a, **kw: raw_pedantic(slowed(target, frac, clock), *a, **kw)
        bench.extra_info["injected_slowdown"] = frac
    yield


def pytest_sessionfinish(session):
    path = os.environ.get(CEILINGS_ENV)
    if not path:
        return
    try:
        from inference_conformance.perf.ceilings import measure_ceilings
        from inference_conformance.conformance.device import current_device
        from inference_conformance.perf.lockstep import exclusive

        with exclusive(session.config):
            c = measure_ceilings(current_device(), quick=True)
        doc = {"copy_bytes_per_s": c["copy_bytes_per_s"], "matmul_flops_per_s": c["matmul_flops_per_s"]}
    except Exception as exc:  # noqa: BLE001 - a failed probe is recorded, never fatal
        doc = {"error": f"{type(exc).__name__}: {exc}"}
    with open(path, "w") as f:
        json.dump(doc, f)
