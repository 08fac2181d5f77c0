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
    Arrival,
    Capabilities,
    Completion,
    check_vocab,
    refuse_unoffered,
    refuse_unserved,
    sampling_of,
    validate,
    validate_serve,
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
                            seeded_sampling="request", top_p=False, logprobs=True, batch_invariant=False,
                            serving=("arrivals", "fork", "kv_pool", "stats"), per_request_params=True)

    def model(self, folder):
        if str(folder) not in self._models:
            self._models[str(folder)] = load(folder, torch.float32)
        return self._models[str(folder)]

    def engine(self, params) -> PagedEngine:
        """One engine per (model, prefix caching, budget, pool), kept across calls (its prefix cache
        too); a pool given by ``block_size`` / ``kv_blocks`` a fresh engine per call."""
        bs, nb = params.block_size or BLOCK_SIZE, params.kv_blocks or NUM_BLOCKS
        key = (str(params.model), params.prefix_caching, params.chunked_prefill, bs, nb)
        if key not in self._engines or params.kv_blocks is not None:
            self._engines[key] = self.engine_class(
                self.model(params.model), num_blocks=nb, block_size=bs, max_batch=MAX_BATCH,
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
            eng.add_request(rid, list(r.prompt), r.max_new_tokens, float(sampling_of(r, params)[0]), _generator(r.seed))
        eng.run()
        out = [_completion(eng.finished.pop(rid), eng.logits.pop(rid)) for rid in rids]
        return out


    @torch.no_grad()
    def serve(self, schedule, params) -> dict:
        """The contract's ``serve``: each Arrival added before its step, each Fork made (by the
        engine's copy-on-write fork, or, where the parent is not running with its tokens
        computed, as a request of the parent's prompt and first ``after`` tokens)."""
        validate_serve(schedule, params)
        refuse_unoffered(self.capabilities(), [e.request for e in schedule if isinstance(e, Arrival)], params, self.who)
        refuse_unserved(self.capabilities().serving, schedule, params, self.who)
        eng = self.engine(params)
        check_vocab([e.request for e in schedule if isinstance(e, Arrival)], eng.cfg.vocab_size)
        rid = {e.id: next(self._ids) for e in schedule}
        arrivals = sorted((e for e in schedule if isinstance(e, Arrival)), key=lambda e: e.step)
        forks = [e for e in schedule if not isinstance(e, Arrival)]
        prefix = {}                     # a fork added as a request: the parent's tokens it starts from
        step = 0
        while arrivals or forks or eng.has_work():
            while arrivals and arrivals[0].step <= step:
                e = arrivals.pop(0)
                r = e.request
                eng.add_request(rid[e.id], list(r.prompt), r.max_new_tokens, float(sampling_of(r, params)[0]),
                                _generator(r.seed))
            for f in list(forks):
                p = next((r for r in eng.running + list(eng.waiting) if r.rid == rid[f.parent]), None)
                if p is None or len(p.out) != f.after:
                    continue
                forks.remove(f)
                if any(r is p for r in eng.running) and p.computed == len(p.tokens) - 1:
                    eng.fork(p.rid, rid[f.id], _generator(f.seed), temperature=float(f.temperature))
                    eng.logits[rid[f.id]] = list(eng.logits[p.rid])
                else:
                    prefix[rid[f.id]] = list(p.out)
                    eng.add_request(rid[f.id], p.tokens, p.max_new - f.after, float(f.temperature), _generator(f.seed))
            eng.step()
            step += 1
        out = {}
        for e in schedule:
            i = rid[e.id]
            c = _completion(eng.finished.pop(i), eng.logits.pop(i))
            if i in prefix:             # logprobs of the parent's tokens are the parent's
                c = Completion(torch.tensor(prefix[i] + c.tokens.tolist()), None)
            out[e.id] = Completion(c.tokens, c.logprobs, computed_tokens=eng.computed_by.pop(i, 0),
                                   cached_tokens=eng.reused_by.pop(i, 0), preemptions=eng.preempted_by.pop(i, 0))
        return out


class SpeculativeAdapter(PagedAdapter):
    """The suite's speculative engine (float32) with a draft model; plain generation through the
    paged engine. One generator per call (its seed from every request's seed): "batch" seeding;
    rows of one prompt length and sampling parameters run together; no logprobs from speculation."""

    who = "the speculative engine"

    def capabilities(self) -> Capabilities:
        return Capabilities(dtype=torch.float32, batching=True, speculative=("draft",), seeded_sampling="batch",
                            top_p=True, logprobs=False, batch_invariant=False, per_request_params=True)

    @torch.no_grad()
    def generate(self, requests, params) -> list[Completion]:
        validate(requests, params)
        refuse_unoffered(self.capabilities(), requests, params, self.who)
        if params.speculative is None:
            if any(t > 0 and p < 1.0 for t, p in (sampling_of(r, params) for r in requests)):
                raise NotImplementedError("the paged engine (plain generation) has no top-p")
            return [Completion(c.tokens, None) for c in self._plain(requests, params)]
        target, draft = self.model(params.model), self.model(params.draft)
        check_vocab(requests, target.cfg.vocab_size)
        seeds = ",".join(str(r.seed) for r in requests)
        gen = torch.Generator().manual_seed(int(hashlib.sha256(seeds.encode()).hexdigest()[:12], 16))
        out: list = [None] * len(requests)
        groups = sorted({(len(r.prompt), *sampling_of(r, params)) for r in requests})
        for length, t, top_p in groups:     # rows of one prompt length and sampling parameters together
            rows = [i for i, r in enumerate(requests) if (len(r.prompt), *sampling_of(r, params)) == (length, t, top_p)]
            n = max(requests[i].max_new_tokens for i in rows)
            g = params.num_speculative_tokens
            eng = SpeculativeEngine(target, draft, gamma=g, max_batch=len(rows), max_seq_len=length + n + 2 * g + 1,
                                    temperature=float(t), top_p=float(top_p))
            prompt = torch.tensor([list(requests[i].prompt) for i in rows], dtype=torch.int64)
            tokens, stats = eng.generate(prompt, n, generator=gen)
            # per-row figures only for a call of one request (the engine sums its rows): each
            # round is one target pass, the prompt's prefill (all but its last token) one more
            spec = (dict(target_calls=stats["rounds"] + (length > 1), drafted=stats["drafted"],
                         accepted=stats["accepted"]) if len(requests) == 1 else {})
            for row, i in enumerate(rows):
                out[i] = Completion(tokens[row, length:length + requests[i].max_new_tokens].clone(), None, **spec)
        return out
