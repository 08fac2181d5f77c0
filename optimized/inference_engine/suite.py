"""The suite's own engines under the ``inference_engine`` contract, through thin adapters that translate
requests and settings only: :class:`PagedAdapter` drives
:class:`inference_conformance.optimized.paged_attention.engine.PagedEngine` (continuous batching, prefix cache, chunked
prefill; its prefix cache kept across calls, as a server's), :class:`SpeculativeAdapter`
:class:`inference_conformance.optimized.speculative.engine.SpeculativeEngine` (a draft model; plain generation
through the paged engine). Models are read from the exported folders by
:func:`inference_conformance.smallworld.hf_llama.load_hf_llama` in float32."""
from __future__ import annotations

import hashlib
import itertools

import torch

from inference_conformance.conformance.contracts.inference_engine import (
    Capabilities,
    Completion,
    check_vocab,
    refuse_unoffered,
    validate,
)
from inference_conformance.optimized.paged_attention.engine import PagedEngine
from inference_conformance.optimized.speculative.engine import SpeculativeEngine
from inference_conformance.reference.inference_engine import ReferenceEngine
from inference_conformance.smallworld.hf_llama import load_hf_llama

#: Block size and pool of the paged engine (the small world's sequences are at most 128 tokens).
BLOCK_SIZE, NUM_BLOCKS, MAX_BATCH = 4, 512, 16


def load(folder, dtype: torch.dtype):
    """The model of an exported folder as a reference Transformer in ``dtype``."""
    return load_hf_llama(folder, dtype=dtype)


def reference_engine() -> ReferenceEngine:
    """The float64 reference engine reading folders with the small world's reader."""
    return ReferenceEngine(load)


def _generator(seed) -> torch.Generator:
    g = torch.Generator()
    return g.manual_seed(seed) if seed is not None else (g.seed(), g)[1]


def _completion(tokens, logits) -> Completion:
    t = torch.tensor(tokens, dtype=torch.int64)
    if logits is None:
        return Completion(t, None)
    lp = torch.log_softmax(torch.stack(logits).double(), -1)
    return Completion(t, lp[torch.arange(len(tokens)), t])


class PagedAdapter:
    """The suite's paged engine (float32): batching, prefix caching, chunked prefill, seeds per request."""

    engine_class = PagedEngine
    who = "the paged engine"

    def __init__(self):
        self._models: dict = {}
        self._engines: dict = {}
        self._ids = itertools.count()

    def capabilities(self) -> Capabilities:
        return Capabilities(dtype=torch.float32, batching=True, prefix_caching=True, chunked_prefill=True,
                            seeded_sampling="request", top_p=False, logprobs=True, batch_invariant=False)

    def model(self, folder):
        if str(folder) not in self._models:
            self._models[str(folder)] = load(folder, torch.float32)
        return self._models[str(folder)]

    def engine(self, params) -> PagedEngine:
        """One engine per (model, prefix caching, budget), kept across calls (its prefix cache too)."""
        key = (str(params.model), params.prefix_caching, params.chunked_prefill)
        if key not in self._engines:
            self._engines[key] = self.engine_class(
                self.model(params.model), num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, max_batch=MAX_BATCH,
                prefix_cache=params.prefix_caching, max_num_batched_tokens=params.chunked_prefill, keep_logits=True)
        return self._engines[key]

    @torch.no_grad()
    def generate(self, requests, params) -> list[Completion]:
        validate(requests, params)
        refuse_unoffered(self.capabilities(), requests, params, self.who)
        return self._plain(requests, params)

    def _plain(self, requests, params) -> list[Completion]:
        eng = self.engine(params)
        check_vocab(requests, eng.cfg.vocab_size)
        rids = [next(self._ids) for _ in requests]
        for rid, r in zip(rids, requests):
            eng.add_request(rid, list(r.prompt), r.max_new_tokens, float(params.temperature), _generator(r.seed))
        eng.run()
        out = [_completion(eng.finished.pop(rid), eng.logits.pop(rid)) for rid in rids]
        return out


class SpeculativeAdapter(PagedAdapter):
    """The suite's speculative engine (float32) with a draft model; plain generation through the
    paged engine. One generator per call (its seed from every request's seed): "batch" seeding;
    rows of one prompt length run together; no logprobs from speculation."""

    who = "the speculative engine"

    def capabilities(self) -> Capabilities:
        return Capabilities(dtype=torch.float32, batching=True, speculative=("draft",), seeded_sampling="batch",
                            top_p=True, logprobs=False, batch_invariant=False)

    @torch.no_grad()
    def generate(self, requests, params) -> list[Completion]:
        validate(requests, params)
        refuse_unoffered(self.capabilities(), requests, params, self.who)
        if params.speculative is None:
            if params.top_p < 1.0 and params.temperature > 0:
                raise NotImplementedError("the paged engine (plain generation) has no top-p")
            return [Completion(c.tokens, None) for c in self._plain(requests, params)]
        target, draft = self.model(params.model), self.model(params.draft)
        check_vocab(requests, target.cfg.vocab_size)
        seeds = ",".join(str(r.seed) for r in requests)
        gen = torch.Generator().manual_seed(int(hashlib.sha256(seeds.encode()).hexdigest()[:12], 16))
        out: list = [None] * len(requests)
        for length in sorted({len(r.prompt) for r in requests}):
            rows = [i for i, r in enumerate(requests) if len(r.prompt) == length]
            n = max(requests[i].max_new_tokens for i in rows)
            g = params.num_speculative_tokens
            eng = SpeculativeEngine(target, draft, gamma=g, max_batch=len(rows), max_seq_len=length + n + 2 * g + 1,
                                    temperature=float(params.temperature), top_p=float(params.top_p))
            prompt = torch.tensor([list(requests[i].prompt) for i in rows], dtype=torch.int64)
            tokens, stats = eng.generate(prompt, n, generator=gen)
            # per-row figures only for a call of one request (the engine sums its rows): each
            # round is one target pass, the prompt's prefill (all but its last token) one more
            spec = (dict(target_calls=stats["rounds"] + (length > 1), drafted=stats["drafted"],
                         accepted=stats["accepted"]) if len(requests) == 1 else {})
            for row, i in enumerate(rows):
                out[i] = Completion(tokens[row, length:length + requests[i].max_new_tokens].clone(), None, **spec)
        return out
