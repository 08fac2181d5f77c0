"""The suite's pytest plugin (entry point ``pytest11``: loaded whenever the suite is installed).

Options:
  --impl TECHNIQUE=module:attr   check an outside implementation (repeatable); only that
                                 technique's properties run, against only the given ones.
  --device cpu|cuda              default: cuda when available. On cpu Triton runs interpreted.
  --results DIR                  write one JSON-lines file of result rows per process into DIR
                                 (appended after every test, so a crashed worker loses nothing).
  --zoo-only                     run only the bug-zoo tests (those taking ``bad_impl``).
  --experiments                  run the main job's slow experiments (marked ``experiment``);
                                 ``python -m inference_conformance.reports`` passes it, whatever ``CI`` says.
  --list-impls                   print every registered implementation (technique, name, origin,
                                 available or why not) and exit.
  --impl-timeout SECONDS         per-test timeout for outside implementations (default 300; needs
                                 pytest-timeout): a hang fails that test with the reason.
  --expect PATH                  expectation file or folder of them (repeatable; see
                                 inference_conformance.conformance.expectations): a listed failure of that implementation
                                 is an expected failure (row verdict "expected fail", the run stays
                                 green); a listed test that passes fails the run (strict) ...
  --allow-unexpected-pass        ... unless this is given: then it is reported ("unexpected pass").
                                 The suite's own files (expectations/) apply to its built-ins always.
  --outside-bench-only           with --impl, time only the outside rows (default: built-ins beside).
  --shard K/N                    run shard K of N (inference_conformance.conformance.sharding); with --results, each
                                 shard's folder is merged by python -m inference_conformance.reports merge.

With ``--results DIR`` the folder also gets ``run.json`` (the environment fingerprint, the shard,
start and end) and ``impls-*.json`` (each implementation's package versions): inference_conformance.conformance.runinfo.

A crash of an implementation under pytest-xdist (``-n``) fails that test (error row "worker
crashed") and the run goes on; run outside implementations with ``-n 1`` or more for that.

Benchmarks time outside implementations too: a benchmark that calls its technique's contract
adds one row per ``--impl`` of that technique (:func:`bench_backends`), with the backend id
``impl`` for the first target, ``impl2``, ... for the next, in the order given, never the target
string (so that two runs with different targets pair up by name, as ``python -m inference_conformance.perf.ab
--impl-a ... --impl-b ...`` needs); the target goes into the row's extra_info
(``implementation``). With ``--impl``, only those rows of the benchmarks run.

Markers a property test uses:
  @pytest.mark.technique("attention")   parametrizes ``impl`` over the registry (and
                                        ``bad_impl`` over the law's ``kills`` list).
  @pytest.mark.claim("FA-3", ...)       the claim ids the test checks.
  @pytest.mark.kills("no_max_subtract") the known-bad implementations the law must reject.

Hypothesis profiles: ``ci`` (chosen when CI=true), ``compat`` (the oldest stack's CI run), ``dev``
(default), ``thorough``; select with
``--hypothesis-profile`` or HYPOTHESIS_PROFILE.
"""
from __future__ import annotations

import os
from contextlib import nullcontext

import hypothesis.configuration
import pytest
from hypothesis import HealthCheck, settings

from inference_conformance.conformance import expectations, registry, results, runinfo, sharding, summary, verdicts
from inference_conformance.conformance import outside as outside_impls
from inference_conformance.conformance.device import interpreter_hint, select_device
from inference_conformance.conformance.outcomes import refusal_is_unsupported

_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
             HealthCheck.function_scoped_fixture]
#: Where the suite keeps what Hypothesis and pytest-benchmark store between runs (environment
#: variable INFERENCE_CONFORMANCE_DIR, default ~/.cache/inference-conformance), never in the
#: project that runs it.
STORAGE_ENV = "INFERENCE_CONFORMANCE_DIR"


def storage_dir() -> str:
    """The suite-owned folder for Hypothesis's example database and benchmark storage."""
    base = os.environ.get(STORAGE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "inference-conformance")
    return os.path.abspath(base)


# Hypothesis's home (its example database, its caches) under the suite's own folder
hypothesis.configuration.set_hypothesis_home_dir(os.path.join(storage_dir(), "hypothesis"))
settings.register_profile("ci", max_examples=10, derandomize=True, deadline=None,
                          suppress_health_check=_SUPPRESS, print_blob=True)
settings.register_profile("dev", max_examples=30, deadline=None, suppress_health_check=_SUPPRESS,
                          print_blob=True)
#: ``compat``: the oldest supported stack's run in CI (.ci/run), a compatibility check of the same
#: kernels: every law's pinned boundary cases and 3 drawn examples (the newest stack draws ``ci``'s 10)
settings.register_profile("compat", max_examples=3, derandomize=True, deadline=None,
                          suppress_health_check=_SUPPRESS, print_blob=True)
settings.register_profile("thorough", max_examples=500, deadline=None,
                          suppress_health_check=_SUPPRESS, print_blob=True)

_STATE: dict = {"rows": [], "outside": {}, "device": None, "expect": [], "expect_builtin": [], "run": None}
#: Default per-test timeout (seconds) for outside implementations (``--impl-timeout``).
OUTSIDE_TIMEOUT_S = 300.0


def pytest_addoption(parser):
    group = parser.getgroup("conformance", "inference conformance suite")
    group.addoption("--impl", action="append", default=[], metavar="TECHNIQUE=module:attr",
                    help="check an outside implementation of TECHNIQUE (repeatable)")
    group.addoption("--device", default=None, choices=["cpu", "cuda", "auto"],
                    help="device for tensors and kernels (default: cuda when available)")
    group.addoption("--results", default=None, metavar="DIR",
                    help="write result rows (JSON lines) into DIR")
    group.addoption("--zoo-only", action="store_true", default=False,
                    help="run only the bug-zoo tests (tests taking bad_impl)")
    group.addoption("--outside-bench-only", action="store_true", default=False,
                    help="with --impl, time only the outside rows of each benchmark (default: built-ins beside)")
    group.addoption("--model", default=None, metavar="PATH",
                    help="checkpoint the model-level claims (KV-1, KV-2, FA-3 on a real layer) run on: a "
                         "Hugging Face Llama folder or a world checkpoint (default: the shipped target)")
    group.addoption("--experiments", action="store_true", default=False,
                    help="run the main job's slow experiments (tests marked experiment); python -m "
                         "reports passes it, whatever CI says")
    group.addoption("--list-impls", action="store_true", default=False,
                    help="list every registered implementation (technique, name, origin, available "
                         "on --device or why not) and exit")
    group.addoption("--impl-timeout", type=float, default=OUTSIDE_TIMEOUT_S, metavar="SECONDS",
                    help="per-test timeout for outside implementations (pytest-timeout; 0: none; default %(default)s)")
    group.addoption("--expect", action="append", default=[], metavar="PATH",
                    help="expectation file (TOML) or folder of them: listed failures are expected (repeatable)")
    group.addoption("--allow-unexpected-pass", action="store_true", default=False,
                    help="with --expect: a listed test that passes is reported, not a failure of the run")
    sharding.add_option(group)


def outside(technique: str) -> list:
    """The outside implementations of ``technique`` given with ``--impl`` (loaded once, at
    configure), in the order given; [] without ``--impl`` or outside a pytest run."""
    return list(_STATE["outside"].get(technique, ()))


def bench_id(index: int) -> str:
    """The backend id of the ``index``-th (from 0) outside implementation of a technique in a
    benchmark: ``impl``, ``impl2``, ``impl3``, ... (independent of the target string)."""
    return "impl" if index == 0 else f"impl{index + 1}"


def outside_backends(technique: str) -> dict:
    """Backend id (:func:`bench_id`) -> outside implementation of ``technique``, in ``--impl`` order."""
    return {bench_id(i): impl for i, impl in enumerate(outside(technique))}


def outside_info(technique: str, backend: str) -> dict:
    """The extra_info naming the target behind an outside benchmark row ``backend``
    (``{"implementation": "module:attr"}``); {} for a built-in backend."""
    impl = outside_backends(technique).get(backend)
    return {"implementation": impl.target} if impl is not None else {}


def outside_refusals(technique: str, backend: str):
    """A context for a benchmark row's first calls (its in-test ``median_seconds``): for an
    outside row, its implementation's ``NotImplementedError`` ends the test as "unsupported" (as
    in the laws); a built-in's refusal stays an error. Never wrap the ``benchmark.pedantic`` loop
    in it (no overhead per timed round)."""
    impl = outside_backends(technique).get(backend)
    return refusal_is_unsupported(impl.name) if impl is not None else nullcontext()


def bench_backends(technique: str, builtin: tuple[str, ...] | list[str]) -> list:
    """A benchmark's ``backend`` parameter values: the ``builtin`` names (ids unchanged), then
    one ``impl``/``impl2``/... per outside implementation of ``technique``, each marked
    ``outside_bench(technique)`` so that ``--impl`` keeps exactly these rows. Call it where the
    benchmark module is collected (after configure): ``@pytest.mark.parametrize("backend",
    bench_backends("attention", BACKENDS))``."""
    return list(builtin) + [pytest.param(b, id=b, marks=pytest.mark.outside_bench(technique))
                            for b in outside_backends(technique)]


def _profile_name(config) -> str:
    chosen = config.getoption("hypothesis_profile", default=None)
    if chosen:
        return chosen
    if os.environ.get("HYPOTHESIS_PROFILE"):
        return os.environ["HYPOTHESIS_PROFILE"]
    return "ci" if os.environ.get("CI", "").lower() in ("1", "true", "yes") else "dev"


def pytest_cmdline_main(config):
    """``--list-impls``: print the registry and exit, like ``--markers``."""
    if not config.getoption("list_impls", default=False):
        return None
    return outside_impls.list_impls(config, select_device(config.getoption("device")))


def pytest_configure(config):
    for line in ("technique(name): the technique whose contract the test checks",
                 "claim(*ids): claim ids of the ledger (CLAIMS.md) the test checks",
                 "kills(*names): known-bad implementations the law must reject",
                 "gpu: needs a CUDA device (skipped elsewhere)",
                 "experiment(why): a slow experiment of the main job, run only with --experiments",
                 "outside_bench(technique): a benchmark row timing an outside implementation (--impl)"):
        config.addinivalue_line("markers", line)
    settings.load_profile(_profile_name(config))
    try:
        device = select_device(config.getoption("device"))
    except ValueError as exc:
        raise pytest.UsageError(f"--device {config.getoption('device')}: {exc}") from exc
    _STATE["device"] = device
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if device == "cpu" and worker.startswith("gw"):
        # one xdist worker per core: torch's own thread pool per worker would oversubscribe the
        # cores, and OpenMP spin-waits make tiny-tensor tests 10-100x slower.
        import torch

        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    if device == "cuda" and worker.startswith("gw"):
        import torch

        torch.cuda.set_device(int(worker[2:]) % torch.cuda.device_count())
    try:
        outside = registry.parse_impl_option(config.getoption("impl"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from exc
    loaded = {}
    for technique, targets in outside.items():
        impls = []
        for name, target in targets:
            try:
                impls.append(registry.load_outside(technique, target))
            except Exception as exc:  # noqa: BLE001 - any failure to import the user's code: one line
                raise pytest.UsageError(outside_impls.load_error(technique, target, exc)) from exc
        loaded[technique] = impls
    _STATE["outside"] = loaded
    try:
        _STATE["expect"] = expectations.load(config.getoption("expect") or [])
        _STATE["expect_builtin"] = expectations.load([expectations.BUILTIN]) if expectations.BUILTIN.is_dir() else []
    except (ValueError, OSError) as exc:
        raise pytest.UsageError(f"--expect: {exc}") from exc
    try:
        sharding.parse(config.getoption("shard"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from exc
    config.pluginmanager.register(sharding, "inference_conformance.conformance.sharding")
    _STATE["run"] = None
    if config.getoption("results", default=None):
        files = [e.source for e in _STATE["expect"] + _STATE["expect_builtin"]]
        _STATE["run"] = runinfo.RunFolder(config.getoption("results"), device, config.getoption("shard"),
                                          config.invocation_params.args, files)
    if loaded:
        outside_impls.isolate_crashes(config)
    _suite_owned_storage(config)


def _suite_owned_storage(config) -> None:
    """pytest-benchmark's storage (for --benchmark-autosave / --benchmark-save) under
    :func:`storage_dir` unless the user named one; Hypothesis's database is set in the profiles."""
    root = storage_dir()
    opt = config.option
    if getattr(opt, "benchmark_storage", None) in (None, "file://./.benchmarks"):
        opt.benchmark_storage = "file://" + os.path.join(root, "benchmarks")


def _technique(node) -> str | None:
    m = node.get_closest_marker("technique")
    return m.args[0] if m else None


def pytest_generate_tests(metafunc):
    technique = _technique(metafunc.definition)
    if technique is None:
        return
    if "impl" in metafunc.fixturenames:
        outside = _STATE["outside"].get(technique)
        impls = outside if outside else registry.builtins(technique, _STATE["device"])
        # a benchmark's row of an outside implementation is named by its place, not its target
        timed = bool(outside) and "benchmark" in metafunc.fixturenames
        for i in impls:
            if _STATE["run"] is not None:
                _STATE["run"].saw(i)
        params = [pytest.param(i, id=bench_id(n) if timed else i.name,
                               marks=[pytest.mark.skip(reason=i.unavailable)] if i.unavailable else [])
                  for n, i in enumerate(impls)]
        metafunc.parametrize("impl", params)
    if "bad_impl" in metafunc.fixturenames:
        kills = metafunc.definition.get_closest_marker("kills")
        names = list(kills.args) if kills else []
        zoo = {i.name: i for i in registry.zoo(technique)}
        unknown = [n for n in names if n not in zoo]
        if unknown:
            raise pytest.UsageError(f"{metafunc.definition.nodeid}: kills unknown zoo entries {unknown}")
        metafunc.parametrize("bad_impl", [pytest.param(zoo[n], id=f"zoo-{n}") for n in names])


def _is_outside(impl) -> bool:
    return impl is not None and bool(getattr(impl, "outside", False))


def _outside_bench(item) -> str | None:
    m = item.get_closest_marker("outside_bench")
    return m.args[0] if m else None


def _bench_function(item) -> tuple[str, str] | None:
    """(module, function) of a benchmark test (one taking the ``benchmark`` fixture), else None."""
    return None if "benchmark" not in getattr(item, "fixturenames", ()) else (item.nodeid.split("::")[0], getattr(item, "originalname", item.name))


def pytest_collection_modifyitems(config, items):
    timeout = config.getoption("impl_timeout", default=OUTSIDE_TIMEOUT_S)
    if timeout and config.pluginmanager.hasplugin("timeout"):
        for item in items:
            if (_is_outside(_param(item, "impl")) or _outside_bench(item)) \
                    and item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(timeout))
    if _expecting():
        strict = not config.getoption("allow_unexpected_pass", default=False)
        for item in items:
            entry = _expected(item)
            if entry is not None and entry.expected == "fail":
                item.add_marker(pytest.mark.xfail(strict=strict, reason=verdicts.expect_reason(entry)))
    if config.getoption("zoo_only", default=False):
        keep = [i for i in items if "bad_impl" in getattr(i, "fixturenames", ())]
        drop = [i for i in items if "bad_impl" not in getattr(i, "fixturenames", ())]
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep
    techniques = set(_STATE["outside"])
    if not techniques:
        return
    # a benchmark with an outside row keeps its built-in rows beside it, in one pinned run
    beside = set() if config.getoption("outside_bench_only", default=False) else \
        {_bench_function(i) for i in items if _outside_bench(i) in techniques}
    keep, drop = [], []
    for item in items:
        t = _technique(item)
        uses_zoo = "bad_impl" in getattr(item, "fixturenames", ())
        (keep if (t in techniques and not uses_zoo) or _outside_bench(item) in techniques
         or _bench_function(item) in beside else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


_EXPECTED = pytest.StashKey[object]()


def _expected(item):
    """The :class:`inference_conformance.conformance.expectations.Entry` for ``item`` (its ``impl``'s file lists it), or None."""
    if _EXPECTED in item.stash:
        return item.stash[_EXPECTED]
    impl = _param(item, "impl")
    entry = None
    if impl is not None and _expecting():
        dtype = _param(item, "dtype")
        how = dict(law=getattr(item, "originalname", ""), technique=impl.technique,
                   dtype=str(dtype).replace("torch.", "") if dtype is not None else "",
                   impl_target=getattr(impl, "target", "") or "")
        entry = expectations.lookup(_STATE["expect"], impl.name, item.name, **how)
        if entry is None and impl.origin == "builtin":   # the suite's own files: its built-ins only
            entry = expectations.lookup(_STATE["expect_builtin"], impl.name, item.name, **how)
    item.stash[_EXPECTED] = entry
    return entry


def _expecting() -> bool:
    return bool(_STATE["expect"] or _STATE["expect_builtin"])


@pytest.fixture
def one_torch_thread():
    """Run the test with one torch intra-op thread (restored after): fastest for tiny tensors,
    and no OpenMP spin-waits when pytest-xdist workers share the cores."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def device() -> str:
    """The device tensors are created on: "cpu" or "cuda" (``--device``)."""
    return _STATE["device"]


_RECORDER = pytest.StashKey[results.Recorder]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test item gets its own :class:`inference_conformance.conformance.results.Recorder`, active from its setup
    to its teardown; its rows are built from it (no state is shared between tests)."""
    rec = item.stash.setdefault(_RECORDER, results.Recorder())
    with results.recording(rec):
        return (yield)


@pytest.fixture
def recorder(request) -> results.Recorder:
    """The running test's recorder (what its result rows are built from)."""
    return request.node.stash.setdefault(_RECORDER, results.Recorder())


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    exp = item.get_closest_marker("experiment")
    if exp is not None and not item.config.getoption("experiments", default=False):
        pytest.skip(f"{exp.args[0] if exp.args else 'an experiment'}: run by python -m inference_conformance.reports "
                    "(pytest --experiments)")
    if item.get_closest_marker("gpu") and _STATE["device"] != "cuda":
        pytest.skip("needs a CUDA device")


def _param(item, name):
    cs = getattr(item, "callspec", None)
    return cs.params.get(name) if cs is not None else None


def _rows_for(item, outcome: str, message: str) -> list[results.Row]:
    claims = item.get_closest_marker("claim")
    claim_ids = list(claims.args) if claims else []
    impl = _param(item, "impl")
    bad = _param(item, "bad_impl")
    dtype = _param(item, "dtype")
    base = dict(check=item.nodeid, technique=_technique(item) or "",
                implementation=(impl.name if impl is not None else (f"zoo:{bad.name}" if bad is not None else "")),
                dtype=str(dtype).replace("torch.", "") if dtype is not None else "",
                device=_STATE["device"] or "", verdict=outcome, message=message[:2000])
    cur = item.stash.get(_RECORDER, None) or results.Recorder()
    rows = []
    w = cur.worst
    for fig in cur.figures:
        rows.append(results.Row(claim=fig["claim"], measured=fig["measured"], lecture=fig["lecture"],
                                bound=fig["bound"], unit=fig["unit"], rule=fig["rule"],
                                extra=fig["extra"], examples=cur.count, **base))
    if cur.figures and w is not None and not w.ok and outcome in ("fail", "error"):
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
            elif w is not None and outcome in ("pass", "partial", "fail"):
                row.measured, row.bound, row.rule = w.error, w.bound, w.rule
                row.unit = "max abs error"
            rows.append(row)
    return rows


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        entry = _expected(item) if _expecting() else None
        rec = item.stash.get(_RECORDER, None)
        outcome, message = verdicts.outcome(report, call, entry, rec.partial if rec is not None else "",
                                            item.config.getoption("allow_unexpected_pass", default=False))
        hint = interpreter_hint(str(report.longrepr)) if report.failed else None
        if hint:
            report.sections.append(("conformance: the interpreter's limit, not the implementation's", hint))
            message = f"{message}\nhint: {hint}"
        rows = _rows_for(item, outcome, message)
        crash = getattr(report.longrepr, "reprcrash", None)
        if report.failed and crash is not None and "\n" in crash.message:
            # the row keeps the whole message (a law's case, comparison, implementation and
            # diagnosis); the terminal's summary line (-ra, not cut under CI) shows its first line
            crash.message = crash.message.split("\n", 1)[0]
        _STATE["rows"].extend(rows)
        _write(item.config, rows)
        report.user_properties.append(("conformance_rows", len(rows)))
        report.user_properties.append(("conformance_verdicts", [
            (r.technique, r.check.split("::")[-1].split("[")[0], r.claim, r.implementation or "-", r.verdict,
             _number(r.measured), _number(r.bound))
            for r in rows if r.technique]))
    return report


def pytest_runtest_logreport(report):
    """Collect the verdicts for the terminal summary; with pytest-xdist this runs in the
    controller too, from the workers' reports (their rows stay in the workers)."""
    for name, value in getattr(report, "user_properties", ()):
        if name == "conformance_verdicts":
            _STATE.setdefault("verdicts", []).extend(tuple(v) for v in value)


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
    an error row for it; xdist fails that test and restarts the worker, the run goes on."""
    config = getattr(sched, "config", None)
    row = results.Row(claim="", check=crashitem, device=_STATE["device"] or "", verdict="error",
                      message="worker crashed while running this test (segfault or hard exit in the implementation)")
    _STATE["rows"].append(row)
    if config is not None:
        _write(config, [row])


def _number(x):
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def pytest_sessionfinish(session, exitstatus):
    if _STATE["run"] is not None:
        _STATE["run"].finish(exitstatus)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    summary.write(terminalreporter, _STATE.get("verdicts", []))
