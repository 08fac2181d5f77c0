"""Servers the suite starts itself, as their users run them: :class:`ServerProcess`, the launcher
(a free port on 127.0.0.1, the process in a session of its own with its output in a log file,
``GET /health`` polled until 200 within a deadline, stop = SIGTERM to the whole process group,
SIGKILL after a grace period, and SIGTERM when the process that started it dies), and
:class:`LaunchedServers`, an ``inference_engine`` that starts one server per configuration and
judges it over HTTP through :class:`.openai_server.OpenAIServer` (:mod:`.vllm_server`,
:mod:`.transformers_server`).

A server that exits before it is healthy is refused ("unsupported") only where its log ends in
the server's own configuration check rejecting the arguments (a NotImplementedError, or vLLM's
``create_engine_config`` raising ValueError or TypeError); any other failure to start, and a
server that dies mid-law, is a RuntimeError with the first exception of its log and the log's
tail, and the next call starts a new one.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from pathlib import Path

from inference_conformance.conformance.contracts.inference_engine import (
    Arrival,
    refuse_unoffered,
    refuse_unserved,
    validate,
    validate_serve,
)
from inference_conformance.optimized.inference_engine.openai_server import OpenAIServer, ServerError, check_model_vocab

#: Seconds a server may take to answer ``/health`` (vLLM on 2 cores: 40-90 s).
START_DEADLINE_S = 600.0
_REFUSED = ("ValueError:", "TypeError:", "NotImplementedError:")
_NOISE = ("leaked ", "nanobind", "skipped remainder", "warnings.warn", "resource_tracker", "Route: ")
#: An exception's last line, bare or as one of vLLM's ERROR log lines ("(Worker pid=N) ERROR ... ] RuntimeError: ...").
_EXCEPTION = re.compile(r"^(?:\(\w+ pid=\d+\) ERROR .*?\] )?((?:\w+\.)*[A-Z]\w*(?:Error|Exception): .+)$")


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the process that started it dies (Linux's
    PR_SET_PDEATHSIG), so that a killed test run leaves no server behind: the server's own
    shutdown then stops its engine processes (a SIGKILL would leave them orphaned)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _stop_all(servers: dict) -> None:
    for proc, client in list(servers.values()):
        client.close()
        proc.stop()
    servers.clear()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerStartError(RuntimeError):
    """The server did not become healthy; ``refused`` when its own configuration check said no."""

    def __init__(self, message: str, refused: bool):
        super().__init__(message)
        self.refused = refused


class ServerProcess:
    """``argv`` (a server taking ``--host`` and ``--port``) started on 127.0.0.1 at a free port;
    :attr:`url` its API base; :meth:`tail` the end of its log; :meth:`stop` ends it and its children."""

    def __init__(self, argv: list[str], *, env: dict | None = None, deadline: float = START_DEADLINE_S,
                 log_dir: str | None = None, health: str = "/health"):
        self.port = free_port()
        self.argv = [*argv, "--host", "127.0.0.1", "--port", str(self.port)]
        fd, self.log_path = tempfile.mkstemp(prefix="server-", suffix=".log", dir=log_dir)
        self._log = os.fdopen(fd, "wb")
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, **(env or {})}, preexec_fn=_die_with_parent)
        try:
            self._wait(health, deadline)
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _lines(self) -> list[str]:
        try:
            text = Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ["(no log)"]
        return [ln for ln in text.splitlines() if ln.strip() and not any(n in ln for n in _NOISE)]

    def tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the server's log, less teardown noise (nanobind's leak lists)."""
        return "\n".join(self._lines()[-lines:])

    def cause(self) -> str:
        """The first exception line of the log ("RuntimeError: ..."), or ""."""
        return next((m.group(1) for m in map(_EXCEPTION.match, self._lines()) if m), "")

    def _wait(self, health: str, deadline: float) -> None:
        import httpx

        end = time.monotonic() + deadline
        while time.monotonic() < end:
            if not self.alive():
                text = self.tail(60)
                last = next((ln for ln in reversed(text.splitlines()) if ln.startswith(_REFUSED)), "")
                refused = bool(last) and (last.startswith("NotImplementedError:") or "create_engine_config" in text)
                raise ServerStartError(f"the server exited with code {self.proc.returncode} before it was healthy "
                                       f"({' '.join(self.argv)}); its log ends:\n{text}", refused)
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}{health}", timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(1.0)
        raise ServerStartError(f"the server did not answer {health} within {deadline:.0f} s; its log ends:\n"
                               f"{self.tail()}", refused=False)

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM to the server's process group, SIGKILL after ``grace`` seconds; the log is kept."""
        if self.alive():
            for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        try:                                       # children left in the group (vLLM's engine core)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._log.close()


class LaunchedServers:
    """An ``inference_engine`` that starts its server (:meth:`launch`) once per configuration
    (:meth:`key`), keeps the ``KEEP`` most recently used alive, and sends each call to it over HTTP.
    Subclasses give ``NAME`` (the server in messages), :meth:`launch` and ``capabilities``."""

    KEEP = 1
    NAME = "the server"

    def __init__(self):
        self._servers: dict = {}                   # configuration key -> (ServerProcess, OpenAIServer)
        weakref.finalize(self, _stop_all, self._servers)   # at exit too: no server outlives the run

    def close(self) -> None:
        """Stop every server this engine started."""
        _stop_all(self._servers)

    def key(self, params) -> tuple:
        """The part of ``params`` that needs a server of its own (launch arguments)."""
        return (str(params.model),)

    def launch(self, params) -> tuple[ServerProcess, OpenAIServer]:
        """Start the server for ``params`` and its client."""
        raise NotImplementedError

    def server(self, params) -> OpenAIServer:
        """The client of the running server for ``params``' configuration (started if needed)."""
        key = self.key(params)
        entry = self._servers.pop(key, None)
        if entry is not None and not entry[0].alive():
            entry[0].stop()
            entry = None
        if entry is None:
            while len(self._servers) >= self.KEEP:
                proc, client = self._servers.pop(next(iter(self._servers)))
                client.close()
                proc.stop()
            entry = self.launch(params)
        self._servers[key] = entry
        return entry[1]

    def environment(self) -> dict:
        return {"servers": [client.environment() for _, client in self._servers.values()]}

    def _call(self, params, send):
        client = self.server(params)
        proc = self._servers[self.key(params)][0]
        try:
            return send(client)
        except ServerError as exc:
            if not proc.alive():
                name, _, words = (proc.cause() or f"ServerError: {exc}").partition(": ")
                raise RuntimeError(f"{self.NAME} died (exit code {proc.proc.returncode}) of {name} ({words}); "
                                   f"its log ({proc.log_path}) ends:\n{proc.tail()}") from exc
            raise

    def generate(self, requests, params):
        validate(requests, params)
        refuse_unoffered(self.capabilities(), requests, params, self.NAME)
        check_model_vocab(requests, params)
        return self._call(params, lambda c: c.send(requests, params, c.arrival_delays(requests)))

    def serve(self, schedule, params) -> dict:
        validate_serve(schedule, params)
        arrivals = [e for e in schedule if isinstance(e, Arrival)]
        refuse_unoffered(self.capabilities(), [e.request for e in arrivals], params, self.NAME)
        refuse_unserved(self.capabilities().serving, schedule, params, self.NAME)
        check_model_vocab([e.request for e in arrivals], params)
        out = self._call(params, lambda c: c.send([e.request for e in arrivals], params, c.step_delays(arrivals)))
        return {e.id: c for e, c in zip(arrivals, out)}
