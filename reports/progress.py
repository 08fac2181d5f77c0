"""Progress of the main job's pytest stages, and the summary of the results it took from the
experiment cache.

As a pytest plugin (``-p inference_conformance.reports.progress``; ``python -m
inference_conformance.reports`` loads it in its pytest stages) it prints, at most every
``INFERENCE_CONFORMANCE_PROGRESS_EVERY`` seconds (default 20) and when the stage ends, one line::

    progress: 412/1905 tests (22%), 1m35s elapsed, about 5m40s left, load 6.3 on 2 cores

The estimate is the time per test measured since the first test finished times the tests left (a
stage whose slow tests come last finishes later than it says); until a few tests have finished
over a few seconds the line says "estimating the time left". The load average is shown where it
is above the machine's cores: the stage shares them, and takes longer than on an idle machine. Under pytest-xdist the controller counts what
its workers
report; the workers print nothing. Loaded nowhere else: an ordinary pytest run is untouched.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

EVERY_ENV = "INFERENCE_CONFORMANCE_PROGRESS_EVERY"


def clock(seconds: float) -> str:
    """``seconds`` (>= 0) as "42s", "3m05s" or "1h02m". Raises ValueError for a negative or
    non-finite number."""
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"seconds must be finite and >= 0, got {seconds!r}")
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


#: An estimate needs this many tests finished after the first one, over at least this many seconds.
MIN_TESTS, MIN_SECONDS = 3, 5.0


def load_note(load: float | None = None, cores: int | None = None) -> str:
    """", load 6.3 on 2 cores" when the machine's 1-minute load average is above its core count
    (the estimate then runs long: the stage shares the cores); "" otherwise or where the load
    cannot be read. ``load``, ``cores``: the figures to judge (default: this machine's)."""
    try:
        load = os.getloadavg()[0] if load is None else load
    except (AttributeError, OSError):
        return ""
    cores = cores or len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (cores or os.cpu_count() or 1)
    return f", load {load:.1f} on {cores} core{'s' if cores != 1 else ''}" if load > cores else ""


@dataclass
class Progress:
    """Tests done of ``total`` since ``start`` (``time.monotonic`` seconds); ``first_at`` and
    ``first_done``: when the first test finished and how many had then (:meth:`finished`): the
    rate is measured from there, so that the stage's start (imports, collection, the first
    test's compilation) is not taken for the time of a test."""

    total: int = 0
    done: int = 0
    start: float = field(default_factory=time.monotonic)
    shown: float = 0.0
    first_at: float | None = None
    first_done: int = 0

    def finished(self, now: float) -> None:
        """One more test finished at ``now``."""
        self.done += 1
        if self.first_at is None:
            self.first_at, self.first_done = now, self.done

    def line(self, now: float | None = None, load: str | None = None) -> str:
        """The progress line at ``now`` (default: the current monotonic time): the estimate of
        the time left once :data:`MIN_TESTS` tests finished after the first over at least
        :data:`MIN_SECONDS` (the measured rate times the tests left), "estimating" before;
        ``load``: what :func:`load_note` says (default: asked at each line)."""
        now = time.monotonic() if now is None else now
        elapsed = max(0.0, now - self.start)
        pct = f" ({100 * self.done // self.total}%)" if self.total else ""
        text = f"progress: {self.done}/{self.total or '?'} tests{pct}, {clock(elapsed)} elapsed"
        if 0 < self.done < self.total:
            measured = self.done - self.first_done
            span = now - self.first_at if self.first_at is not None else 0.0
            if measured >= MIN_TESTS and span >= MIN_SECONDS:
                text += f", about {clock(span / measured * (self.total - self.done))} left"
            else:
                text += ", estimating the time left"
            text += load_note() if load is None else load
        return text


def _every() -> float:
    try:
        return max(0.0, float(os.environ.get(EVERY_ENV, "20")))
    except ValueError:
        return 20.0


class _Reporter:
    """The plugin's state for one pytest run (registered by :func:`pytest_configure`)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config, self.progress, self.every, self.shown_done = config, Progress(), _every(), -1

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if getattr(self.config.option, "dist", "no") in ("no", None):   # under xdist: the workers' collections
            self.progress.total = len(session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        self.progress.total = max(self.progress.total, len(ids))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "teardown":
            return
        now = time.monotonic()
        self.progress.finished(now)
        if now - self.progress.shown >= self.every:
            self.progress.shown = now
            self._write(self.progress.line(now))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.progress.done and self.shown_done != self.progress.done:
            self._write(self.progress.line())

    def _write(self, text: str) -> None:
        self.shown_done = self.progress.done
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        if tr is None:
            print(text, flush=True)
            return
        tw = getattr(tr, "_tw", None)          # after pytest's progress dots: a line of its own
        if getattr(tw, "width_of_current_line", 0):
            tw.line()
        tr.write_line(text)


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):          # an xdist worker reports to its controller
        config.pluginmanager.register(_Reporter(config), "inference-conformance-progress")


def cached_results(rows_dir: str | os.PathLike) -> list[str]:
    """One line per experiment figure in ``rows_dir`` (a folder of result rows, and its
    subfolders) that came from the experiment cache: "SD-3: <what> (computed <time>)"; [] when none did or the folder is
    missing."""
    from inference_conformance.conformance.results import read_rows

    folders = sorted({f.parent for f in Path(rows_dir).rglob("*.jsonl")})   # the laws' rows, bench/ the benchmarks'
    seen, out = set(), []
    for r in (r for d in folders for r in read_rows(d)):
        if (r.extra or {}).get("cached") is True:
            line = f"{r.claim}: {r.check.split('::')[-1]} (computed {r.extra.get('cached_at', '?')})"
            if line not in seen:
                seen.add(line)
                out.append(line)
    return out
