"""An inference engine written outside the suite, from its contract page (docs/inference_engine.md)
alone: ``generate`` and the step-level ``serve``.

Checked with no change to the suite:

    CI=true PYTHONPATH=examples .venv/bin/python -m pytest -n 1 properties/inference_engine --impl inference_engine=my_engine:ENGINE

A plain loop: every request runs alone, one full float64 forward per token (no KV cache, so the
prefix cache, the token budget and the KV pool are accepted and change nothing). ``serve`` takes
the schedule's arrivals and forks; a fork continues its parent's prompt and first ``after``
tokens with its own seed. ``BUGGY`` is the same with a classic fork bug: the child continues
from the parent's prompt alone, forgetting the tokens the parent had generated at the fork.
"""
from __future__ import annotations

import dataclasses

import torch

from inference_conformance.conformance.contracts.inference_engine import (
    Arrival,
    Capabilities,
    Completion,
    Request,
    check_vocab,
    refuse_unoffered,
    refuse_unserved,
    validate,
    validate_serve,
)
from inference_conformance.smallworld.hf_llama import load_hf_llama


class MyEngine:
    """Each request alone through the float64 model, greedy or sampled with its own generator."""

    def __init__(self):
        self._models = {}

    def capabilities(self) -> Capabilities:
        return Capabilities(dtype=torch.float64, batching=True, prefix_caching=True, chunked_prefill=True,
                            seeded_sampling="request", top_p=False, logprobs=True, batch_invariant=True,
                            serving=("arrivals", "fork", "kv_pool"))

    def _model(self, folder):
        if str(folder) not in self._models:
            self._models[str(folder)] = load_hf_llama(folder, dtype=torch.float64)
        return self._models[str(folder)]

    @torch.no_grad()
    def _one(self, model, request: Request, temperature: float) -> Completion:
        gen = torch.Generator()
        gen.manual_seed(request.seed if request.seed is not None else 0)
        seq, tokens, logprobs = list(request.prompt), [], []
        for _ in range(request.max_new_tokens):
            logits = model(torch.tensor([seq]))[0, -1].double()
            if temperature == 0:
                x = int(logits.argmax())
            else:
                x = int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen))
            logprobs.append(float(torch.log_softmax(logits, -1)[x]))
            tokens.append(x)
            seq.append(x)
        return Completion(torch.tensor(tokens, dtype=torch.int64), torch.tensor(logprobs, dtype=torch.float64))

    def generate(self, requests, params) -> list[Completion]:
        validate(requests, params)
        refuse_unoffered(self.capabilities(), requests, params, "my engine")
        model = self._model(params.model)
        check_vocab(requests, model.cfg.vocab_size)
        return [self._one(model, r, float(params.temperature)) for r in requests]

    def fork_prompt(self, parent: Request, lead: tuple) -> tuple:
        """The prompt a fork continues: the parent's prompt and its tokens at the fork."""
        return tuple(parent.prompt) + lead

    def serve(self, schedule, params) -> dict:
        validate_serve(schedule, params)
        arrivals = [e for e in schedule if isinstance(e, Arrival)]
        refuse_unoffered(self.capabilities(), [e.request for e in arrivals], params, "my engine")
        refuse_unserved(self.capabilities().serving, schedule, params, "my engine")
        plain = dataclasses.replace(params, block_size=None, kv_blocks=None)
        out = {e.id: self.generate([e.request], plain)[0] for e in arrivals}
        for e in schedule:
            if isinstance(e, Arrival):
                continue
            parent = next(a.request for a in arrivals if a.id == e.parent)
            lead = tuple(out[e.parent].tokens[:e.after].tolist())
            child = Request(self.fork_prompt(parent, lead), parent.max_new_tokens - e.after, e.seed)
            c = self.generate([child], dataclasses.replace(plain, temperature=e.temperature))[0]
            out[e.id] = Completion(torch.cat([out[e.parent].tokens[:e.after], c.tokens]), None)
        return out


class ForkForgetsParentTokens(MyEngine):
    """The fork continues from the parent's prompt only (the parent's tokens at the fork left out)."""

    def fork_prompt(self, parent: Request, lead: tuple) -> tuple:
        return tuple(parent.prompt)


ENGINE = MyEngine()
BUGGY = ForkForgetsParentTokens()
