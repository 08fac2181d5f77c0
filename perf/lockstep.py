"""Lockstep A/B: two benchmark processes (sides A and B) that take turns, never timing at once.

A pytest plugin, active only when loaded explicitly (``pytest benchmarks -p inference_conformance.perf.lockstep``)
**and** when ``BENCH_LOCKSTEP_DIR`` names a folder shared by the two processes; each process
states its side in ``BENCH_LOCKSTEP_SIDE`` (``a`` or ``b``). :func:`inference_conformance.perf.ab.session` starts
both sides together when ``lockstep=True``.

Why: in sequential A/B passes, side A's run of a benchmark and side B's run of it are a whole
pass apart (seconds to minutes), so a change of the machine's state in between (a neighbour
starting on a shared runner, a clock change) lands in the paired ratio. In lockstep the two
sides hold one token between them and only its holder runs:

- after collection each side writes its list of test ids and reads the other's; the tests both
  sides have (the *common* tests) run first, in side A's order, so both sides meet the same
  benchmark at the same time;
- a side takes the token before each test (setup, call, teardown) and gives it back after it;
- inside a benchmark's timed loop (``benchmark.pedantic``), the holder gives the token back
  between two rounds every ``BENCH_LOCKSTEP_CHUNK`` seconds (default 0.05) of wall time, outside
  the timed region, and waits for it to come back: the two sides' rounds of a benchmark then
  alternate in slices of about 50 ms, so both see the same neighbours and clocks;
- a side waits at most ``BENCH_LOCKSTEP_TIMEOUT`` seconds (default 600) for the token, and not
  at all once the other side has exited, so a crashed side never hangs its partner;
- each side appends (test id, first start, last end) of its tests to ``timeline-SIDE.jsonl`` and
  every token hand-over to ``handovers-SIDE`` (a count), for checking afterwards.

``BENCH_LOCKSTEP_FIRST`` (``a`` or ``b``, default ``a``) chooses who holds the token first;
:func:`inference_conformance.perf.ab.session` alternates it between pairs. A run's side of the token lives in
its ``config.stash`` (:func:`state`), never in the module.
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import pytest

DIR_ENV, SIDE_ENV, FIRST_ENV, TIMEOUT_ENV, CHUNK_ENV = (
    "BENCH_LOCKSTEP_DIR", "BENCH_LOCKSTEP_SIDE", "BENCH_LOCKSTEP_FIRST", "BENCH_LOCKSTEP_TIMEOUT",
    "BENCH_LOCKSTEP_CHUNK")
SIDES = ("a", "b")
POLL_S = 0.0005


def other(side: str) -> str:
    return "b" if side == "a" else "a"


def common_order(items_a: list[str], items_b: list[str]) -> list[str]:
    """The common test ids, in side A's order."""
    in_b = set(items_b)
    return [i for i in items_a if i in in_b]


class Lockstep:
    """One side's end of the shared token (see the module docstring)."""

    def __init__(self, folder: str | Path, side: str, first: str = "a", timeout: float = 600.0,
                 chunk: float = 0.05):
        if side not in SIDES:
            raise ValueError(f"{SIDE_ENV} must be 'a' or 'b', got {side!r}")
        if first not in SIDES:
            raise ValueError(f"{FIRST_ENV} must be 'a' or 'b', got {first!r}")
        if not chunk > 0:
            raise ValueError(f"{CHUNK_ENV} must be > 0 seconds, got {chunk!r}")
        self.dir, self.side, self.first = Path(folder), side, first
        self.timeout, self.chunk = timeout, chunk
        self.holding = False
        self.held_since = 0.0
        self.handovers = 0
        self.unpaired = 0
        self._started: float | None = None

    def _write(self, name: str, text: str) -> None:
        tmp = self.dir / f".{name}.{os.getpid()}"
        tmp.write_text(text)
        os.replace(tmp, self.dir / name)

    def _read(self, name: str) -> str | None:
        try:
            return (self.dir / name).read_text()
        except FileNotFoundError:
            return None

    def other_exited(self) -> bool:
        return (self.dir / f"exit-{other(self.side)}").exists()

    def turn(self) -> str:
        return self._read("turn") or self.first

    def wait(self, ready) -> bool:
        """Poll until ``ready()`` (True) or the other side exited or the timeout passed (False)."""
        deadline = time.monotonic() + self.timeout
        while not ready():
            if self.other_exited() or time.monotonic() > deadline:
                return ready()
            time.sleep(POLL_S)
        return True

    def exchange(self, my_items: list[str]) -> list[str]:
        """Publish this side's test ids, wait for the other's; returns the common ids (A's order)."""
        self._write(f"items-{self.side}.json", json.dumps(my_items))
        theirs: list[str] = []

        def got() -> bool:
            text = self._read(f"items-{other(self.side)}.json")
            if text is not None:
                theirs[:] = json.loads(text)
            return text is not None

        if not self.wait(got):
            return []
        a, b = (my_items, theirs) if self.side == "a" else (theirs, my_items)
        return common_order(a, b)

    def acquire(self) -> None:
        if not self.holding:
            if not self.wait(lambda: self.turn() == self.side):
                self.unpaired += 1
            self.holding, self.held_since = True, time.perf_counter()

    def release(self) -> None:
        if self.holding:
            self.holding = False
            self.handovers += 1
            self._write("turn", other(self.side))

    def maybe_hand_over(self) -> None:
        """Between two timed rounds: after ``chunk`` seconds holding the token, let the other run."""
        if self.holding and time.perf_counter() - self.held_since >= self.chunk:
            self.release()
            self.acquire()

    def before(self, nodeid: str) -> None:
        self.acquire()
        self._started = time.time()

    def after(self, nodeid: str) -> None:
        with (self.dir / f"timeline-{self.side}.jsonl").open("a") as f:
            f.write(json.dumps({"nodeid": nodeid, "start": self._started, "end": time.time()}) + "\n")
        self.release()

    def exit(self) -> None:
        self.release()
        self._write(f"handovers-{self.side}", str(self.handovers))
        self._write(f"exit-{self.side}", str(self.unpaired))


#: Where a pytest run keeps its side of the token (None without lockstep): the run owns it.
STATE_KEY = pytest.StashKey["Lockstep | None"]()


def state(config) -> Lockstep | None:
    """This run's side of the token (``config.stash``), None without lockstep or before collection."""
    return config.stash.get(STATE_KEY, None) if config is not None else None


def _from_env() -> Lockstep | None:
    folder = os.environ.get(DIR_ENV)
    if not folder:
        return None
    return Lockstep(folder, os.environ.get(SIDE_ENV, ""), os.environ.get(FIRST_ENV, "a"),
                    float(os.environ.get(TIMEOUT_ENV, "600")), float(os.environ.get(CHUNK_ENV, "0.05")))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """After -k/-m deselection: exchange the lists; common tests in A's order, the rest after."""
    ls = config.stash[STATE_KEY] = _from_env()
    if ls is None:
        return
    order = {n: i for i, n in enumerate(ls.exchange([it.nodeid for it in items]))}
    items.sort(key=lambda it: order.get(it.nodeid, len(order)))


def _handing_over_setup(ls: Lockstep, setup):
    """A pedantic ``setup`` (run before each round, outside the timed region) that first lets the
    other side run when this side has held the token for a chunk."""
    def wrapped():
        ls.maybe_hand_over()
        return setup() if setup is not None else None

    return wrapped


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    ls = state(item.config)
    if ls is not None:
        ls.before(item.nodeid)
    yield
    if ls is not None:
        ls.after(item.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    ls = state(item.config)
    bench = getattr(item, "funcargs", {}).get("benchmark") if ls is not None else None
    if bench is not None and not bench.disabled:
        raw = bench._raw_pedantic

        def pedantic(target, args=(), kwargs=None, setup=None, *a, iterations=1, **kw):
            if iterations != 1:  # pytest-benchmark refuses a setup with iterations > 1
                return raw(target, args, kwargs, setup, *a, iterations=iterations, **kw)
            return raw(target, args, kwargs, _handing_over_setup(ls, setup), *a, iterations=iterations, **kw)

        bench._raw_pedantic = pedantic
    yield


@contextlib.contextmanager
def exclusive(config):
    """Hold the token for a block of work outside the tests (a probe at the end of the session),
    so that it never runs while the other side is timing; a no-op without lockstep. ``config``:
    the pytest run's config (whose stash holds the token)."""
    ls = state(config)
    if ls is None:
        yield
        return
    ls.acquire()
    try:
        yield
    finally:
        ls.release()


def pytest_unconfigure(config):
    ls = state(config)
    if ls is not None:
        ls.exit()
