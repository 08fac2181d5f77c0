"""The reference engine of the ``inference_engine`` contract: generation with the reference model in
float64, every step a full forward without a cache, one request at a time (claims EN-1..EN-3).

:class:`ReferenceEngine` answers ``generate(requests, params)``
(:mod:`inference_conformance.conformance.contracts.inference_engine`): greedy decoding (argmax of the
float64 logits) or sampling from :func:`inference_conformance.reference.speculative.process_logits`
(temperature, top-p: the request's own where it sets them, else the call's) by inverse CDF with
one float64 uniform per token from the request's own ``torch.Generator`` seeded with its
``seed`` (None: a fresh random seed); logprobs are the float64
log-softmax of the raw logits at the chosen tokens. Speculative decoding with a draft model
("draft", Leviathan et al. 2023): the draft proposes γ = ``num_speculative_tokens`` tokens
(argmax, or sampled from its processed distribution q), the target scores them in one forward,
each is accepted when it is the target's argmax (greedy) or with probability min(1, p(x)/q(x));
the first rejected one is replaced by the argmax, or by a sample of norm(max(0, p − q)); when all
are accepted one more token (the bonus) comes from the target's distribution after them.

The engine does not read Hugging Face folders itself (the reader,
``inference_conformance.smallworld.hf_llama``, sits above this layer): it is given ``load(folder,
dtype) -> Transformer``. Each request is generated alone, so the engine is batch invariant by
construction; it has no prefix cache, no chunked prefill and takes no padding (a setting it does
not offer raises NotImplementedError). Within one ``generate`` call a sequence met again (the
many seeded requests of one prompt EN-3 samples) reuses its forward's logits: the model is
deterministic, so the result is the same as computing them again. Hooks the bug zoo overrides: :meth:`_next_logits`,
:meth:`_distribution`, :meth:`_verify_distribution`, :meth:`_bonus`, :meth:`_generator`, :meth:`_offered`.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from inference_conformance.conformance.contracts.inference_engine import (
    Capabilities,
    Completion,
    check_vocab,
    refuse_unoffered,
    sampling_of,
    validate,
)
from inference_conformance.reference.speculative import process_logits
from inference_conformance.reference.transformer import Transformer


def own_params(request, params):
    """``params`` with ``request``'s own temperature and top-p where it sets them (``sampling_of``)."""
    t, p = sampling_of(request, params)
    return params if (t, p) == (params.temperature, params.top_p) else dataclasses.replace(params, temperature=t, top_p=p)


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from ``probs`` (V,) by inverse CDF with one float64 uniform from ``generator``."""
    cdf = probs.double().cumsum(-1)
    u = torch.rand((), generator=generator, dtype=torch.float64)
    return int(torch.searchsorted(cdf, (u * cdf[-1]).reshape(1)).clamp(max=probs.numel() - 1))


class ReferenceEngine:
    """The float64 reference engine over models read by ``load(folder, dtype)``."""

    name = "reference"
    #: {(model id, tokens): logits (T, V)} of the running ``generate`` call (None outside one).
    _memo: dict | None = None

    def __init__(self, load: Callable[[str, torch.dtype], Transformer], dtype: torch.dtype = torch.float64):
        self.load, self.dtype = load, dtype
        self._models: dict = {}

    def capabilities(self) -> Capabilities:
        return Capabilities(dtype=self.dtype, batching=True, speculative=("draft",), seeded_sampling="request",
                            top_p=True, logprobs=True, batch_invariant=True, per_request_params=True)

    def model(self, folder) -> Transformer:
        """The model in ``folder`` in the engine's dtype (read once per folder)."""
        key = str(folder)
        if key not in self._models:
            self._models[key] = self.load(key, self.dtype)
        return self._models[key]

    # ------------------------------------------------------------------ hooks
    def _forward(self, model: Transformer, tokens: list[int]) -> torch.Tensor:
        """(T, V) logits of a full forward over ``tokens`` alone (once per sequence in a call)."""
        key = (id(model), tuple(tokens))
        if self._memo is None:
            return model(torch.tensor([tokens]))[0]
        if key not in self._memo:
            self._memo[key] = model(torch.tensor([tokens]))[0]
        return self._memo[key]

    def _next_logits(self, model: Transformer, seqs: list[list[int]]) -> torch.Tensor:
        """(B, V) logits after each sequence, each from a full forward over it alone."""
        return torch.stack([self._forward(model, s)[-1] for s in seqs])

    def _distribution(self, logits: torch.Tensor, params) -> torch.Tensor:
        """The sampling distribution (V,) float64 of raw ``logits`` under the params."""
        return process_logits(logits.double(), params.temperature, 0, params.top_p)

    def _verify_distribution(self, logits: torch.Tensor, params) -> torch.Tensor:
        """The target's distribution (V,) at a draft position (acceptance and residual)."""
        return self._distribution(logits, params)

    def _bonus(self, target_logits: torch.Tensor, draft: Transformer, seq: list[int], params, gen) -> int:
        """The token after γ accepted draft tokens (``seq`` ends with them): from the target."""
        return self._choose(target_logits, params, gen)

    def _logprob(self, logits: torch.Tensor, x: int) -> float:
        """The chosen token ``x``'s log-probability under the raw logits (V,), in float64."""
        return float(torch.log_softmax(logits.double(), -1)[x])

    def _offered(self) -> Capabilities:
        """What the engine takes without refusing it: what it declares."""
        return self.capabilities()

    def _generator(self, seed: int | None) -> torch.Generator:
        g = torch.Generator()
        if seed is None:
            g.seed()
        else:
            g.manual_seed(seed)
        return g

    def _choose(self, logits: torch.Tensor, params, gen) -> int:
        if params.temperature == 0:
            return int(logits.argmax())
        return draw(self._distribution(logits, params), gen)

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(self, requests, params) -> list[Completion]:
        """See the contract; raises as it says."""
        self._memo = {}
        try:
            return self._generate(requests, params)
        finally:
            self._memo = None

    def _generate(self, requests, params) -> list[Completion]:
        validate(requests, params)
        refuse_unoffered(self._offered(), requests, params, "the reference engine")
        target = self.model(params.model)
        check_vocab(requests, target.cfg.vocab_size)
        gens = [self._generator(r.seed) for r in requests]
        own = [own_params(r, params) for r in requests]
        if params.speculative == "draft":
            draft = self.model(params.draft)
            return [self._speculate(target, draft, r, p, g) for r, p, g in zip(requests, own, gens)]
        seqs = [list(r.prompt) for r in requests]
        toks: list[list[int]] = [[] for _ in requests]
        lps: list[list[float]] = [[] for _ in requests]
        while True:
            active = [i for i, r in enumerate(requests) if len(toks[i]) < r.max_new_tokens]
            if not active:
                break
            logits = self._next_logits(target, [seqs[i] for i in active])          # (B, V)
            for row, i in enumerate(active):
                x = self._choose(logits[row], own[i], gens[i])
                toks[i].append(x)
                lps[i].append(self._logprob(logits[row], x))
                seqs[i].append(x)
        return [Completion(torch.tensor(t, dtype=torch.int64), torch.tensor(lp, dtype=torch.float64))
                for t, lp in zip(toks, lps)]

    def _speculate(self, target: Transformer, draft: Transformer, r, params, gen) -> Completion:
        """One request by speculative decoding with ``draft`` (see the module docstring)."""
        greedy = params.temperature == 0
        seq, toks, lps = list(r.prompt), [], []

        def emit(x: int, logits: torch.Tensor) -> None:
            toks.append(x)
            lps.append(self._logprob(logits, x))
            seq.append(x)

        while len(toks) < r.max_new_tokens:
            proposals, qs, ctx = [], [], list(seq)
            for _ in range(params.num_speculative_tokens):
                lg = self._next_logits(draft, [ctx])[0]
                q = None if greedy else self._distribution(lg, params)
                x = int(lg.argmax()) if greedy else draw(q, gen)
                proposals.append(x)
                qs.append(q)
                ctx.append(x)
            full = self._forward(target, seq + proposals)[len(seq) - 1:]            # (γ + 1, V)
            for i, x in enumerate(proposals):
                if len(toks) == r.max_new_tokens:
                    break
                if greedy:
                    best = int(full[i].argmax())
                    emit(x if best == x else best, full[i])
                    if best != x:
                        break
                    continue
                p = self._verify_distribution(full[i], params)
                u = float(torch.rand((), generator=gen, dtype=torch.float64))
                if u < min(1.0, float(p[x] / qs[i][x])):
                    emit(x, full[i])
                    continue
                residual = (p - qs[i]).clamp(min=0)
                emit(draw(residual / residual.sum(), gen), full[i])
                break
            else:
                if len(toks) < r.max_new_tokens:
                    emit(self._bonus(full[-1], draft, list(seq), params, gen), full[-1])
        return Completion(torch.tensor(toks, dtype=torch.int64), torch.tensor(lps, dtype=torch.float64))


def implementations():
    """None here: the registered reference (``optimized/inference_engine``) gives this engine the folder
    reader of the small world, a layer above this one."""
    return ()
