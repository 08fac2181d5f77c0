"""transformers' continuous batching under the ``inference_engine`` contract: ``LlamaForCausalLM`` read
from the exported folder in float32 (as :mod:`.hf` reads it), its ``ContinuousBatchingManager``
(``model.init_continuous_batching``, transformers 5.x: a paged KV cache, a scheduler that mixes
prefill chunks and decode steps of several requests in one batch, block sharing between prompts)
given every request with its own ``max_new_tokens``, greedy, logprobs returned.

The contract's settings map to its ``ContinuousBatchingConfig``: ``block_size`` to ``page_size``,
``kv_blocks`` to ``num_blocks`` (default: every request's blocks), ``prefix_caching`` to
``allow_block_sharing``, a chunked-prefill budget to ``max_batch_tokens`` (default: 256). Its
scheduler runs in a thread of its own and decides the steps, so ``serve``'s arrivals are queued
as the outputs stream in: a request arriving at step s once some running request has made s
tokens (it lands at or after its step, never before); a set KV pool ("kv_pool"); no forks, no
counts. Sampling is refused (the manager
seeds one generator for all its requests, not one per request), and so are blocks of fewer than
4 tokens (its smallest page). A manager that does not finish
within :data:`TIMEOUT_S` is stopped and the call fails (RuntimeError), never hangs.

Registration ``hf_continuous`` (``peer="hf"``: it runs in ``tox -e peers-hf``).
"""
from __future__ import annotations

import time

import torch

from inference_conformance.conformance.contracts.inference_engine import (
    Capabilities,
    Completion,
    check_vocab,
    refuse_unoffered,
    validate,
)

#: Seconds a manager may take to finish one call's requests before the call fails.
TIMEOUT_S = 120.0
#: Tokens per block and per batch where the call sets none; the smallest page it takes.
PAGE_SIZE, BATCH_TOKENS, MIN_PAGE = 16, 256, 4


class HFContinuous:
    """transformers' ``ContinuousBatchingManager`` (greedy, float32)."""

    def __init__(self):
        from inference_conformance.optimized.inference_engine.hf import HFGenerate

        self._reader = HFGenerate("dynamic")               # the same model, read the same way

    def capabilities(self) -> Capabilities:
        return Capabilities(dtype=torch.float32, batching=True, prefix_caching=True, chunked_prefill=True,
                            speculative=(), seeded_sampling="none", top_p=False, logprobs=True,
                            batch_invariant=False, serving=("arrivals", "kv_pool"))

    def _refuse(self, requests, params) -> None:
        refuse_unoffered(self.capabilities(), requests, params, "transformers' continuous batching")
        if params.block_size is not None and params.block_size < MIN_PAGE:
            raise NotImplementedError(f"transformers' continuous batching takes pages of at least {MIN_PAGE} tokens, "
                                      f"not block_size={params.block_size}")
        if params.temperature > 0:
            raise NotImplementedError("transformers' continuous batching: greedy only (its manager seeds one "
                                      "generator for every request, not one per request)")

    @torch.no_grad()
    def generate(self, requests, params) -> list[Completion]:
        validate(requests, params)
        self._refuse(requests, params)
        return self._run(requests, params)

    @torch.no_grad()
    def serve(self, schedule, params) -> dict:
        """The contract's ``serve``: arrivals (each queued once some running request has made as
        many tokens as its step: the manager's steps are its own, so it lands at or after its
        step), a set KV pool; no fork, no counts."""
        from inference_conformance.conformance.contracts.inference_engine import (
            Arrival,
            refuse_unserved,
            validate_serve,
        )

        validate_serve(schedule, params)
        refuse_unserved(self.capabilities().serving, schedule, params, "transformers' continuous batching")
        arrivals = [e for e in schedule if isinstance(e, Arrival)]
        self._refuse([e.request for e in arrivals], params)
        out = self._run([e.request for e in arrivals], params, [e.step for e in arrivals])
        return dict(zip((e.id for e in arrivals), out))

    def _run(self, requests, params, steps=None) -> list[Completion]:
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        model = self._reader.model(params.model)
        check_vocab(requests, model.config.vocab_size)
        page = params.block_size or PAGE_SIZE
        blocks = params.kv_blocks or sum(-(-(len(r.prompt) + r.max_new_tokens) // page) for r in requests) + 1
        budget = params.chunked_prefill if params.chunked_prefill is not None else BATCH_TOKENS
        config = ContinuousBatchingConfig(page_size=page, num_blocks=blocks, max_batch_tokens=budget,
                                          allow_block_sharing=bool(params.prefix_caching), return_logprobs=True,
                                          use_cuda_graph=False)
        gen = GenerationConfig(max_new_tokens=max(r.max_new_tokens for r in requests), do_sample=False,
                               eos_token_id=None, pad_token_id=0)
        manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=config)
        ids = [f"r{i}" for i in range(len(requests))]
        steps = list(steps) if steps is not None else [0] * len(requests)
        pending = sorted(range(len(requests)), key=lambda i: steps[i])
        got: dict = {}
        made = 0                                                 # the most tokens any request has so far

        def admit_due():
            while pending and steps[pending[0]] <= made:
                i = pending.pop(0)
                manager.add_request(list(requests[i].prompt), request_id=ids[i], streaming=True,
                                    max_new_tokens=requests[i].max_new_tokens)
        admit_due()
        manager.start()
        deadline = time.monotonic() + TIMEOUT_S
        try:
            while len(got) < len(ids):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"transformers' continuous batching finished {len(got)} of {len(ids)} "
                                       f"requests in {TIMEOUT_S:g} s (pool of {blocks} blocks of {page})")
                if not pending or len(got) + len(pending) < len(ids):
                    res = manager.get_result(timeout=1)
                else:                                             # nothing running: the next arrival is due
                    res, made = None, steps[pending[0]]
                if res is not None:
                    if getattr(res, "error", None):
                        raise RuntimeError(f"transformers' continuous batching failed request {res.request_id}: "
                                           f"{res.error}")
                    made = max(made, len(res.generated_tokens))
                    if res.is_finished():
                        got[res.request_id] = res
                admit_due()
        finally:
            manager.stop(block=True)
            destroy = getattr(model, "destroy_cached_continuous_batching_manager", None)
            if destroy is not None:
                destroy()
        return [Completion(torch.tensor(got[rid].generated_tokens, dtype=torch.int64),
                           torch.tensor(got[rid].logprobs, dtype=torch.float64)) for rid in ids]
