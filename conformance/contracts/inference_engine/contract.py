"""The ``inference_engine`` contract: a whole inference engine, judged on what it generates (claims EN-1,
EN-2, EN-3; KV-2 for its seeds).

An implementation is an object (or module) with two callables:

``capabilities() -> Capabilities``
    What the engine offers (:class:`Capabilities`): batching, the padding sides it takes, prefix
    caching, chunked prefill (a per-step token budget), its speculative methods, seeded
    sampling, top-p, sampling parameters per request (``per_request_params``), logprobs,
    whether it declares batch invariance (bitwise-equal logprobs
    whatever the batch), the dtype it computes in (the rule its logprobs are judged by) and ``serving``, the
    parts of ``serve`` it offers (below).

``generate(requests, params) -> list[Completion]``
    requests: a non-empty list of :class:`Request` (token ids, no tokenizer: ``prompt`` a tuple of
    ints in [0, V), at least one; ``max_new_tokens`` >= 1; ``seed`` an int or None;
    ``temperature`` and ``top_p`` None, or the request's own sampling parameters, which replace
    the call's for that request: :func:`sampling_of`; an engine offers them where
    ``Capabilities.per_request_params``, else it refuses a call that sets them). params: one
    :class:`Params` for the whole call: ``model``, a Hugging Face Llama folder the suite exports
    (``inference-conformance export-model``: ``config.json`` and ``model.safetensors``; float32
    weights); ``temperature`` (0: greedy, else sampling from softmax(logits / temperature)),
    ``top_p`` in (0, 1]; ``speculative`` None or one of :data:`SPECULATIVE_METHODS` ("draft":
    with the model in ``draft``; "ngram": prompt lookup) proposing ``num_speculative_tokens``
    tokens per target call; ``prefix_caching``; ``chunked_prefill`` (None, or the token budget
    of a step, >= 1); ``padding`` (None, "left" or "right": how a batch of prompts of
    different lengths is laid out, for engines that pad).

    Returns one :class:`Completion` per request, in order: ``tokens`` (n,) int64 with n =
    ``max_new_tokens`` exactly (the stop token does not stop generation: engines run with it
    removed, ``ignore_eos``), and ``logprobs`` (n,) float64, the log-softmax of the model's raw
    logits (before temperature and top-p: the model's log-probabilities, as vLLM returns by
    default, whatever the request's sampling parameters) at each chosen token, or None where the
    engine does not give them (``Capabilities.logprobs`` False). An engine keeps its state between calls
    (a prefix cache lives across them, as a server's does); the output must not depend on it.

    Sampling: a request's tokens depend only on its prompt, ``seed`` and its sampling parameters
    (its own or the call's), for an engine that seeds per request (``Capabilities.seeded_sampling``
    "request"), whatever shares its call: seeded or unseeded requests, other temperatures and
    top-p, greedy ones; "batch": on the seeds of the whole call (one generator per call); "none":
    unseeded. The same call with the same seeds gives the same tokens (KV-2).

``serve(schedule, params) -> dict[id, Completion]`` (optional; an engine without it, or without
the part a call uses, raises NotImplementedError: "unsupported", never a pass)
    The step-level call (claims PA-6, PA-7, PA-8 for a whole engine). ``schedule``: a non-empty
    list of :class:`Arrival` (``id``: str or int, unique; ``request``: a :class:`Request`;
    ``step`` >= 0: the request is submitted before the engine's step ``step``, 0 before the
    first) and :class:`Fork` (``id``; ``parent``: the id of an earlier Arrival; ``after`` in
    [1, parent's max_new_tokens): the child continues the parent once the parent has generated
    exactly ``after`` tokens, sharing its blocks copy-on-write; ``seed``, ``temperature``: the
    child's own sampling after the fork). ``params`` as for ``generate`` (its temperature for
    every Arrival), with ``block_size`` and ``kv_blocks`` (None: the engine's own): the KV pool,
    which the laws make small enough that the engine must preempt (what it preempts and how it
    recomputes is its choice). Returns one Completion per id: an Arrival's ``max_new_tokens``
    tokens; a Fork's: the parent's ``max_new_tokens`` tokens, the parent's first ``after``
    followed by its own. Each must equal what the request gets alone (``generate`` of that
    request; a Fork: the parent's prompt and first ``after`` tokens as a prompt, at the Fork's
    seed and temperature), whatever else runs, arrives, is cached, chunked or preempted.
    ``Capabilities.serving`` lists the parts offered (:data:`SERVE_FEATURES`): "arrivals"
    (steps > 0), "fork", "kv_pool" (``block_size`` and ``kv_blocks`` honoured, also by
    ``generate``), "stats": each Completion then carries ``computed_tokens`` (positions whose
    K/V the engine computed for the request, recomputation after preemption included; a Fork's
    after the fork only), ``cached_tokens`` (prompt positions served from the prefix cache) and
    ``preemptions``; without "stats" they are None, PA-7's "computed once" goes unchecked and
    its verdict is "partial", never a plain pass.

Errors: ``validate(requests, params)`` is the contract's own check, which every engine calls
first: TypeError for a non-list ``requests``, an element that is not a Request, a non-int id,
seed or length, a request's temperature or top_p neither None nor a number, ``params`` not a
Params; ValueError naming the field for an empty list, an empty prompt, a negative id,
max_new_tokens < 1, temperature < 0 or not finite (the call's or a request's), top_p outside
(0, 1] (the call's or a request's),
an unknown speculative method, "draft" without ``draft``, num_speculative_tokens < 1, a budget
< 1, an unknown padding side, block_size or kv_blocks < 1; last, ValueError naming ``params.model`` (or ``params.draft``)
for a folder without ``config.json``. Ids at or above the model's vocabulary raise ValueError
naming ``prompt`` once the model is read. A setting the engine does not offer (its capabilities)
raises NotImplementedError: "unsupported", never a pass; a setting declared absent but accepted
is judged like any other call (a declaration of "no" must be true; seeds given to an engine
declaring "none" included: taken, they must repeat the tokens). ``validate_serve(schedule, params)``
checks a ``serve`` call: TypeError for a non-list schedule, an entry neither Arrival nor Fork, an
id neither str nor int, a non-Request request, a non-int step, after or seed; ValueError for an
empty schedule, an id used twice, a negative step, a Fork whose parent is no earlier Arrival,
``after`` outside [1, parent's max_new_tokens), a negative or non-finite Fork temperature; then
``validate`` of the Arrivals' requests and ``params``.

Oracle: the float64 reference model loaded from the same folder
(``inference_conformance.reference.inference_engine``: greedy and sampled generation, every step a full
forward; speculative decoding by the exact accept/reject rule). EN-1 judges greedy tokens
against its float64 logits teacher-forced on the engine's own output. No bound comes from what
the engine declares: a token that is not the float64 argmax (EN-1), or a token that differs
between two runs (EN-2, EN-3), is excused only as a near-tie of the tolerance rule
"engine-near-tie": the float64 gap between the two logits within 4 times the engine's measured
error on that request (max |logprob - float64 log-softmax| over its tokens; for an engine
returning no logprobs, the error of the suite's reference model run in the dtype it computes in:
never the engine's own greedy gaps, which would excuse its own wrong tokens), with a floor of 1e-12; each excused position is counted,
and more than 10 % excused positions in one example fail. Logprobs are judged by the dtype the
engine computes in: within 2·:func:`logit_bound` for float32 and float64, by the 16-bit model
rule (the reference model run in that dtype) for float16 and bfloat16. Sources: lecture 001 §2 and §4 (KV-1, KV-10, PA-6..PA-8 for a
whole engine), lecture 002 (SD-1, SD-7, SD-12), Kwon et al. 2023 (vLLM).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from inference_conformance.conformance.registry_declarations import Contract, InvalidCall
from inference_conformance.conformance.tolerance_rules import NEAR_TIE
from inference_conformance.conformance.contracts.inference_engine.generate import Params, Request
from inference_conformance.conformance.contracts.inference_engine.serve import invalid_serve

SEEDING = ("request", "batch", "none")


@dataclass
class Completion:
    """One request's output: ``tokens`` (n,) int64, ``logprobs`` (n,) float64 or None.

    What speculation did, where the engine says (None where it does not; engines that count per
    batch report it on the completion of a call holding one request): ``target_calls`` the
    target model's forward passes that produced the n tokens (prefill included: target-only
    decoding of n tokens takes n), ``drafted`` the draft tokens proposed and ``accepted`` those
    the target kept (claims SD-2, SD-3: tokens per target call n / target_calls, acceptance
    accepted / drafted). Figures for benchmarks: no law trusts them. ``serve``'s counts (None where
the engine does not report them, "stats"): ``computed_tokens``, ``cached_tokens``, ``preemptions``
(see the module docstring); PA-7 checks computed + cached per request."""

    tokens: torch.Tensor
    logprobs: torch.Tensor | None = None
    target_calls: int | None = None
    drafted: int | None = None
    accepted: int | None = None
    computed_tokens: int | None = None
    cached_tokens: int | None = None
    preemptions: int | None = None


@dataclass(frozen=True)
class Capabilities:
    """What an engine offers. The laws exercise what it declares; each part declared absent is
    called once (``properties/inference_engine/declarations.py``): refused, it is "unsupported";
    accepted, it is judged like any other call."""

    dtype: torch.dtype = torch.float32
    batching: bool = True
    padding: tuple = ()
    prefix_caching: bool = False
    chunked_prefill: bool = False
    speculative: tuple = ()
    seeded_sampling: str = "request"
    top_p: bool = True
    logprobs: bool = True
    batch_invariant: bool = False
    serving: tuple = ()
    per_request_params: bool = False


def logit_bound(dtype: torch.dtype) -> float:
    """Half the allowance on a returned logprob of an engine computing in float32 or float64:
    2^10 units of roundoff (float32: 6.1e-5; float64: 1.1e-13) for the small world's logits,
    which are O(10) after sums of a few hundred terms through 4 layers. It excuses no token (a
    near-tie is excused by the engine's measured error alone, see the module docstring); 16-bit
    engines' logprobs are judged by the 16-bit model rule instead."""
    return 2.0 ** 10 * torch.finfo(dtype).eps / 2


def sampling_of(request: Request, params: Params) -> tuple[float, float]:
    """(temperature, top_p) of ``request`` in a call with ``params``: its own where set, else the call's."""
    t = params.temperature if request.temperature is None else request.temperature
    return t, params.top_p if request.top_p is None else request.top_p


def check_vocab(requests, vocab_size: int) -> None:
    """ValueError naming ``prompt`` for an id at or above ``vocab_size`` (once the model is read)."""
    for i, r in enumerate(requests):
        if max(r.prompt) >= vocab_size:
            raise ValueError(f"requests[{i}].prompt holds id {max(r.prompt)} outside [0, {vocab_size})")


def folder_vocab_size(folder) -> int:
    """The vocabulary size the model folder ``folder`` declares (``config.json``'s ``vocab_size``):
    what an engine that does not expose its own checks prompt ids against (:func:`check_vocab`)."""
    import json

    return int(json.loads((Path(folder) / "config.json").read_text())["vocab_size"])


def refuse_unoffered(caps: Capabilities, requests, params, who: str) -> None:
    """NotImplementedError (the engine's refusal) for a setting ``caps`` does not offer."""
    if len(requests) > 1 and not caps.batching:
        raise NotImplementedError(f"{who} takes one request per call")
    if params.prefix_caching and not caps.prefix_caching:
        raise NotImplementedError(f"{who} has no prefix caching")
    if params.chunked_prefill is not None and not caps.chunked_prefill:
        raise NotImplementedError(f"{who} has no chunked prefill")
    if params.speculative is not None and params.speculative not in caps.speculative:
        raise NotImplementedError(f"{who} offers speculative methods {caps.speculative}, not {params.speculative!r}")
    if params.padding is not None and params.padding not in caps.padding:
        raise NotImplementedError(f"{who} pads on {caps.padding or 'no side'}, not {params.padding!r}")
    if (params.block_size is not None or params.kv_blocks is not None) and "kv_pool" not in caps.serving:
        raise NotImplementedError(f"{who} sets its own KV pool (no block_size / kv_blocks)")
    if any(r.temperature is not None or r.top_p is not None for r in requests) and not caps.per_request_params:
        raise NotImplementedError(f"{who} takes one temperature and top-p per call, not per request")
    if not caps.top_p and any(t > 0 and p < 1.0 for t, p in (sampling_of(r, params) for r in requests)):
        raise NotImplementedError(f"{who} has no top-p")


def invalid(device: str) -> list[InvalidCall]:
    """The documented bad calls; each fails ``validate`` before the (absent) model folder is read."""
    folder = "no-such-model-folder"
    ok = [Request((1, 5, 6), 2)]
    p = Params(folder)

    def bad(what, requests, params, raises, argument):
        return InvalidCall(what, (requests, params), raises=(raises,), argument=argument)

    return [
        bad("requests-not-a-list", tuple(ok), p, TypeError, "requests"),
        bad("requests-empty", [], p, ValueError, "requests"),
        bad("request-not-a-request", [(1, 5, 6)], p, TypeError, "requests[0]"),
        bad("prompt-empty", [Request((), 2)], p, ValueError, "prompt"),
        bad("prompt-negative-id", [Request((1, -5), 2)], p, ValueError, "prompt"),
        bad("prompt-float-id", [Request((1, 5.0), 2)], p, TypeError, "prompt"),
        bad("max-new-tokens-zero", [Request((1, 5), 0)], p, ValueError, "max_new_tokens"),
        bad("request-temperature-negative", [Request((1, 5), 2, temperature=-0.5)], p, ValueError, "temperature"),
        bad("request-temperature-not-a-number", [Request((1, 5), 2, temperature="hot")], p, TypeError, "temperature"),
        bad("request-top-p-above-one", [Request((1, 5), 2, temperature=1.0, top_p=1.5)], p, ValueError, "top_p"),
        bad("params-not-params", ok, {"model": folder}, TypeError, "params"),
        bad("temperature-negative", ok, Params(folder, temperature=-1.0), ValueError, "temperature"),
        bad("temperature-nan", ok, Params(folder, temperature=float("nan")), ValueError, "temperature"),
        bad("top-p-zero", ok, Params(folder, temperature=1.0, top_p=0.0), ValueError, "top_p"),
        bad("speculative-unknown", ok, Params(folder, speculative="medusa"), ValueError, "speculative"),
        bad("draft-missing", ok, Params(folder, speculative="draft"), ValueError, "draft"),
        bad("speculative-tokens-zero", ok, Params(folder, num_speculative_tokens=0), ValueError,
            "num_speculative_tokens"),
        bad("budget-zero", ok, Params(folder, chunked_prefill=0), ValueError, "chunked_prefill"),
        bad("padding-unknown", ok, Params(folder, padding="middle"), ValueError, "padding"),
        bad("block-size-zero", ok, Params(folder, block_size=0), ValueError, "block_size"),
        bad("kv-blocks-zero", ok, Params(folder, kv_blocks=0), ValueError, "kv_blocks"),
        bad("model-not-a-folder", ok, p, ValueError, "model"),
        *invalid_serve(folder, ok[0], p),
    ]


CONTRACT = Contract(
    technique="inference_engine",
    functions=("generate", "capabilities"),
    doc=__doc__,
    optional=("serve",),
    returns={"generate": list, "capabilities": Capabilities, "serve": dict},
    invalid=invalid,
    rules={"engine-near-tie": NEAR_TIE},
)
# No ``cases``: every valid call needs an exported model folder, which a layer above this one
# writes (smallworld/hf_export.py); the laws' determinism check (KV-2) repeats calls instead.
