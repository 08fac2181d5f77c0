"""A capability declared absent is absent (claim EN-2, with the comparisons of EN-1, EN-3, KV-2 and
PA-6..PA-8 for what they cover): the law :data:`DECLARED`, over every registered engine, rejecting
the zoo's ``undeclared_batching``.

An engine's :class:`Capabilities` say what it offers; the other laws exercise what is declared
and leave the rest alone, so a "no" would otherwise never be checked. For each part declared
absent (:func:`absent`: batching, each padding side, prefix caching, chunked prefill, each
speculative method, top-p, logprobs, seeded sampling, sampling parameters per request, ``serve``
and each of its parts), the law
calls the engine once with that setting (:data:`PROBES`):

- a refusal (NotImplementedError, in the engine's words) is "unsupported" for that part: the
  declaration is true;
- an accepted call is judged by the comparison of the law that part belongs to, like any other:
  a batch against each request alone (EN-2, ``cases.check_same``: one by one, padded on a side,
  with prefix caching (two passes) or a chunk budget); a speculative method against target-only
  greedy tokens and the float64 model (EN-3, EN-1); top-p sampling: every sampled token inside the
  float64 nucleus (a token outside it has probability 0: the G-test's outright rejection of EN-3);
  logprobs returned though declared absent: EN-1's check; seeds taken though sampling is declared
  unseeded: the same seeded call twice gives the same tokens (KV-2); a request's own temperature
taken though declared per call only: as the same temperature set for the call (EN-1, KV-2);
``serve`` or a part of it:
  every request as alone (PA-6's oracle, ``serving_cases.check_served``); counts returned
  though "stats" is not declared: each position computed once (PA-7).

The run is "unsupported" where the engine refused every part (their reasons listed), a pass where
every accepted part passed its comparison, a failure naming the part otherwise. The row records
the engine's declaration (``capabilities``, :func:`declared_text`), which the report and the
matrix show beside the engine's cells.
"""
from __future__ import annotations

import math

import torch

from inference_conformance.conformance import results
from inference_conformance.conformance.contracts.inference_engine import (
    PADDING_SIDES,
    SERVE_FEATURES,
    SPECULATIVE_METHODS,
    Request,
)
from inference_conformance.conformance.laws import refusal
from inference_conformance.conformance.tolerance import check_exact, check_within
from inference_conformance.properties.inference_engine import cases
from inference_conformance.properties.inference_engine import serving_cases

#: top-p and temperature of the top-p probe: a small nucleus (a few tokens of the small world's
#: next-token distributions), so that an engine ignoring top-p draws outside it within a few tokens.
TOP_P, TOP_P_TEMPERATURE, TOP_P_SAMPLES = 0.5, 1.0, 12


def declared_text(caps) -> str:
    """``caps`` in one line: what the engine declares, then what it declares absent."""
    yes = [str(caps.dtype).replace("torch.", "")]
    yes += ["batching"] * caps.batching + [f"pads {s}" for s in caps.padding]
    yes += ["prefix caching"] * caps.prefix_caching + ["chunked prefill"] * caps.chunked_prefill
    yes += [f"speculative {m}" for m in caps.speculative] + ["top-p"] * caps.top_p + ["logprobs"] * caps.logprobs
    yes += [f"seeds per {caps.seeded_sampling}"] * (caps.seeded_sampling != "none")
    yes += ["per-request parameters"] * caps.per_request_params
    yes += ["batch invariant"] * caps.batch_invariant + [f"serve {'+'.join(caps.serving)}"] * bool(caps.serving)
    return ", ".join(yes) + "; absent: " + (", ".join(absent(caps)) or "nothing")


def absent(caps) -> list[str]:
    """The parts ``caps`` declares absent, each named as :data:`PROBES` names it."""
    parts = ["batching"] * (not caps.batching) + [f"padding {s}" for s in PADDING_SIDES if s not in caps.padding]
    parts += ["prefix caching"] * (not caps.prefix_caching) + ["chunked prefill"] * (not caps.chunked_prefill)
    parts += [f"speculative {m}" for m in SPECULATIVE_METHODS if m not in caps.speculative]
    parts += ["top-p"] * (not caps.top_p) + ["logprobs"] * (not caps.logprobs)
    parts += ["seeded sampling"] * (caps.seeded_sampling == "none")
    parts += ["per-request parameters"] * (not caps.per_request_params)
    if not caps.serving:
        return parts + ["serve"]
    return parts + [f"serve {f}" for f in SERVE_FEATURES if f not in caps.serving]


def _bound(eng) -> float:
    return cases.dtype_bound(eng)


def _alone(eng, reqs) -> list:
    return [eng.generate([r], cases.params())[0] for r in reqs]


def _batch(eng, seed: int, **kw) -> None:
    """EN-2: the shared-block prompts in one call (or one by one where batching is declared, with
    prefix caching twice), each against its output alone."""
    prompts = cases.shared_block_prompts(seed)
    reqs = [Request(p, 5) for p in prompts]
    passes = 2 if kw.get("prefix_caching") else 1
    one_call = "prefix_caching" not in kw and "chunked_prefill" not in kw
    got = [eng.generate(reqs, cases.params(**kw)) if one_call else cases.generate(eng, reqs, cases.params(**kw))
           for _ in range(passes)]
    alone, folder, caps = _alone(eng, reqs), cases.folders()["target"], eng.capabilities()
    for k, out in enumerate(got):
        for i, c in enumerate(out):
            what = f"request {i} with {kw or 'a batch'} (pass {k + 1}), declared absent"
            cases.check_logprobs(c, cases.position_logits(folder, prompts[i], c.tokens), _bound(eng), what)
            cases.check_same(alone[i], c, prompts[i], folder, _bound(eng), what, caps.batch_invariant)
    if one_call and caps.seeded_sampling == "request":
        # sampled and seeded too: a batch that loses or shares a request's seed shows only here
        seeded = [Request(p, 5, seed + i) for i, p in enumerate(prompts)]
        out = eng.generate(seeded, cases.params(temperature=0.8))
        for i, (r, c) in enumerate(zip(seeded, out)):
            own = eng.generate([r], cases.params(temperature=0.8))[0]
            check_exact(c.tokens, own.tokens, what=f"request {i} (seed {r.seed}, T=0.8) in a batch, declared "
                                                   "absent: tokens against its run alone").check()


def _speculative(method: str):
    def probe(eng, seed: int) -> None:
        prompts = cases.document_prompts(seed, 2)
        reqs = [Request(p, 6) for p in prompts]
        spec = cases.generate(eng, reqs, cases.params(speculative=method, num_speculative_tokens=2))
        plain, folder = cases.generate(eng, reqs, cases.params()), cases.folders()["target"]
        for i, (a, b) in enumerate(zip(plain, spec)):
            what = f"request {i} {prompts[i]}, {method} γ=2, declared absent"
            cases.check_same(a, b, prompts[i], folder, _bound(eng), what)
            cases.check_greedy(b, prompts[i], folder, _bound(eng), what)
    return probe


def _top_p(eng, seed: int) -> None:
    """Every token sampled at top-p :data:`TOP_P` lies in the float64 nucleus: the probability
    mass of the tokens more likely than it is below top-p, excused within the dtype's bound
    (logits moved by b move that mass by a factor of at most e^(2b))."""
    prompts = cases.document_prompts(seed, TOP_P_SAMPLES, max_len=4)
    out = cases.generate(eng, [Request(p, 3, seed + i) for i, p in enumerate(prompts)],
                     cases.params(temperature=TOP_P_TEMPERATURE, top_p=TOP_P))
    folder, b = cases.folders()["target"], _bound(eng)
    for i, (c, p) in enumerate(zip(out, prompts)):
        logits = cases.position_logits(folder, p, c.tokens)
        probs = torch.softmax(logits / TOP_P_TEMPERATURE, -1)
        chosen = probs[torch.arange(len(c.tokens)), c.tokens]
        above = torch.where(probs > chosen[:, None], probs, torch.zeros_like(probs)).sum(-1)   # mass above it
        n = len(above)
        check_within((above - TOP_P).clamp(min=0), torch.zeros(n, dtype=torch.float64),
                     torch.full((n,), TOP_P * math.expm1(2 * b), dtype=torch.float64),
                     what=f"request {i} {p}: float64 mass above each token sampled at top-p {TOP_P} beyond top-p "
                          "(top-p declared absent)",
                     rule="a token sampled at top-p lies in the float64 nucleus: the mass above it below top-p, "
                          "within a factor e^(2b) (b: the dtype's logit bound)").check()
        cases.check_logprobs(c, logits, b, f"request {i} {p} (top-p)")


def _logprobs(eng, seed: int) -> None:
    prompts = cases.document_prompts(seed, 1)
    out = cases.generate(eng, [Request(p, 3) for p in prompts], cases.params())
    if all(c.logprobs is None for c in out):
        raise NotImplementedError("the engine returned no logprobs")
    folder = cases.folders()["target"]
    for i, (c, p) in enumerate(zip(out, prompts)):
        cases.check_logprobs(c, cases.position_logits(folder, p, c.tokens), _bound(eng), f"request {i} {p}, declared absent")


def _seeded(eng, seed: int) -> None:
    reqs = [Request(p, 5, seed + i) for i, p in enumerate(cases.document_prompts(seed, 2))]
    a = cases.generate(eng, reqs, cases.params(temperature=0.8))
    b = cases.generate(eng, reqs, cases.params(temperature=0.8))
    for i, (x, y) in enumerate(zip(a, b)):
        check_exact(y.tokens, x.tokens, what=f"request {i}: tokens of the second seeded call (seeding declared absent)"
                    ).check()


def _per_request(eng, seed: int) -> None:
    """Sampling parameters set on the requests, though declared per call only: a request with its
    own temperature 0 in a call at T = 1 gives its greedy tokens (EN-1's near-tie rule), and a
    seeded one with its own T = 0.8 in a greedy call the tokens of the same seed with T = 0.8 set
    for the whole call (KV-2's exactness; where seeds are honoured)."""
    caps, folder = eng.capabilities(), cases.folders()["target"]
    p0, p1 = cases.document_prompts(seed, 2)
    own = cases.generate(eng, [Request(p0, 5, seed, temperature=0.0)], cases.params(temperature=1.0))[0]
    call = cases.generate(eng, [Request(p0, 5)], cases.params())[0]
    cases.check_same(call, own, p0, folder, _bound(eng), f"request {p0} with its own temperature 0 in a call at T=1 "
                 "(per-request parameters declared absent)")
    if caps.seeded_sampling != "none":
        own = cases.generate(eng, [Request(p1, 5, seed, temperature=0.8)], cases.params())[0]
        call = cases.generate(eng, [Request(p1, 5, seed)], cases.params(temperature=0.8))[0]
        check_exact(own.tokens, call.tokens, what=f"request {p1} (seed {seed}) with its own T=0.8 in a greedy call: "
                    "tokens against T=0.8 for the call (per-request parameters declared absent)").check()


def _served(run, sched, what: str, **kw) -> dict:
    serve = getattr(run.impl, "serve", None)
    if serve is None:
        raise NotImplementedError("the engine has no serve")
    out = serve(sched, cases.params(**kw))
    serving_cases.check_served(run, sched, out, 0.0, f"{what}, declared absent")
    return out


def _at_zero(reqs):
    return tuple(type(r)(r.prompt, r.max_new, 0, r.temperature, r.seed) for r in reqs)


def _serve_part(part: str):
    def probe(run, seed: int) -> None:
        reqs = serving_cases.DIFFERENT_PREFIXES
        if part == "arrivals":
            _served(run, serving_cases.schedule(reqs), "arrivals")
        elif part == "fork":
            _served(run, serving_cases.schedule(_at_zero(reqs), fork=True), "a fork")
        elif part == "kv_pool":
            _served(run, serving_cases.schedule(_at_zero(reqs)), "a KV pool", block_size=2,
                    kv_blocks=max(serving_cases.blocks_for(reqs, 2)) + 1)
        else:                                        # "stats", or "serve" itself: a call of what is declared
            sched = serving_cases.schedule(reqs if "arrivals" in run.impl.capabilities().serving else _at_zero(reqs))
            out = _served(run, sched, part)
            if part == "stats":
                why = serving_cases.check_computed_once(out, sched, "counts, declared absent")
                if why:
                    raise NotImplementedError(why)
    probe.serve = True
    return probe


#: part -> probe(engine, seed) (serve's: probe(run, seed)); each calls the engine with the part
#: and judges what it accepts (see the module docstring).
PROBES = {
    "batching": lambda eng, seed: _batch(eng, seed),
    **{f"padding {s}": (lambda s: lambda eng, seed: _batch(eng, seed, padding=s))(s) for s in PADDING_SIDES},
    "prefix caching": lambda eng, seed: _batch(eng, seed, prefix_caching=True),
    "chunked prefill": lambda eng, seed: _batch(eng, seed, chunked_prefill=3),
    **{f"speculative {m}": _speculative(m) for m in SPECULATIVE_METHODS},
    "top-p": _top_p,
    "logprobs": _logprobs,
    "seeded sampling": _seeded,
    "per-request parameters": _per_request,
    "serve": _serve_part("serve"),
    **{f"serve {f}": _serve_part(f) for f in SERVE_FEATURES},
}


def law_declared_absent_is_absent(run, device, seed):
    """Each capability declared absent: the engine refuses it ("unsupported" for that part) or
    passes the comparison of its law."""
    eng = run.impl
    caps = eng.capabilities()
    rec = results.recorder()
    if not rec.zoo and not any("capabilities" in f["extra"] for f in rec.figures):   # a zoo row keeps its rejection
        results.record("EN-2", measured=None, unit="", rule="each capability declared absent: refused, or judged "
                       "by its law", capabilities=declared_text(caps))
    refused, judged = [], []
    for part in absent(caps):
        probe = PROBES[part]
        try:
            probe(run, seed) if getattr(probe, "serve", False) else probe(eng, seed)
        except NotImplementedError as exc:
            refused.append(f"{part}: {exc}")
        else:
            judged.append(part)
    if not judged:
        with refusal(run, "every capability declared absent"):
            raise NotImplementedError("; ".join(refused) or "nothing declared absent")
    run.observe({"judged": tuple(judged), "refused": tuple(refused)})


def _declares_absent(impl):
    return None if absent(impl.capabilities()) else "the engine declares every capability"
