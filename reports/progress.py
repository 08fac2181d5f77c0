"""Progress of the main job's pytest stages, and the summary of the results it took from the
experiment cache.

As a pytest plugin (``-p inference_conformance.reports.progress``; ``python -m
inference_conformance.reports`` loads it in its pytest stages) it prints, at most every
``INFERENCE_CONFORMANCE_PROGRESS_EVERY`` seconds (default 20) and when the stage ends, one line::

    progress: 412/1905 tests (22%), 1m35s elapsed, about 5m40s left

The estimate is the time per finished test so far times the tests left (a stage whose slow tests
come last finishes later than it says). Under pytest-xdist the controller counts what its workers
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


@dataclass
class Progress:
    """Tests done of ``total`` since ``start`` (``time.monotonic`` seconds)."""

    total: int = 0
    done: int = 0
    start: float = field(default_factory=time.monotonic)
    shown: float = 0.0

    def line(self, now: float | None = None) -> str:
        """The progress line at ``now`` (default: the current monotonic time)."""
        now = time.monotonic() if now is None else now
        elapsed = max(0.0, now - self.start)
        pct = f" ({100 * self.done // self.total}%)" if self.total else ""
        text = f"progress: {self.done}/{self.total or '?'} tests{pct}, {clock(elapsed)} elapsed"
        if 0 < self.done < self.total:
            text += f", about {clock(elapsed / self.done * (self.total - self.done))} left"
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
        self.progress.done += 1
        now = time.monotonic()
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
