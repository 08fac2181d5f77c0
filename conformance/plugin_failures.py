"""The failures of the suite's laws in the terminal: one line per failing law and implementation.

A law that fails prints its compact failure (:class:`inference_conformance.conformance.failures.LawFailure`:
the case, the diagnosis, the comparison, the implementation), one per failing test: a kernel
with a few bugs fails dozens of tests (each law over its dtypes and shapes), and pytest prints
each twice, in "FAILURES" and in the short summary. By default (no ``-v``, ``--tb`` left at
"auto") the failures of the suite's own tests that are such plain failures (the suite's compact
failures, no traceback: :class:`inference_conformance.conformance.failures.PlainFailure`) leave
both sections for one section, "conformance failures": one line per law and implementation, of
at most :data:`WIDTH` columns, with how many of its tests failed, the worst measured error
against its bound and the known bugs its diagnoses named::

    FA-3 test_fa3_matches_float64_reference: 4 failed (5.2e+00>2.9e-12); known bugs: top_left_causal, ignores_scale

The full failures are one option away (``-v``, or ``--tb=short``: pytest's sections as they
were) and, with ``--results DIR``, one file away: ``DIR/failures.txt`` holds every one of them
whole (the test's id, then its message). Every other failure (a project's test, a crash of the
suite's code with its traceback) prints as pytest prints it. The counts of the run's last line
are pytest's own. A skip of the suite's test names the file it was raised in as the suite names it
("conformance/laws.py", never a path up from the current folder into an environment), its reason
cut to fit. A run of the laws on ``--impl`` without ``-n`` ends with one line saying that
``-n 1`` isolates a crash of the implementation (:func:`inference_conformance.conformance.outside.crash_advice`).
"""
from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

import pytest

from inference_conformance.conformance.failures import LawFailure, PlainFailure
from inference_conformance.conformance.outside import crash_advice
from inference_conformance.conformance.plugin_collect import param, technique_of
from inference_conformance.conformance.plugin_state import is_suite_node, state
from inference_conformance.conformance.summary import impl_heads

#: The widest line the section prints (columns).
WIDTH = 100
#: The user property a compacted failure's report carries (its line's parts).
KEY = "conformance_failure"
#: The file of ``--results`` that holds the compacted failures whole.
DETAIL = "failures.txt"


def _figure(report) -> str:
    """The worst "measured>bound" of the report's verdicts ("" where none failed a bound)."""
    worst = None
    for name, value in report.user_properties:
        if name != "conformance_verdicts":
            continue
        for *_, measured, bound in value:
            if measured is not None and bound is not None and not measured <= bound:
                ratio = measured / bound if bound else float("inf")
                worst = max(worst or (ratio, measured, bound), (ratio, measured, bound))
    return f"{worst[1]:.1e}>{worst[2]:.1e}" if worst else ""


class CompactFailures:
    """The plugin object (registered per run by :func:`register`): marks each compact failure's
    report in the process that ran it, and prints the section in the one that reports."""

    def __init__(self, config) -> None:
        self.config = config
        self.benchmarks = False            # a test of the run took the benchmark fixture

    def enabled(self) -> bool:
        option = self.config.option
        return getattr(option, "verbose", 0) <= 0 and getattr(option, "tbstyle", "auto") == "auto"

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        self.benchmarks = self.benchmarks or "benchmark" in getattr(item, "fixturenames", ())
        if report.skipped and isinstance(report.longrepr, tuple) and self.enabled() and is_suite_node(item):
            report.longrepr = _skip_line(report.longrepr)
        error = call.excinfo.value if call.excinfo is not None else None
        if (report.failed and isinstance(error, PlainFailure) and not error.pytrace and is_suite_node(item)):
            claims = [a for m in item.iter_markers("claim") for a in m.args]
            impl = param(item, "impl")
            report.user_properties.append((KEY, {
                "law": getattr(item, "originalname", item.name), "claim": claims[0] if claims else "",
                "technique": technique_of(item) or "", "impl": getattr(impl, "name", "") if impl is not None else "",
                "bugs": list(getattr(error, "bugs", ())), "diagnosed": isinstance(error, LawFailure),
                "figure": _figure(report)}))
        return report

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_terminal_summary(self, terminalreporter, exitstatus, config):
        tr = terminalreporter
        failed = tr.stats.get("failed", [])
        compact = [r for r in failed if _parts(r) is not None] if self.enabled() else []
        if compact:
            tr.stats["failed"] = [r for r in failed if _parts(r) is None]   # pytest's sections skip them
        try:
            return (yield)
        finally:
            tr.stats["failed"] = failed
            advice = crash_advice(config, self.benchmarks)
            if advice:
                tr.write_line(advice, yellow=True)
            if compact:
                _section(tr, compact, _write_detail(config, compact))


def suite_path(path) -> str:
    """A file as the suite names it ("conformance/laws.py"): relative to the folder its package's
    files are mapped from (the installed package, or the checkout used in place); a file
    elsewhere keeps its path."""
    import inference_conformance

    path = Path(path).resolve()
    for root in map(Path, inference_conformance.__path__):
        try:
            return path.relative_to(root.resolve()).as_posix()
        except ValueError:
            continue
    return str(path)


def _skip_line(longrepr: tuple) -> tuple:
    """A skip of the suite's test as the short summary shows it: where it was raised, by the
    suite's path of the file (:func:`suite_path`), its reason cut to fit :data:`WIDTH` columns
    ("SKIPPED [N] " included; ``-v`` shows it whole)."""
    path, line, reason = longrepr
    where = suite_path(path)
    room = WIDTH - len("SKIPPED [NN] ") - len(f"{where}:{line}: ")
    reason = str(reason)
    return where, line, reason if len(reason) <= room else reason[: max(room, 20) - 1] + "~"


def _parts(report) -> dict | None:
    return next((v for k, v in getattr(report, "user_properties", ()) if k == KEY), None)


def _write_detail(config, reports) -> str | None:
    """Every compacted failure whole into ``--results``'s :data:`DETAIL`; its path, or None."""
    folder = config.getoption("results", default=None)
    if not folder:
        return None
    path = os.path.join(folder, DETAIL)
    try:
        os.makedirs(folder, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            for r in reports:
                f.write(f"{r.nodeid}\n{r.longreprtext.rstrip()}\n\n")
    except OSError:
        return None
    return path


def _fit(text: str, width: int = WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _section(tr, reports, detail: str | None) -> None:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in reports:
        p = _parts(r)
        groups[(p["claim"], p["law"], p["impl"])].append(p)
    heads = impl_heads(state(tr.config).verdicts)
    several = len([h for h in heads if h != "-"]) > 1        # the line names its implementation as the table does
    where = f"-v, or {detail}" if detail else "-v"
    tr.write_sep("=", f"conformance failures: {len(reports)} tests of {len(groups)} laws (in full: {where})"[:WIDTH - 8],
                 red=True, bold=True)
    for (claim, law, impl), parts in groups.items():
        label = heads.get(impl, impl)
        head = f"{claim} {law}".strip() + (f" {label if label.startswith('[') else f'[{label}]'}" if several and impl else "")
        figures = [p["figure"] for p in parts if p["figure"]]
        worst = max(figures, key=lambda f: float(f.split(">")[0]) / max(float(f.split(">")[1]), 1e-300)) if figures else ""
        bugs = list(dict.fromkeys(b for p in parts for b in p["bugs"]))
        said = (f"known bug{'s' if len(bugs) > 1 else ''}: {', '.join(bugs)}" if bugs else
                "no known bug named" if any(p["diagnosed"] for p in parts) else "not a law: no diagnosis")
        count = f"{len(parts)} failed"
        # the bugs first, the law next: the figure, then the count, are in the table above
        line = next((text for text in (f"{head}: {count} ({worst}); {said}" if worst else "", f"{head}: {count}; {said}",
                                       f"{head}: {said}") if text and len(text) <= WIDTH),
                    f"{_fit(head, max(20, WIDTH - len(said) - 2))}: {said}")
        tr.write_line(_fit(line), red=True)


def register(config) -> None:
    """Register the run's :class:`CompactFailures` (once per config)."""
    name = f"inference_conformance-failures-{id(config)}"
    if config.pluginmanager.get_plugin(name) is None:
        config.pluginmanager.register(CompactFailures(config), name)


__all__ = ["DETAIL", "KEY", "WIDTH", "CompactFailures", "register"]
