"""Lockstep A/B: two benchmark processes (sides A and B) that take turns benchmark by benchmark.

A pytest plugin, active only when loaded explicitly (``pytest benchmarks -p reports.lockstep``)
**and** when ``BENCH_LOCKSTEP_DIR`` names a folder shared by the two processes; each process
states its side in ``BENCH_LOCKSTEP_SIDE`` (``a`` or ``b``). :func:`reports.ab.session` starts
both sides together when ``lockstep=True``.

Why: in sequential A/B passes, side A's run of a benchmark and side B's run of it are a whole
pass apart (seconds to minutes), so a change of the machine's state in between (a neighbour
starting on a shared runner, a clock change) lands in the paired ratio. In lockstep the two
runs of every benchmark are adjacent in time and never overlap:

- after collection each side writes its list of test ids and reads the other's; the tests both
  sides have (the *common* tests) run in side A's order;
- common test i runs on both sides, one after the other, never at the same time; the side that
  goes first alternates, A B | B A | A B | ... (so a drift within the session favours neither
  side), and a side waits, without working, while the other runs its turn (setup, call and
  teardown of the test: the whole protocol);
- each side appends (test id, start, end) of its common tests to ``timeline-SIDE.jsonl``, so
  the alternation can be checked afterwards;
- a test only one side has runs without waiting (unpaired); a side waits at most
  ``BENCH_LOCKSTEP_TIMEOUT`` seconds (default 600) for the other, which also stops waiting
  once the other side has exited, so a crashed side never hangs its partner.

``BENCH_LOCKSTEP_FIRST`` (``a`` or ``b``, default ``a``) chooses who goes first on common test 0;
:func:`reports.ab.session` alternates it between pairs.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

DIR_ENV, SIDE_ENV, FIRST_ENV, TIMEOUT_ENV = ("BENCH_LOCKSTEP_DIR", "BENCH_LOCKSTEP_SIDE",
                                             "BENCH_LOCKSTEP_FIRST", "BENCH_LOCKSTEP_TIMEOUT")
SIDES = ("a", "b")
POLL_S = 0.002


def other(side: str) -> str:
    return "b" if side == "a" else "a"


def first_side(index: int, first: str = "a") -> str:
    """Which side runs common test ``index`` first: ``first`` on even indices, the other on odd
    ones (A B | B A | A B ...)."""
    return first if index % 2 == 0 else other(first)


def runs_needed(side: str, index: int, first: str = "a") -> int:
    """How many common tests the other side must have finished before ``side`` may run common
    test ``index``: ``index`` when ``side`` goes first on it, ``index + 1`` when it goes second."""
    return index if first_side(index, first) == side else index + 1


def common_order(items_a: list[str], items_b: list[str]) -> list[str]:
    """The common test ids, in side A's order."""
    in_b = set(items_b)
    return [i for i in items_a if i in in_b]


class Lockstep:
    """One side's view of the shared folder (see the module docstring)."""

    def __init__(self, folder: str | Path, side: str, first: str = "a", timeout: float = 600.0):
        if side not in SIDES:
            raise ValueError(f"{SIDE_ENV} must be 'a' or 'b', got {side!r}")
        if first not in SIDES:
            raise ValueError(f"{FIRST_ENV} must be 'a' or 'b', got {first!r}")
        self.dir, self.side, self.first, self.timeout = Path(folder), side, first, timeout
        self.index: dict[str, int] = {}
        self.done = 0
        self.unpaired = 0

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

    def other_progress(self) -> int:
        text = self._read(f"progress-{other(self.side)}")
        return int(text) if text else 0

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
        order = common_order(a, b)
        self.index = {n: i for i, n in enumerate(order)}
        return order

    def before(self, nodeid: str) -> None:
        i = self.index.get(nodeid)
        if i is None:
            return
        need = runs_needed(self.side, i, self.first)
        if not self.wait(lambda: self.other_progress() >= need):
            self.unpaired += 1
        self._started = time.time()

    def after(self, nodeid: str) -> None:
        if nodeid in self.index:
            with (self.dir / f"timeline-{self.side}.jsonl").open("a") as f:
                f.write(json.dumps({"nodeid": nodeid, "start": self._started, "end": time.time()}) + "\n")
            self.done = self.index[nodeid] + 1
            self._write(f"progress-{self.side}", str(self.done))

    def exit(self) -> None:
        self._write(f"exit-{self.side}", str(self.unpaired))


_state: Lockstep | None = None


def _from_env() -> Lockstep | None:
    folder = os.environ.get(DIR_ENV)
    if not folder:
        return None
    return Lockstep(folder, os.environ.get(SIDE_ENV, ""), os.environ.get(FIRST_ENV, "a"),
                    float(os.environ.get(TIMEOUT_ENV, "600")))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """After -k/-m deselection: exchange the lists; common tests in A's order, the rest after."""
    global _state
    _state = _from_env()
    if _state is None:
        return
    order = {n: i for i, n in enumerate(_state.exchange([it.nodeid for it in items]))}
    items.sort(key=lambda it: order.get(it.nodeid, len(order)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _state is not None:
        _state.before(item.nodeid)
    yield
    if _state is not None:
        _state.after(item.nodeid)


def pytest_unconfigure(config):
    if _state is not None:
        _state.exit()
