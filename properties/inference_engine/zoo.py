"""The inference_engine bug zoo: one realistic bug per engine, each rejected by a law of
``properties/inference_engine/test_inference_engine.py`` (EN-1..EN-3, KV-2) or of
``properties/inference_engine/test_serving.py`` (PA-6..PA-8 through ``serve``: the paged engine's
known-bad versions of ``properties/paged_attention/zoo.py`` behind its adapter) through its own
comparison."""
from __future__ import annotations

import dataclasses

import torch

from inference_conformance.optimized.inference_engine.suite import PagedAdapter, load
from inference_conformance.optimized.paged_attention.engine import PagedEngine
from inference_conformance.reference.inference_engine import ReferenceEngine, draw


class BatchDependent(ReferenceEngine):
    """Runs a batch as one left-padded matrix without an attention mask (and positions counted
    from the padding): a request's tokens depend on what it is batched with."""

    def _next_logits(self, model, seqs):
        if len(seqs) == 1:
            return super()._next_logits(model, seqs)
        T = max(len(s) for s in seqs)
        mat = torch.tensor([[0] * (T - len(s)) + s for s in seqs])
        return model(mat)[:, -1]


class _DeclaresNoBatching:
    """Declares no batching yet takes batches (mixed into an engine of the zoo)."""

    def capabilities(self):
        return dataclasses.replace(super().capabilities(), batching=False)

    def _offered(self):
        return dataclasses.replace(super().capabilities(), batching=True)


class UndeclaredBatching(_DeclaresNoBatching, BatchDependent):
    """Declares no batching, yet takes a batch and runs it as :class:`BatchDependent` does (one
    left-padded matrix without a mask): the other laws, sending one request per call as declared,
    never see it."""


class UndeclaredBatchingSharedSeed(_DeclaresNoBatching, ReferenceEngine):
    """Declares no batching, yet takes a batch, exact except that the last request of a batch
    samples with the first one's seed: greedy batches are right, seeded ones are not."""

    def generate(self, requests, params):
        if len(requests) > 1 and requests[0].seed is not None:
            requests = requests[:-1] + [dataclasses.replace(requests[-1], seed=requests[0].seed)]
        return super().generate(requests, params)


class IgnoresTemperature(ReferenceEngine):
    """Samples from softmax(logits) whatever the request's temperature (top-p kept)."""

    def _distribution(self, logits, params):
        from inference_conformance.reference.speculative import process_logits

        return process_logits(logits.double(), 1.0, 0, params.top_p)


class BonusFromDraft(ReferenceEngine):
    """After γ accepted draft tokens, takes the bonus token from the draft's distribution (its
    argmax when greedy) instead of the target's."""

    def _bonus(self, target_logits, draft, seq, params, gen):
        logits = self._next_logits(draft, [seq])[0]
        return int(logits.argmax()) if params.temperature == 0 else draw(self._distribution(logits, params), gen)


class DraftPositionsAtOtherTemperature(ReferenceEngine):
    """Verifies (accepts and resamples) its draft positions at a fixed temperature 0.6 instead of
    the request's: the request's sampling parameters never reach the draft positions, so the
    tokens emitted there follow the target at 0.6 (the bonus token is right)."""

    def _verify_distribution(self, logits, params):
        from inference_conformance.reference.speculative import process_logits

        return process_logits(logits.double(), 0.6, 0, params.top_p)


class Unseeded(ReferenceEngine):
    """Ignores the requests' seeds (a fresh random generator per request)."""

    def _generator(self, seed):
        return super()._generator(None)


class ArgmaxLogprobs(ReferenceEngine):
    """Reports the log-probability of the most likely token instead of the chosen one (the same
    where decoding is greedy; wrong wherever a sampled token is not the argmax)."""

    def _logprob(self, logits, x):
        return float(torch.log_softmax(logits.double(), -1).max())


class NoLogprobsShortPromptFlip(ReferenceEngine):
    """Returns no logprobs, and takes the runner-up instead of the argmax wherever a sequence holds
    exactly three tokens: one wrong greedy token after every prompt shorter than four. Its own
    greedy gaps, taken as its allowance, excused it (the allowance of an engine without logprobs is
    the reference model's error in its dtype: ``cases.dtype_error``)."""

    def capabilities(self):
        return dataclasses.replace(super().capabilities(), logprobs=False)

    def _next_logits(self, model, seqs):
        logits = super()._next_logits(model, seqs).clone()
        for i, s in enumerate(seqs):
            if len(s) == 3:
                first, second = logits[i].topk(2).indices.tolist()
                logits[i, first], logits[i, second] = logits[i, second].clone(), logits[i, first].clone()
        return logits

    def generate(self, requests, params):
        return [dataclasses.replace(c, logprobs=None) for c in super().generate(requests, params)]


class DeclaredBfloat16BatchFlips(ReferenceEngine):
    """Computes in float64 and declares bfloat16; in a call of 4 or more requests, a greedy
    token whose float64 top-two gap is under 1 becomes the runner-up (its logprob reported
    exactly): the batch changes tokens where no rounding explains it."""

    _batch = 1

    def capabilities(self):
        return dataclasses.replace(super().capabilities(), dtype=torch.bfloat16, batch_invariant=False)

    def _generate(self, requests, params):
        self._batch = len(requests)
        return super()._generate(requests, params)

    def _choose(self, logits, params, gen):
        top2 = logits.double().topk(2)
        if params.temperature == 0 and self._batch >= 4 and float(top2.values[0] - top2.values[1]) < 1.0:
            return int(top2.indices[1])
        return super()._choose(logits, params, gen)


class ProcessedLogprobs(ReferenceEngine):
    """Reports the logprobs of the sampling distribution (after temperature and top-p) instead of
    the model's raw log-softmax: the same at temperature 1 and top-p 1 only."""

    def _choose(self, logits, params, gen):
        self._params = params
        return super()._choose(logits, params, gen)

    _params = None

    def _logprob(self, logits, x):
        if self._params is None or self._params.temperature == 0:
            return super()._logprob(logits, x)
        return float(torch.log(self._distribution(logits, self._params)[x]))


class SeedLostBesideUnseeded(ReferenceEngine):
    """Draws every request of a call from fresh random generators when one of its requests is
    unseeded (one generator state for the batch): a seeded request's tokens then depend on its
    batch-mates."""

    _mixed = False

    def _generate(self, requests, params):
        self._mixed = any(r.seed is None for r in requests)
        return super()._generate(requests, params)

    def _generator(self, seed):
        return super()._generator(None if self._mixed else seed)


class StaleKeyEngine(PagedEngine):
    """Keys a prefix-cache block by its own tokens only, not its parent's key."""

    def _block_key(self, parent, tokens):
        return super()._block_key("", tokens)


class StalePrefix(PagedAdapter):
    """The paged engine whose prefix cache serves a block whose tokens match after another prefix."""

    engine_class = StaleKeyEngine


class UndeclaredPerRequestParamsIgnored(ReferenceEngine):
    """Declares sampling parameters per call only, yet takes requests carrying their own and
    samples them at the call's temperature and top-p (the requests' own silently dropped)."""

    def capabilities(self):
        return dataclasses.replace(super().capabilities(), per_request_params=False)

    def generate(self, requests, params):
        return super().generate([dataclasses.replace(r, temperature=None, top_p=None) for r in requests], params)


def _serving(engine_class, name: str):
    """The paged engine's adapter over the known-bad ``engine_class`` (``properties/paged_attention/zoo.py``)."""
    return type(name, (PagedAdapter,), {"engine_class": engine_class, "__doc__": engine_class.__doc__})()


def _paged_bad(name: str):
    """The paged engine's adapter over its known-bad engine ``name`` (``properties/paged_attention/zoo.py``)."""
    from inference_conformance.properties.paged_attention.zoo import serving_engine_zoo

    return _serving(serving_engine_zoo()[name], name)


def implementations():
    from inference_conformance.conformance.registry import known_bad

    return (
        known_bad("inference_engine", "batch_dependent", BatchDependent(load),
                  bug="A batch runs as one left-padded matrix without a mask: outputs depend on batch-mates"),
        known_bad("inference_engine", "undeclared_batching", UndeclaredBatching(load),
                  bug="Declares no batching, yet takes batches and pads them without a mask"),
        known_bad("inference_engine", "undeclared_batching_shared_seed", UndeclaredBatchingSharedSeed(load),
                  bug="Declares no batching, takes batches, and samples a batch's last request with its first one's seed"),
        known_bad("inference_engine", "undeclared_per_request_params_ignored", UndeclaredPerRequestParamsIgnored(load),
                  bug="Declares per-call sampling parameters, takes per-request ones and ignores them"),
        known_bad("inference_engine", "stale_prefix", StalePrefix(),
                  bug="The prefix cache keys a block by its tokens only and serves it after another prefix"),
        known_bad("inference_engine", "bonus_from_draft", BonusFromDraft(load),
                  bug="The bonus token after γ accepted draft tokens comes from the draft, not the target"),
        known_bad("inference_engine", "ignores_temperature", IgnoresTemperature(load),
                  bug="The sampler ignores the request's temperature (samples at 1)"),
        known_bad("inference_engine", "draft_positions_other_temperature", DraftPositionsAtOtherTemperature(load),
                  bug="Draft positions are verified at temperature 0.6, not the request's"),
        known_bad("inference_engine", "unseeded", Unseeded(load), bug="The sampler ignores the requests' seeds"),
        known_bad("inference_engine", "argmax_logprobs", ArgmaxLogprobs(load),
                  bug="Logprobs of the argmax token, not of the chosen one (right only when greedy)"),
        known_bad("inference_engine", "no_logprobs_short_prompt_flip", NoLogprobsShortPromptFlip(load),
                  bug="Without logprobs, takes the runner-up token after every prompt shorter than four"),
        known_bad("inference_engine", "declared_bfloat16_batch_flips", DeclaredBfloat16BatchFlips(load),
                  bug="Computes in float64, declares bfloat16; in batches of 4+ a greedy near-tie (gap < 1) flips"),
        known_bad("inference_engine", "processed_logprobs", ProcessedLogprobs(load),
                  bug="Logprobs after temperature and top-p, not the model's raw log-softmax (right at T=1 only)"),
        known_bad("inference_engine", "seed_lost_beside_unseeded", SeedLostBesideUnseeded(load),
                  bug="A seeded request loses its seed when an unseeded request shares its call"),
        known_bad("inference_engine", "query_misses_its_own_token", _paged_bad("query_misses_its_own_token"),
                  bug="Each token's query misses its own key (seq_lens one short): right only for the first token"),
        known_bad("inference_engine", "chunk_kv_written_after_attention", _paged_bad("chunk_kv_written_after_attention"),
                  bug="Each layer attends before writing the step's K/V: a chunk's queries miss their own chunk"),
        known_bad("inference_engine", "fork_writes_into_the_shared_block", _paged_bad("fork_writes_into_the_shared_block"),
                  bug="Copy-on-write never copies: a fork and its parent write into the block they share"),
        known_bad("inference_engine", "prefix_published_before_computed", _paged_bad("prefix_published_before_computed"),
                  bug="Prompt blocks enter the prefix cache at admission, before their chunk is computed"),
    )
