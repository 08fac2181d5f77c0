"""Running outside implementations (``--impl``): one line when a target cannot be loaded, a
crash (segfault, ``os._exit``) isolated to the test it happened in, and the ``--list-impls``
table of every registered implementation."""
from __future__ import annotations

import importlib
import os


from inference_conformance.conformance import registry


def list_impls(config, device: str, rows: list | None = None) -> int:
    """``--list-impls``: the registry (``rows``, default ``registry.listing(device)``) and the
    ``--impl`` targets as a table; returns 0."""
    from rich.console import Console
    from rich.table import Table

    table = Table("technique", "name", "origin", f"on {device}", title="registered implementations")
    for technique, name, origin, state in (registry.listing(device) if rows is None else rows):
        table.add_row(technique, name, origin, state)
    impls = config.getoption("impl")
    for technique, targets in (registry.parse_impl_option(impls) if impls else {}).items():
        for _, target in targets:
            try:
                registry.load_outside(technique, target)
                state = "available"
            except (ImportError, AttributeError, TypeError) as exc:
                state = f"cannot load: {exc}"
            table.add_row(technique, target, "outside (--impl)", state)
    Console(width=160).print(table)
    return 0


def load_error(technique: str, target: str, exc: BaseException) -> str:
    """One line on why ``--impl technique=target`` could not be loaded (a syntax error names its
    file and line)."""
    where = ""
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f" ({exc.filename}, line {exc.lineno})"
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"--impl {technique}={target}: cannot load it: {type(exc).__name__}{where}: {text}"


def isolate_crashes(config) -> None:
    """An outside implementation may kill its process (a segfault, ``os._exit``): with
    pytest-xdist every collected test must still run, so the worker-restart limit (4 per worker
    by default, after which xdist stops scheduling) is lifted unless the user set one (without
    xdist, :func:`crash_advice` says how to isolate a crash)."""
    if not hasattr(config.option, "maxworkerrestart"):
        return
    if getattr(config.option, "numprocesses", None):
        if config.option.maxworkerrestart is None:
            config.option.maxworkerrestart = str(10 ** 6)


#: The terminal's line for a run of the laws on an --impl without pytest-xdist.
CRASH_ADVICE = "conformance: without -n a crash of an --impl ends the run; -n 1 makes it its test's error"


def crash_advice(config, benchmarks: bool) -> str | None:
    """:data:`CRASH_ADVICE` for a run with ``--impl`` and pytest-xdist installed but not used
    (``-n``), in its main process; None otherwise, and for a run that timed ``benchmarks`` (``-n``
    turns benchmarking off)."""
    if benchmarks or not config.getoption("impl", default=None) or not hasattr(config.option, "maxworkerrestart"):
        return None
    if getattr(config.option, "numprocesses", None) or os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    return CRASH_ADVICE


#: The adapter ``--engine-url`` loads, by name as the registry loads every layer's implementations
#: (conformance/ imports no layer above it).
SERVER_MODULE = "inference_conformance.optimized.inference_engine.openai_server"
URL_VARIABLE = "INFERENCE_CONFORMANCE_ENGINE_URL"


def engine_url(config) -> str | None:
    """``--engine-url``, else ``$INFERENCE_CONFORMANCE_ENGINE_URL``, else None, as the API's base
    URL; ValueError naming ``url`` for a value that is not an http(s) address."""
    url = config.getoption("engine_url", default=None) or os.environ.get(URL_VARIABLE) or None
    return None if url is None else importlib.import_module(SERVER_MODULE).base_url(url)


#: Default per-test timeout (seconds) for outside implementations (``--impl-timeout``), and for a
#: server judged by URL (``--engine-url``: every call crosses the network, and EN-3's sampled law
#: sends thousands of requests: 37 s to over 300 s against the reference server on 2 busy cores).
OUTSIDE_TIMEOUT_S, SERVER_TIMEOUT_S = 300.0, 1800.0


def impl_timeout(config) -> float:
    """``--impl-timeout``, else :data:`SERVER_TIMEOUT_S` with ``--engine-url``, else
    :data:`OUTSIDE_TIMEOUT_S` (0: none)."""
    given = config.getoption("impl_timeout", default=None)
    if given is not None:
        return float(given)
    return SERVER_TIMEOUT_S if engine_url(config) else OUTSIDE_TIMEOUT_S


def server_engine(config, url: str):
    """The server at ``url`` as an outside ``inference_engine`` implementation named by its URL
    (``optimized/inference_engine/openai_server.py``: ``OpenAIServer``), after one ``GET
    /v1/models``: RuntimeError (the server's words) where it does not answer."""
    server = importlib.import_module(SERVER_MODULE).OpenAIServer(
        url, dtype=config.getoption("engine_dtype", default="float32"), timeout=impl_timeout(config) or 300.0)
    server.model()
    return registry.from_object("inference_engine", url, server, "outside", target=url)
