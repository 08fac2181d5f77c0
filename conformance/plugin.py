"""The suite's pytest plugin (entry point ``pytest11``: loaded whenever the suite is installed).

Options:
  --impl TECHNIQUE=module:attr   check an outside implementation (repeatable); only that
                                 technique's properties run, against only the given ones.
  --device cpu|cuda              default: cuda when available. On cpu Triton runs interpreted.
  --results DIR                  write one JSON-lines file of result rows per process into DIR
                                 (appended after every test, so a crashed worker loses nothing).
  --zoo-only                     run only the bug-zoo tests (those taking ``bad_impl`` or calling
                                 ``expect_rejected``).
  --experiments                  run the main job's slow experiments (marked ``experiment``);
                                 ``python -m inference_conformance.reports`` passes it, whatever ``CI`` says.
  --list-impls                   print every registered implementation (technique, name, origin,
                                 available or why not) and exit.
  --engine-url URL               judge the OpenAI-compatible server at URL as an inference_engine (as
                                 --impl does an implementation; default $INFERENCE_CONFORMANCE_ENGINE_URL);
                                 --engine-dtype the dtype it computes in (default float32); a server
                                 that does not answer GET /v1/models is a usage error (exit 4).
  --impl-timeout SECONDS         per-test timeout for outside implementations (default 300, 1800 with
                                 --engine-url, where it is each request's too; needs pytest-timeout):
                                 a hang fails that test with the reason.
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
(default), ``thorough``; select with ``--hypothesis-profile`` or HYPOTHESIS_PROFILE. They are
registered as ``inference_conformance.<name>`` and apply to the suite's own tests only
(:mod:`inference_conformance.conformance.plugin_profiles`).

Inert elsewhere: installed, the plugin is loaded by every pytest run in the environment; for a
test that is not the suite's (by its path: :func:`inference_conformance.conformance.plugin_state.is_suite_path`)
it loads no Hypothesis profile, moves no example database, sets no environment variable and
changes no option's default. ``TRITON_INTERPRET=1`` (on a machine without CUDA) is set when the
suite's own code is collected, or at configure when the run is the suite's alone or uses its
options (``--impl``, ``--results``, ``--expect``); ``bench_*.py`` of the suite's benchmarks are
collected whatever the project's ``python_files``.

The run's state lives in ``config.stash`` (:mod:`inference_conformance.conformance.plugin_state`);
the hooks are split by job: collection (``plugin_collect``), results (``plugin_results``), the
failures in the terminal, one line per failing law (``plugin_failures``), ``--list-impls``'s cache
(``plugin_list``). A benchmark's rows (:func:`bench_backends` and the accessors beside it) are
:mod:`inference_conformance.conformance.bench_rows`'s, which benchmarks import; they stay
importable from here.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from inference_conformance.conformance import expectations, plugin_profiles, registry, runinfo, sharding
from inference_conformance.conformance import outside as outside_impls
from inference_conformance.conformance.device import resolve_device, select_device
from inference_conformance.conformance.bench_rows import (bench_backends, bench_id, bench_implementation, outside,
                                                          outside_backends, outside_info, outside_refusals)
from inference_conformance.conformance.outside import OUTSIDE_TIMEOUT_S, SERVER_TIMEOUT_S
from inference_conformance.conformance.plugin_collect import (pytest_collect_file, pytest_collection_modifyitems, pytest_generate_tests,
                                                              pytest_make_collect_report, pytest_pycollect_makeitem, ready)
from inference_conformance.conformance.plugin_profiles import STORAGE_ENV, storage_dir
from inference_conformance.conformance.plugin_results import (_RECORDER, _rows_for, pytest_handlecrashitem,
                                                              pytest_runtest_makereport, pytest_runtest_protocol,
                                                              pytest_sessionfinish, pytest_terminal_summary, recorder)
from inference_conformance.conformance import plugin_failures, plugin_results
from inference_conformance.conformance.plugin_state import enter, is_suite_node, leave, state, suite_invocation

__all__ = ["bench_backends", "bench_id", "bench_implementation", "outside", "outside_backends", "outside_info", "outside_refusals",
           "storage_dir", "STORAGE_ENV", "OUTSIDE_TIMEOUT_S", "_RECORDER", "_rows_for", "recorder",
           "pytest_collect_file", "pytest_collection_modifyitems", "pytest_generate_tests",
           "pytest_make_collect_report", "pytest_pycollect_makeitem", "pytest_handlecrashitem", "pytest_runtest_makereport",
           "pytest_runtest_protocol", "pytest_sessionfinish", "pytest_terminal_summary"]


def pytest_addoption(parser):
    group = parser.getgroup("conformance", "inference conformance suite")
    group.addoption("--impl", action="append", default=[], metavar="TECHNIQUE=module:attr",
                    help="check an outside implementation of TECHNIQUE (repeatable)")
    group.addoption("--device", default=None, choices=["cpu", "cuda", "auto"],
                    help="device for tensors and kernels (default: cuda when available)")
    group.addoption("--results", default=None, metavar="DIR",
                    help="write result rows (JSON lines) into DIR")
    group.addoption("--zoo-only", action="store_true", default=False,
                    help="run only the bug-zoo tests (tests taking bad_impl or calling expect_rejected)")
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
    group.addoption("--impl-timeout", type=float, default=None, metavar="SECONDS",
                    help=f"per-test timeout for outside implementations, and each request's with --engine-url "
                         f"(pytest-timeout; 0: none; default {OUTSIDE_TIMEOUT_S:.0f}, {SERVER_TIMEOUT_S:.0f} with --engine-url)")
    group.addoption("--expect", action="append", default=[], metavar="PATH",
                    help="expectation file (TOML) or folder of them: listed failures are expected (repeatable)")
    group.addoption("--engine-url", default=None, metavar="URL",
                    help="judge the OpenAI-compatible server at URL (http://host:8000/v1) as an inference_engine "
                         "(default: $INFERENCE_CONFORMANCE_ENGINE_URL); only the engine laws run")
    group.addoption("--engine-dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"],
                    help="with --engine-url: the dtype the server computes in (the rule its logprobs are judged by)")
    group.addoption("--allow-unexpected-pass", action="store_true", default=False,
                    help="with --expect: a listed test that passes is reported, not a failure of the run")
    sharding.add_option(group)



def pytest_cmdline_main(config):
    """``--list-impls``: print the registry and exit, like ``--markers``. The registry's listing
    is cached (:mod:`inference_conformance.conformance.plugin_list`)."""
    if not config.getoption("list_impls", default=False):
        return None
    from inference_conformance.conformance import plugin_list

    try:
        device = select_device(config.getoption("device"))
    except ValueError as exc:
        raise pytest.UsageError(f"--device {config.getoption('device')}: {exc}") from exc
    rows, _ = plugin_list.listing(device)
    return outside_impls.list_impls(config, device, rows)


_MARKERS = ("technique(name): the technique whose contract the test checks",
            "claim(*ids): claim ids of the ledger (CLAIMS.md) the test checks",
            "kills(*names): known-bad implementations the law must reject",
            "gpu: needs a CUDA device (skipped elsewhere)",
            "experiment(why): a slow experiment of the main job, run only with --experiments",
            "outside_bench(technique): a benchmark row timing an outside implementation (--impl)",
            "suite_own(why): a law about the suite's own code (a simulator, a formula, the reference model, one "
            "built-in's internals) that takes no registered implementation, and why")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    for line in _MARKERS:
        config.addinivalue_line("markers", line)
    plugin_profiles.alias_requested(config)
    st = state(config)
    enter(config)
    st.profile = plugin_profiles.profile_name(config)
    st.device_option, st.resolver = config.getoption("device"), resolve_device
    if st.device_option not in (None, "", "auto"):
        try:
            st._device = resolve_device(st.device_option)
        except ValueError as exc:
            raise pytest.UsageError(f"--device {st.device_option}: {exc}") from exc
    try:
        impls = config.getoption("impl")       # contracts import torch: only when asked for
        targets = registry.parse_impl_option(impls) if impls else {}
        engine_url = outside_impls.engine_url(config)
        sharding.parse(config.getoption("shard"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from exc
    suite_run = suite_invocation(config)
    if suite_run or targets or engine_url or config.getoption("results", default=None) or config.getoption("expect"):
        ready(config)          # before an --impl target (which may define kernels) is imported
        _share_cores(st.device)
    st.outside = {technique: [_load(technique, target) for _, target in pairs] for technique, pairs in targets.items()}
    if engine_url:
        try:           # one GET /v1/models before any law: an unreachable server is a usage error, said once
            st.outside.setdefault("inference_engine", []).append(outside_impls.server_engine(config, engine_url))
        except RuntimeError as exc:
            raise pytest.UsageError(f"--engine-url {engine_url}: {exc}") from exc
    try:
        with warnings.catch_warnings(record=True) as lax:
            warnings.simplefilter("always", expectations.ExpectationWarning)
            st.expect = expectations.load(config.getoption("expect") or [])
            st.expect_builtin = expectations.load([expectations.BUILTIN]) if expectations.BUILTIN.is_dir() else []
    except (ValueError, OSError) as exc:
        raise pytest.UsageError(f"--expect: {exc}") from exc
    for w in lax:                         # said in the run's warnings summary, not swallowed by configure
        config.issue_config_time_warning(pytest.PytestWarning(f"--expect: {w.message}"), stacklevel=2)
    config.pluginmanager.register(sharding, "inference_conformance.conformance.sharding")
    plugin_results.register(config)
    plugin_failures.register(config)
    if config.getoption("results", default=None):
        _results_not_taken_for_a_path(config)
        files = [e.source for e in st.expect + st.expect_builtin]
        st.run = runinfo.RunFolder(config.getoption("results"), st.device, config.getoption("shard"),
                                   config.invocation_params.args, files)
    if st.outside:
        outside_impls.isolate_crashes(config)
    if suite_run:
        _suite_owned_storage(config)


#: The files pytest reads its configuration from, and the section that makes each one its.
_PYTEST_CONFIGS = (("pytest.ini", ""), (".pytest.ini", ""), ("pyproject.toml", "[tool.pytest"), ("tox.ini", "[pytest]"),
                   ("setup.cfg", "[tool:pytest]"))


def _results_not_taken_for_a_path(config) -> None:
    """pytest reads every argument naming an existing path as a test path when it chooses the
    rootdir and its configuration file, option values included: ``--results DIR`` (two words) with
    DIR an existing folder outside the project left the project's configuration unread (no
    testpaths, no norecursedirs: a second run collected every test twice, 13380 for 7653).
    UsageError naming the one-word form, which pytest does not read as a path."""
    results, here = config.getoption("results"), Path(config.invocation_params.dir)
    if results not in config.invocation_params.args:
        return
    for d in (here, *here.parents):
        found = [d / n for n, section in _PYTEST_CONFIGS if (d / n).is_file()
                 and (not section or section in (d / n).read_text(encoding="utf-8", errors="replace"))]
        if found:
            if config.inipath is None or Path(config.inipath).resolve() != found[0].resolve():
                raise pytest.UsageError(f"--results {results}: pytest took the existing folder for a test path "
                                        f"and left {found[0]} unread; write --results={results}")
            return


def pytest_unconfigure(config):
    leave(config)


def _load(technique: str, target: str):
    try:
        return registry.load_outside(technique, target)
    except Exception as exc:  # noqa: BLE001 - any failure to import the user's code: one line
        raise pytest.UsageError(outside_impls.load_error(technique, target, exc)) from exc


def _share_cores(device: str) -> None:
    """Under pytest-xdist: on CPU, torch's threads split between the workers (one thread pool per
    worker would oversubscribe the cores, and OpenMP spin-waits make tiny-tensor tests 10-100x
    slower); on CUDA, one GPU per worker in turn."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return
    import torch

    if device == "cpu":
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    else:
        torch.cuda.set_device(int(worker[2:]) % torch.cuda.device_count())


def _suite_owned_storage(config) -> None:
    """A run of the suite alone: Hypothesis's home (its caches; the suite's profiles name their
    own database) and pytest-benchmark's storage (for --benchmark-autosave / --benchmark-save)
    under :func:`storage_dir`, the latter unless the user named one. A run that holds a project's
    tests too leaves both where the project has them."""
    import hypothesis.configuration

    hypothesis.configuration.set_hypothesis_home_dir(os.path.join(storage_dir(), "hypothesis"))
    opt = config.option
    if getattr(opt, "benchmark_storage", None) in (None, "file://./.benchmarks"):
        opt.benchmark_storage = "file://" + os.path.join(storage_dir(), "benchmarks")


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
def device(request) -> str:
    """The device tensors are created on: "cpu" or "cuda" (``--device``)."""
    return state(request.config).device


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if not is_suite_node(item):
        return
    exp = item.get_closest_marker("experiment")
    if exp is not None and not item.config.getoption("experiments", default=False):
        pytest.skip(f"{exp.args[0] if exp.args else 'an experiment'}: run by python -m inference_conformance.reports "
                    "(pytest --experiments)")
    if item.get_closest_marker("gpu") and state(item.config).device != "cuda":
        pytest.skip("needs a CUDA device")
