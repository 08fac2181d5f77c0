"""Result hooks of the suite's pytest plugin: each test's recorder, its result rows (written to
``--results``), the verdicts of the terminal summary and the run folder's closing record. All
of it is kept per test (``item.stash``) or per run (``config.stash``)."""
from __future__ import annotations

import os

import pytest

from inference_conformance.conformance import outcomes, results, summary, verdicts
from inference_conformance.conformance.device import interpreter_hint
from inference_conformance.conformance.outcomes import Outcome
from inference_conformance.conformance.plugin_collect import expected, param, suite_context, technique_of
from inference_conformance.conformance.plugin_state import is_suite_node, state

_RECORDER = pytest.StashKey[results.Recorder]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test item gets its own :class:`inference_conformance.conformance.results.Recorder`,
    active from its setup to its teardown; its rows are built from it (no state is shared between
    tests). A test of the suite runs under the suite's profile and device."""
    rec = item.stash.setdefault(_RECORDER, results.Recorder())
    with suite_context(item), results.recording(rec):
        return (yield)


@pytest.fixture
def recorder(request) -> results.Recorder:
    """The running test's recorder (what its result rows are built from)."""
    return request.node.stash.setdefault(_RECORDER, results.Recorder())


def _profile(config) -> tuple[str, int]:
    """The Hypothesis profile the running test is under (its short name where it is the suite's)
    and that profile's example count; ("", 0) where none can be read."""
    try:
        from hypothesis import settings

        name = state(config).profile if config is not None else ""
        chosen = settings.get_profile(name) if name else settings.default
        return name.rsplit(".", 1)[-1] if name else "", int(chosen.max_examples)
    except Exception:  # noqa: BLE001 - a row is written without the profile rather than not at all
        return "", 0


def _rows_for(item, outcome: Outcome, message: str, device: str | None = None, failure: dict | None = None,
              evidence: dict | None = None) -> list[results.Row]:
    """The result rows of ``item`` ended with ``outcome`` and ``message`` (``failure``: its
    failure kind, for a test that failed); ``device`` defaults to the run's (item.config), ""
    without one."""
    outcome = Outcome.of(outcome)
    config = getattr(item, "config", None)
    if device is None:
        device = state(config).device if config is not None else ""
    profile, max_examples = _profile(config)
    claims = item.get_closest_marker("claim")
    claim_ids = list(claims.args) if claims else []
    impl = param(item, "impl")
    bad = param(item, "bad_impl")
    dtype = param(item, "dtype")
    cur = item.stash.get(_RECORDER, None) or results.Recorder()
    zoo = f"zoo:{bad.name}" if bad is not None else (f"zoo:{','.join(cur.zoo)}" if cur.zoo else "")
    base = dict(check=item.nodeid, technique=technique_of(item) or "",
                implementation=impl.name if impl is not None else zoo,
                dtype=str(dtype).replace("torch.", "") if dtype is not None else "",
                device=device, verdict=outcome.value, message=message[:2000], profile=profile, max_examples=max_examples,
                failure={k: v for k, v in (failure or {}).items() if k != "mro"}, evidence=evidence or {})
    rows = []
    w = cur.worst
    for fig in cur.figures:
        rows.append(results.Row(claim=fig["claim"], measured=fig["measured"], lecture=fig["lecture"],
                                bound=fig["bound"], unit=fig["unit"], rule=fig["rule"],
                                extra=fig["extra"], examples=cur.count, **base))
    if cur.figures and w is not None and not w.ok and outcome.new_failure:
        # the test failed on a comparison, not on its figures: that comparison is its own row, so
        # that the summary and the report show the error that failed, not a figure that held
        rows.append(results.Row(claim=claim_ids[0] if claim_ids else cur.figures[0]["claim"],
                                measured=w.error, bound=w.bound, rule=w.rule, unit="max abs error",
                                examples=cur.count, **base))
    if not cur.figures:
        for cid in claim_ids or [""]:
            row = results.Row(claim=cid, examples=cur.count, **base)
            if bad is not None and cur.text:
                row.measured, row.unit = cur.text, "rejection"
            elif w is not None and outcome in (Outcome.PASS, Outcome.PARTIAL, Outcome.FAIL):
                row.measured, row.bound, row.rule = w.error, w.bound, w.rule
                row.unit = "max abs error"
            rows.append(row)
    return rows


def _number(x):
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if not ((report.when == "call" or (report.when == "setup" and report.outcome != "passed"))
            and _counts(item)):
        return report
    st = state(item.config)
    entry = expected(item) if st.expecting() else None
    rec = item.stash.get(_RECORDER, None)
    worst = rec.worst if rec is not None else None
    evidence = rec.evidence if rec is not None and rec.partial else {}
    outcome, message = verdicts.outcome(report, call, entry, rec.partial if rec is not None else "",
                                        item.config.getoption("allow_unexpected_pass", default=False), worst, evidence)
    failure = verdicts.failure_of(call, worst) if outcome.fails_law else {}
    if failure and rec is not None and rec.failed_inputs:
        failure["inputs"] = rec.failed_inputs        # what a newer run must judge to replace this failure
    hint = interpreter_hint(str(report.longrepr)) if report.failed else None
    if hint:
        report.sections.append(("conformance: the interpreter's limit, not the implementation's", hint))
        message = f"{message}\nhint: {hint}"
    rows = _rows_for(item, outcome, message, st.device, failure, evidence)
    crash = getattr(report.longrepr, "reprcrash", None)
    if report.failed and crash is not None and "\n" in crash.message:
        # the row keeps the whole message (a law's case, diagnosis, comparison and
        # implementation); the terminal's summary line (-ra, not cut under CI) shows its first line
        crash.message = crash.message.split("\n", 1)[0]
    _write(item.config, rows)
    report.user_properties.append(("conformance_rows", len(rows)))
    report.user_properties.append(("conformance_verdicts", terminal_verdicts(rows)))
    return report


def terminal_verdicts(rows: list[results.Row]) -> list[tuple]:
    """What the terminal summary is made of, from result rows: (technique, law, claim,
    implementation, outcome word as every reader judges it, measured, bound) per row of a
    technique (plain values: pytest-xdist sends them from its workers)."""
    return [(r.technique, r.check.split("::")[-1].split("[")[0], r.claim, r.implementation or "-",
             outcomes.read(r).value, _number(r.measured), _number(r.bound)) for r in rows if r.technique]


def _counts(item) -> bool:
    """Whether ``item`` makes result rows: a test of the suite, one that says what it checks (a
    ``technique`` or ``claim`` marker), or any test of a run that asked for rows (``--results``)."""
    return (is_suite_node(item) or technique_of(item) is not None or item.get_closest_marker("claim") is not None
            or bool(item.config.getoption("results", default=None)))


class VerdictCollector:
    """Collects the verdicts of one run's reports for its terminal summary (registered per run by
    :func:`register`); with pytest-xdist it runs in the controller too, from the workers' reports
    (their rows stay in the workers)."""

    def __init__(self, config) -> None:
        self.config = config

    def pytest_runtest_logreport(self, report):
        for name, value in getattr(report, "user_properties", ()):
            if name == "conformance_verdicts":
                state(self.config).verdicts.extend(tuple(v) for v in value)


def register(config) -> None:
    """Register the run's :class:`VerdictCollector` (once per config)."""
    name = f"inference_conformance-verdicts-{id(config)}"
    if config.pluginmanager.get_plugin(name) is None:
        config.pluginmanager.register(VerdictCollector(config), name)


def _rows_path(config) -> str | None:
    out = config.getoption("results", default=None)
    if not out:
        return None
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    return os.path.join(out, f"rows-{worker}-{os.getpid()}.jsonl")


def _write(config, rows) -> None:
    path = _rows_path(config)
    if path and rows:
        results.write_rows(rows, path)


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    """pytest-xdist: a worker died running ``crashitem`` (a segfault in a kernel, say): record
    an error row for it marked as a crash (:func:`inference_conformance.conformance.results.crashed`;
    the matrix attributes it to its implementation and shows "crashed"); xdist fails that test
    and restarts the worker, the run goes on."""
    config = getattr(sched, "config", None)
    device = state(config).device if config is not None else ""
    profile, max_examples = _profile(config)
    row = results.Row(claim="", check=crashitem, device=device, verdict=Outcome.ERROR.value,
                      message="worker crashed while running this test (segfault or hard exit in the implementation)",
                      failure={"exception": results.CRASH, "check": "worker crashed"}, profile=profile,
                      max_examples=max_examples)
    if config is not None:
        _write(config, [row])


#: Cell outcomes that judged nothing: every example refused, the law skipped, too few of its
#: examples accepted to say it holds, a listed failure no longer reached (:attr:`Outcome.judges`).
UNJUDGED = frozenset(o for o in Outcome if not o.judges)


def nothing_judged(config) -> dict[str, dict[str, int]]:
    """The ``--impl`` implementations ("module:attr") that some claim's law was given and that no
    claim's law judged, each with its cells per verdict: every one of those cells is
    "unsupported", skipped or "not enough evidence" (the bad-call checks judge no claim). Such a
    run never exits 0: an implementation refusing every law, or all but a few of each law's
    examples, has conformed to no claim."""
    if hasattr(config, "workerinput"):        # a pytest-xdist worker: the controller sees every cell
        return {}
    targets = [v.split("=", 1)[1] for v in config.getoption("impl", default=None) or [] if "=" in v]
    seen: dict = {}
    for _technique, _law, claim, name, verdict, *_ in state(config).verdicts:
        if name in targets and claim:            # a claim's law: the bad-call checks judge no claim
            counts = seen.setdefault(name, {})
            counts[Outcome.of(verdict)] = counts.get(Outcome.of(verdict), 0) + 1
    return {t: seen[t] for t in dict.fromkeys(targets) if t in seen and set(seen[t]) <= UNJUDGED}


def nothing_judged_line(target: str, counts: dict[str, int]) -> str:
    """The one line a run that judged nothing of ``target`` prints (why it exits 1)."""
    words = {Outcome.UNSUPPORTED: "unsupported (every example refused)", Outcome.SKIP: "skipped",
             Outcome.THIN: f"{Outcome.THIN} (fewer than {outcomes.MIN_ACCEPTED:g} of the examples accepted)",
             Outcome.STALE: f"{Outcome.STALE} (a listed failure now refused or skipped)"}
    why = ", ".join(f"{n} {words.get(Outcome.of(v), v)}" for v, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    return (f"conformance: no claim's law judged {target}: of its {sum(counts.values())} results on claims' laws, "
            f"{why}; the run exits 1")


def pytest_sessionfinish(session, exitstatus):
    if nothing_judged(session.config) and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    run = state(session.config).run
    if run is not None:
        run.finish(session.exitstatus)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    summary.write(terminalreporter, state(config).verdicts)
    for target, counts in nothing_judged(config).items():
        terminalreporter.write_line(nothing_judged_line(target, counts), red=True)
