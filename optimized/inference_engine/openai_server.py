"""Any OpenAI-compatible server under the ``inference_engine`` contract, judged by URL over HTTP
(``pytest --engine-url http://host:8000/v1``, or ``INFERENCE_CONFORMANCE_ENGINE_URL``): vLLM,
SGLang, llama.cpp's ``llama-server``, TGI, OpenVINO Model Server speak the completions protocol.

Each request is one ``POST /v1/completions`` (:mod:`.openai_protocol`): ``max_tokens``,
``temperature``, ``top_p``, ``seed``, ``logprobs: 0`` (the chosen token's logprob), and the prompt
in one of two dialects: token ids with vLLM's and SGLang's extensions (``ignore_eos``,
``return_token_ids``), or, for a server that refuses those (``transformers serve``: "prompt must
be a string"), text in the suite's word-level vocabulary, the answer's words mapped back to ids.
``dialect="auto"`` (the default) takes the first the greedy probe is answered in; a server giving
no ids cannot be judged (RuntimeError).

The server must serve the folder the laws export (``inference-conformance export-model DIR``,
then serve ``DIR/target``): its model is the first of ``GET /v1/models``.

Capabilities come from what the server answers, never from the caller's word: on first use one
probe call per capability (a greedy call with logprobs: logprobs and the ids; a seeded sampled
call: ``seed``; a call with ``top_p`` < 1: top-p); a 4xx answer declares the part absent, and
the laws then judge what was accepted. Batching is concurrency: a ``generate`` of N requests sends
N concurrent requests, request i after a delay drawn in [0, ``spread``) seconds (seeded by the
call's prompts: the same call arrives the same way), and the server batches them as it does its
users'. Prefix caching, chunked prefill and speculation are the server's own settings (launch
arguments): a call asking for one is refused ("unsupported"), and what is known of them
(``settings``, ``/v1/models``, the probes) is recorded in the run's ``impls-*.json``
(:meth:`OpenAIServer.environment`). ``serve`` takes arrivals only: an arrival at step s is sent s·τ
seconds after the first, τ the server's measured time per output token (its steps are its own).

Requests time out after ``timeout`` seconds; a refused connection, a timeout or a 429/5xx answer
is retried at most ``retries`` times (0.5 s, 1 s, ... apart), then raises RuntimeError with the
server's words. ``dtype`` is the dtype the server computes in: it chooses only the rule its
logprobs are judged by (contract: "engine-near-tie" and the 16-bit model rule)."""
from __future__ import annotations

import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import torch

from inference_conformance.conformance.contracts.inference_engine import (
    Arrival,
    Capabilities,
    Completion,
    check_vocab,
    folder_vocab_size,
    refuse_unoffered,
    refuse_unserved,
    sampling_of,
    validate,
    validate_serve,
)
from inference_conformance.optimized.inference_engine import openai_protocol as protocol
from inference_conformance.optimized.inference_engine.openai_protocol import ServerError

__all__ = ["OpenAIServer", "ServerError", "base_url", "check_model_vocab", "dtype_of"]

#: The environment variable naming the server ``--engine-url`` judges by default.
URL_VARIABLE = "INFERENCE_CONFORMANCE_ENGINE_URL"   # conformance/outside.py reads it too
_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


def base_url(url) -> str:
    """``url`` as the API's base (``http(s)://host[:port]/.../v1``); ValueError naming ``url``."""
    if not isinstance(url, str):
        raise TypeError(f"url must be a str (http://host:port/v1), got {type(url).__name__}")
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"url must be an http(s) address such as http://127.0.0.1:8000/v1, got {url!r}")
    path = parts.path.rstrip("/")
    return f"{parts.scheme}://{parts.netloc}{path if path.endswith('/v1') else path + '/v1'}"


def dtype_of(name) -> torch.dtype:
    """The torch dtype named ``name`` ("float32", "bfloat16", ...); ValueError naming ``dtype``."""
    if isinstance(name, torch.dtype):
        return name
    if name not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {name!r}")
    return _DTYPES[name]


class OpenAIServer:
    """An OpenAI-compatible completions server at ``url``, as an ``inference_engine``."""

    def __init__(self, url, *, dtype="float32", settings: dict | None = None, timeout: float = 300.0,
                 retries: int = 2, spread: float = 0.2, dialect: str = "auto"):
        self.url, self.dtype = base_url(url), dtype_of(dtype)
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an int >= 0, got {retries!r}")
        if dialect not in ("auto", *protocol.DIALECTS):
            raise ValueError(f"dialect must be 'auto' or one of {protocol.DIALECTS}, got {dialect!r}")
        self.settings, self.timeout, self.retries, self.spread = dict(settings or {}), float(timeout), retries, spread
        self.dialect = dialect
        self._client = None
        self._caps: Capabilities | None = None
        self._model: dict | None = None
        self._probes: dict = {}
        self._step_s = 0.05

    def __repr__(self) -> str:
        return f"OpenAIServer({self.url!r})"

    # -- transport ---------------------------------------------------------------------------
    def client(self):
        if self._client is None:
            import httpx

            self._client = httpx.Client(base_url=self.url, timeout=httpx.Timeout(self.timeout, connect=10.0),
                                        limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        """(status, JSON answer); retries connection failures, timeouts and 429/5xx; ServerError after."""
        import httpx

        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(0.5 * 2 ** (attempt - 1))
            try:
                resp = self.client().request(method, path, json=body)
            except httpx.TransportError as exc:        # refused, reset, timed out
                last = f"{type(exc).__name__}: {exc}"
                continue
            if resp.status_code in _RETRY_STATUS:
                last = f"HTTP {resp.status_code}: {resp.text[:500]}"
                continue
            try:
                return resp.status_code, resp.json()
            except json.JSONDecodeError:
                return resp.status_code, {"error": resp.text[:500]}
        raise ServerError(f"{method} {self.url}{path} failed after {self.retries + 1} tries: {last}")

    def _post(self, body: dict) -> dict:
        status, answer = self._call("POST", "/completions", body)
        if status != 200:
            raise ServerError(f"{self.url}/completions answered HTTP {status} to {protocol.short(body)}: {protocol.words(answer)}")
        return answer

    # -- what the server offers ----------------------------------------------------------------
    def model(self) -> dict:
        """The served model: the first entry of ``GET /v1/models``."""
        if self._model is None:
            status, answer = self._call("GET", "/models")
            data = answer.get("data") if status == 200 else None
            if not data:
                raise ServerError(f"{self.url}/models answered HTTP {status} with no model: {protocol.words(answer)}")
            self._model = data[0]
        return self._model

    def _body(self, prompt, max_tokens: int, temperature: float, top_p: float, seed=None, logprobs=True,
              dialect: str | None = None) -> dict:
        return protocol.body(dialect or self.dialect, self.model()["id"], prompt, max_tokens, temperature, top_p,
                             seed, logprobs)

    def _greedy_probe(self) -> dict:
        """The first probe; with ``dialect="auto"`` the ids dialect first, the text dialect where the
        server refuses it (a 4xx answer), the one accepted kept for every later call."""
        tried = ("ids", "text") if self.dialect == "auto" else (self.dialect,)
        refused = {}
        for dialect in tried:
            status, answer = self._call("POST", "/completions", self._body((1, 5, 6), 8, 0.0, 1.0, dialect=dialect))
            if status == 200:
                self.dialect = dialect
                self._probes["prompts"] = dialect + "".join(f" ({d} refused: {w})" for d, w in refused.items())
                return answer
            if not 400 <= status < 500:
                raise ServerError(f"the greedy probe: HTTP {status}: {protocol.words(answer)}")
            refused[dialect] = f"HTTP {status}: {protocol.words(answer)[:200]}"
        raise ServerError(f"{self.url}/completions refused every dialect of the greedy probe: {refused}")

    def _accepted(self, name: str, body: dict) -> bool:
        status, answer = self._call("POST", "/completions", body)
        self._probes[name] = "accepted" if status == 200 else f"HTTP {status}: {protocol.words(answer)[:200]}"
        if status == 200:
            return True
        if 400 <= status < 500:
            return False
        raise ServerError(f"the {name} probe: HTTP {status}: {protocol.words(answer)}")

    def capabilities(self) -> Capabilities:
        """What the server answered to one probe call per capability (module docstring)."""
        if self._caps is None:
            start = time.perf_counter()
            probe = self._greedy_probe()
            self._step_s = max((time.perf_counter() - start) / 8, 1e-3)
            ids, logprobs, _ = protocol.parse(probe, self.url, self.dialect)
            self._probes["greedy"] = f"{len(ids)} ids, logprobs {'returned' if logprobs is not None else 'absent'}"
            seeded = self._accepted("seed", self._body((1, 5, 6), 2, 1.0, 1.0, seed=7))
            top_p = self._accepted("top_p", self._body((1, 5, 6), 2, 1.0, 0.5))
            self._caps = Capabilities(dtype=self.dtype, batching=True, prefix_caching=False, chunked_prefill=False,
                                      speculative=(), seeded_sampling="request" if seeded else "none", top_p=top_p,
                                      logprobs=logprobs is not None, batch_invariant=False, serving=("arrivals",),
                                      per_request_params=True)
        return self._caps

    def environment(self) -> dict:
        """What the run records of this server: its URL, ``/v1/models`` entry, the settings it was
        started with (where known), the probes' answers and the measured time per output token."""
        out = {"url": self.url, "settings": self.settings, "probes": dict(self._probes),
               "step_seconds": round(self._step_s, 6)}
        try:
            out["model"] = self.model()
        except ServerError as exc:
            out["model"] = f"unreachable: {exc}"
        return out

    # -- the contract --------------------------------------------------------------------------
    def _refuse_settings(self, params) -> None:
        for name, on in (("prefix caching", params.prefix_caching), ("chunked prefill", params.chunked_prefill),
                         ("speculative decoding", params.speculative), ("padding", params.padding)):
            if on:
                raise NotImplementedError(f"{name} is the server's own setting at {self.url} (recorded: {self.settings})")

    def _check(self, requests, params) -> None:
        validate(requests, params)
        self._refuse_settings(params)
        refuse_unoffered(self.capabilities(), requests, params, f"the server at {self.url}")
        check_model_vocab(requests, params)

    def send(self, requests, params, delays) -> list[Completion]:
        caps = self.capabilities()
        bodies = []
        for r in requests:
            t, p = sampling_of(r, params)
            bodies.append(self._body(r.prompt, r.max_new_tokens, t, p, r.seed, caps.logprobs))

        def one(i):
            time.sleep(delays[i])
            return protocol.completion(self._post(bodies[i]), requests[i].max_new_tokens, self.url, self.dialect,
                                       len(requests[i].prompt))

        if len(bodies) == 1:
            return [one(0)]
        with ThreadPoolExecutor(max_workers=min(len(bodies), 64)) as pool:
            return list(pool.map(one, range(len(bodies))))

    def arrival_delays(self, requests) -> list[float]:
        """Request i's delay (seconds) in a concurrent call: 0 for the first, then drawn in
        [0, ``spread``) from the call's prompts and seeds (the same call arrives the same way)."""
        rng = random.Random(repr([(r.prompt, r.seed) for r in requests]))
        return [0.0] + [rng.uniform(0.0, self.spread) for _ in requests[1:]]

    def generate(self, requests, params) -> list[Completion]:
        self._check(requests, params)
        return self.send(requests, params, self.arrival_delays(requests))

    def step_delays(self, arrivals) -> list[float]:
        """An arrival at step s is sent s·τ seconds after the first (τ: measured time per output token)."""
        self.capabilities()
        return [e.step * self._step_s for e in arrivals]

    def serve(self, schedule, params) -> dict:
        """Arrivals only: an arrival at step s is sent s·τ seconds after the first (τ the measured
        time per output token); the server's steps are its own."""
        validate_serve(schedule, params)
        arrivals = [e for e in schedule if isinstance(e, Arrival)]
        self._check([e.request for e in arrivals], params)
        refuse_unserved(self.capabilities().serving, schedule, params, f"the server at {self.url}")
        out = self.send([e.request for e in arrivals], params, self.step_delays(arrivals))
        return {e.id: c for e, c in zip(arrivals, out)}


def check_model_vocab(requests, params) -> None:
    """ValueError naming ``prompt`` for an id outside the vocabulary of ``params.model`` (read
    here: the server serves the same export)."""
    check_vocab(requests, folder_vocab_size(params.model))
