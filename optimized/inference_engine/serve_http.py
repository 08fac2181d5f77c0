"""An OpenAI-compatible completions server over any ``inference_engine`` implementation (the float64
reference by default): the other end of :mod:`.openai_server`, so that its HTTP path (probes,
concurrency, ids, logprobs, errors) is checked against engines whose verdicts are known, and so
that a client's own pipeline (a proxy, a router, a load balancer) can be put between the laws
and a correct engine.

``python -m inference_conformance.optimized.inference_engine.serve_http FOLDER [--port 8000]``
serves the reference engine on ``FOLDER`` (``inference-conformance export-model``'s ``target``);
``--text-only`` answers as a text-only server (below).

Endpoints: ``GET /health``, ``GET /v1/models`` (one model, ``id`` and ``root`` the folder),
``POST /v1/completions`` (``prompt`` token ids, ``max_tokens``, ``temperature``, ``top_p``,
``seed``, ``logprobs``; ``ignore_eos`` is always on: the engines generate ``max_tokens``
exactly). With ``text_only`` it answers as servers that take text only do (``transformers
serve``): a prompt that is not a string, or a field outside the OpenAI schema (``ignore_eos``,
``return_token_ids``), is refused (HTTP 400 / 422), the prompt's words are read in the suite's
vocabulary, and the answer is text (no ids, no logprobs). Each request is generated alone (one ``generate`` call of one request, calls
serialized), so batching is the engine's own business. A malformed request or one the engine
refuses (NotImplementedError) answers HTTP 400 with the engine's words; any other engine failure
HTTP 500.
"""
from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from inference_conformance.conformance.contracts.inference_engine import Params, Request


def _answer(handler, status: int, doc: dict) -> None:
    data = json.dumps(doc).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


#: The fields of OpenAI's completions schema a ``text_only`` server accepts.
SCHEMA = frozenset({"model", "prompt", "max_tokens", "temperature", "top_p", "seed", "logprobs", "stream", "n",
                    "stop", "suffix", "echo", "best_of", "user", "presence_penalty", "frequency_penalty",
                    "logit_bias"})


class Unexpected(ValueError):
    """A field outside OpenAI's schema sent to a ``text_only`` server (HTTP 422)."""


def _request(body: dict, text_only: bool = False) -> tuple[Request, float, float]:
    """The contract's Request and the (temperature, top_p) of one completions body; ValueError
    or TypeError naming the field for a malformed one."""
    if not isinstance(body, dict):
        raise TypeError("the body must be a JSON object")
    prompt = body.get("prompt")
    if text_only:
        if set(body) - SCHEMA:
            raise Unexpected(f"Unexpected fields in the request: {sorted(set(body) - SCHEMA)}")
        if not isinstance(prompt, str):
            raise TypeError("prompt must be a string.")
        from inference_conformance.optimized.inference_engine.openai_protocol import vocabulary

        stoi = vocabulary()[1]
        prompt = [stoi.get(w, stoi["<unk>"]) for w in prompt.split()]
    if not isinstance(prompt, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        raise TypeError("prompt must be a list of token ids (this server takes no text)")
    temperature, top_p = body.get("temperature", 1.0), body.get("top_p", 1.0)
    return (Request(tuple(prompt), body.get("max_tokens", 16), body.get("seed")), temperature, top_p)


class _Handler(BaseHTTPRequestHandler):
    server: "EngineServer"

    def log_message(self, format, *args):          # noqa: A002 (the stdlib's signature): quiet
        pass

    def do_GET(self):                              # noqa: N802 (the stdlib's name)
        if self.path.rstrip("/") == "/health":
            return _answer(self, 200, {})
        if self.path.rstrip("/") == "/v1/models":
            return _answer(self, 200, {"object": "list", "data": [
                {"id": self.server.folder, "object": "model", "root": self.server.folder, "owned_by": "inference-conformance"}]})
        return _answer(self, 404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self):                             # noqa: N802
        if self.path.rstrip("/") != "/v1/completions":
            return _answer(self, 404, {"error": {"message": f"no route {self.path}"}})
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")
            request, temperature, top_p = _request(body, self.server.text_only)
            params = Params(self.server.folder, temperature=temperature, top_p=top_p)
            with self.server.lock:
                out = self.server.engine.generate([request], params)[0]
        except Unexpected as exc:
            return _answer(self, 422, {"detail": str(exc)})
        except (TypeError, ValueError, NotImplementedError, json.JSONDecodeError) as exc:
            return _answer(self, 400, {"error": {"message": f"{type(exc).__name__}: {exc}", "type": "BadRequestError"}})
        except Exception as exc:                   # noqa: BLE001 (the engine's failure, to the client)
            return _answer(self, 500, {"error": {"message": f"{type(exc).__name__}: {exc}"}})
        ids = [int(x) for x in out.tokens.tolist()]
        if self.server.text_only:
            from inference_conformance.optimized.inference_engine.openai_protocol import vocabulary

            text = " ".join(vocabulary()[0][i] for i in ids)
            return _answer(self, 200, {"object": "text_completion", "model": self.server.folder,
                                       "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                                       "usage": {"prompt_tokens": len(request.prompt), "completion_tokens": len(ids)}})
        logprobs = None
        if body.get("logprobs") is not None and out.logprobs is not None:
            logprobs = {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [float(x) for x in out.logprobs.tolist()]}
        _answer(self, 200, {"object": "text_completion", "model": self.server.folder,
                            "choices": [{"index": 0, "text": "", "token_ids": ids, "logprobs": logprobs,
                                         "finish_reason": "length"}],
                            "usage": {"prompt_tokens": len(request.prompt), "completion_tokens": len(ids)}})


class EngineServer(ThreadingHTTPServer):
    """``engine`` (an ``inference_engine`` implementation) serving ``folder`` at ``host:port``
    (port 0: a free one; :attr:`url` says which) from a thread of its own until :meth:`stop`."""

    daemon_threads = True

    def __init__(self, engine, folder: str, host: str = "127.0.0.1", port: int = 0, text_only: bool = False):
        super().__init__((host, port), _Handler)
        self.engine, self.folder, self.lock = engine, str(folder), threading.Lock()
        self.text_only = bool(text_only)
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> "EngineServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def main(argv=None) -> int:
    from inference_conformance.optimized.inference_engine.suite import reference_engine

    ap = argparse.ArgumentParser(prog="python -m inference_conformance.optimized.inference_engine.serve_http",
                                 description="An OpenAI-compatible completions server over the float64 reference "
                                             "engine on FOLDER (endpoints: /health, /v1/models, /v1/completions).")
    ap.add_argument("folder", help="the exported model folder to serve (inference-conformance export-model's target)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--text-only", action="store_true", help="take text prompts only, answer text (as transformers serve)")
    args = ap.parse_args(argv)
    server = EngineServer(reference_engine(), args.folder, args.host, args.port, text_only=args.text_only)
    print(f"serving the float64 reference engine on {args.folder} at {server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
