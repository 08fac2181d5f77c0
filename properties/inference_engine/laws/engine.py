"""The engine laws, over every registered engine (claims EN-1, EN-2, EN-3, and KV-2 for a whole
engine), each rejecting its engine of the zoo (``properties/inference_engine/zoo.py``). The serve laws are in
``serving.py``, the law of what an engine declares absent in ``declared.py``.

- EN-1 (:func:`law_greedy_matches_reference`): greedy tokens are the float64 reference's,
  teacher-forced on the engine's own output; a token that is not the float64 argmax is excused
  (and counted; at most 10 % of the positions) only as a near-tie within 4 times the engine's
  measured error (rule "engine-near-tie"); logprobs by the declared dtype's rule. EN1S
  (:func:`law_sampled_logprobs`): sampled logprobs are the raw log-softmax's, at T != 1 and top-p < 1.
- EN-2 (:func:`law_output_independent_of_batching`): each request's output alone equals its
  output in batches of drawn composition and order, with prefix caching on (two passes, the
  second served from the cache) or off, chunked prefill at a drawn budget and a drawn padding
  side, as the engine offers them; bitwise equality of logprobs counted, enforced where the
  engine declares batch invariance; then one call mixing seeds and sampling parameters
  (:func:`check_mixed`): each seeded request as alone.
- EN-3 greedy (:func:`law_speculative_greedy`): each speculative method emits the target-only
  tokens (and passes EN-1); sampled (:func:`law_sampled_distribution`): each generated position
  follows the exact float64 distribution given the engine's own tokens before it, by G-tests of
  stated power, plain sampling as the control.
- KV-2 (:func:`law_same_seed_same_tokens`): the same sampled call twice gives the same tokens
  to each seeded request, seeded beside unseeded where seeds are per request.
"""
from __future__ import annotations

import random

from hypothesis import strategies as st

from inference_conformance.conformance.contracts.inference_engine import Request, sampling_of
from inference_conformance.conformance.laws import Kills, Law, refusal
from inference_conformance.conformance.tolerance import check_exact
from inference_conformance.properties.inference_engine import cases
from inference_conformance.properties.inference_engine import sampled

SEEDS = st.integers(0, 2 ** 16)


def _caps(impl):
    return impl.capabilities()


def law_greedy_matches_reference(run, device, seed):
    """EN-1: greedy tokens and logprobs of a batch of grammar prompts against the float64 model;
    near-ties excused by the engine's measured error (its logprobs, else the reference model's
    error in the dtype it computes in: :func:`cases.dtype_error`)."""
    eng, bound = run.impl, cases.dtype_bound(run.impl)
    prompts = cases.document_prompts(seed, 3)
    with refusal(run, "greedy generation"):
        out = cases.generate(eng, [Request(p, 8) for p in prompts], cases.params())
        calibration = cases.calibration(eng, out)
    folder = cases.folders()["target"]
    excused = sum(cases.check_greedy(c, p, folder, bound, f"request {i} {p}", calibration)
                  for i, (c, p) in enumerate(zip(out, prompts)))
    cases.check_excused(excused, 8 * len(prompts), "greedy tokens excused as near-ties")
    run.observe({"excused": excused, "positions": 8 * len(prompts)})


def law_output_independent_of_batching(run, device, seed, cuts, prefix_caching, budget, side, mixed):
    """EN-2: alone vs batched, prefix caching, chunked prefill and every padding side, as offered; then, with
    ``mixed``, one batch mixing seeds and sampling parameters (:func:`check_mixed`) under the same settings."""
    eng, caps, bound = run.impl, _caps(run.impl), cases.dtype_bound(run.impl)
    prompts = cases.shared_block_prompts(seed)
    reqs = [Request(p, 5) for p in prompts]
    folder = cases.folders()["target"]
    with refusal(run, "a request alone"):
        alone = [eng.generate([r], cases.params())[0] for r in reqs]
    calibration = cases.calibration(eng, alone)
    kw = {}
    if prefix_caching and caps.prefix_caching:
        kw["prefix_caching"] = True
    if budget is not None and caps.chunked_prefill:
        kw["chunked_prefill"] = budget
    # every padding layout the engine takes (an accepted layout that answers wrongly is the defect
    # users hit), the drawn ``side`` first
    sides = caps.padding[side % len(caps.padding):] + caps.padding[:side % len(caps.padding)] if caps.padding else (None,)
    order = list(range(len(reqs)))
    random.Random(seed).shuffle(order)
    bounds = sorted({c % len(order) for c in cuts} - {0}) if caps.batching else list(range(1, len(order)))
    batches = [order[a:b] for a, b in zip([0] + bounds, bounds + [len(order)])]
    bitwise = excused = positions = 0
    for pad, _ in ((pad, n) for pad in sides for n in range(2 if kw.get("prefix_caching") else 1)):
        if pad is not None:
            kw["padding"] = pad
        for batch in batches:
            with refusal(run, f"a batch with {kw}"):
                out = eng.generate([reqs[i] for i in batch], cases.params(**kw))
            for i, c in zip(batch, out):
                what = f"request {i} in batch {batch} with {kw or 'defaults'}"
                # a batched request's own logprobs are EN-1's (the engine's measured error is its
                # near-tie allowance: an error the batch put there must not widen it unseen)
                cases.check_logprobs(c, cases.position_logits(folder, prompts[i], c.tokens), bound, what)
                tie, same = cases.check_same(alone[i], c, prompts[i], folder, bound, what, caps.batch_invariant,
                                         calibration)
                bitwise, excused, positions = bitwise + same, excused + tie, positions + reqs[i].max_new_tokens
    cases.check_excused(excused, positions, "requests in batches excused as near-ties")
    mixed = check_mixed(run, seed, prompts, alone, kw, calibration) if mixed else ""
    run.observe({"settings": tuple(sorted(kw)), "bitwise_logprobs": bitwise, "excused": excused,
                 "positions": positions, "mixed": mixed})


def mixed_requests(caps, prompts: list, seed: int) -> list:
    """One request per prompt, 5 new tokens: seeded beside unseeded; with ``per_request_params``,
    greedy beside sampled at different temperatures and top-p (top-p only where offered)."""
    if not caps.per_request_params:
        return [Request(p, 5, seed + i if i % 2 == 0 else None) for i, p in enumerate(prompts)]
    top = (lambda p: p) if caps.top_p else (lambda p: None)
    own = [(None, 0.0, None), (seed + 1, 1.3, None), (None, 0.8, top(0.9)), (seed + 3, 0.6, top(0.8))]
    return [Request(p, 5, s, temperature=t, top_p=q) for p, (s, t, q) in zip(prompts, own)]


def check_mixed(run, seed, prompts, alone, kw, calibration) -> str:
    """EN-2 with sampling parameters and seeds mixed in one call (under the settings ``kw``): each
    seeded request gives the tokens it gets alone (a call of it alone whose Params carry its
    temperature and top-p), a greedy one its greedy tokens alone (near-ties excused), each
    logprob the float64 log-softmax of the raw logits. Returns what was mixed ("" where the
    engine's seeds are not per request)."""
    eng, caps, folder, bound = run.impl, _caps(run.impl), cases.folders()["target"], cases.dtype_bound(run.impl)
    if caps.seeded_sampling != "request":
        return ""
    reqs = mixed_requests(caps, prompts, seed)
    with refusal(run, f"a batch mixing seeds and sampling parameters with {kw}"):
        out = cases.generate(eng, reqs, cases.params(temperature=0.9, **kw))
        for i, (r, c) in enumerate(zip(reqs, out)):
            t, top_p = sampling_of(r, cases.params(temperature=0.9))
            what = f"request {i} (seed {r.seed}, T={t}, top-p={top_p}) in a mixed batch with {kw or 'defaults'}"
            cases.check_logprobs(c, cases.position_logits(folder, r.prompt, c.tokens), bound, what)
            if t == 0:
                cases.check_same(alone[i], c, r.prompt, folder, bound, what, calibration=calibration)
            elif r.seed is not None:
                solo = eng.generate([Request(r.prompt, r.max_new_tokens, r.seed)], cases.params(temperature=t, top_p=top_p))
                check_exact(c.tokens, solo[0].tokens, what=f"{what} vs alone").check()
    return "per-request params" if caps.per_request_params else "seeded beside unseeded"


def law_speculative_greedy(run, device, seed, gamma):
    """EN-3 (greedy): every speculative method the engine offers emits the target-only tokens."""
    eng, bound = run.impl, cases.dtype_bound(run.impl)
    prompts = cases.document_prompts(seed, 3)
    reqs = [Request(p, 8) for p in prompts]
    folder = cases.folders()["target"]
    with refusal(run, "target-only greedy"):
        plain = cases.generate(eng, reqs, cases.params())
    for method in _caps(eng).speculative:
        with refusal(run, f"speculative {method!r}"):
            spec = cases.generate(eng, reqs, cases.params(speculative=method, num_speculative_tokens=gamma))
        calibration = cases.calibration(eng, plain)
        for i, (a, b) in enumerate(zip(plain, spec)):
            what = f"request {i} {prompts[i]}, {method} γ={gamma}"
            cases.check_same(a, b, prompts[i], folder, bound, what, calibration=calibration)
            cases.check_greedy(b, prompts[i], folder, bound, what, calibration)


def law_sampled_distribution(run, device, seed):
    """EN-3 (sampled): one G-test per generated position (each draft position and the bonus; token
    i given the engine's own tokens before it), plain sampling (the control) and each speculative
    method at γ = 1, at temperature 1 and at 0.7 with top-p 0.9 (0.7 alone where top-p is not
    offered), on contexts chosen by their exact entropy; each test's power against total variation
    0.1 stated, under its floor "not enough evidence" (``properties/inference_engine/sampled.py``)."""
    eng, caps = run.impl, _caps(run.impl)
    configs = [(t, p if caps.top_p else 1.0, m) for t, p in sampled.SAMPLED for m in (None, *caps.speculative)]
    alpha = sampled.ALPHA / sum(sampled.NEW if m else 1 for _, _, m in configs)
    refused, tests = [], []
    with refusal(run, "sampling"):
        for t, p, m in configs:
            try:
                found, drafted = sampled.check_sampled(eng, seed, t, p, m, alpha)
            except NotImplementedError as exc:
                refused.append(f"T={t} top-p={p} {m}: {exc}")
                continue
            tests += found
            sampled.judge(run, found)
            if m == "ngram" and not drafted:
                run.uncheck(f"n-gram speculation at T={t:g}, top-p={p:g}", "not exercised: the engine's counts show "
                            + ("no drafted or accepted token" if drafted == 0 else "nothing (it reports no drafted "
                               "or accepted counts)"))
        if len(refused) == len(configs):
            raise NotImplementedError(refused[0])
    run.observe({"refused": tuple(refused), "tests": tuple(x.summary() for x in tests),
                 "power": tuple((x.what, x.power) for x in tests)})


def law_same_seed_same_tokens(run, device, seed, features):
    """KV-2 for a whole engine: the same sampled call (same seeds) twice, the same tokens of each
    seeded request; where seeds are per request, seeded beside unseeded requests (and greedy beside
    sampled at their own temperatures and top-p where the engine takes them per request); with
    ``features``, prefix caching and a chunked prefill of 3 tokens a step, as offered."""
    eng, caps = run.impl, _caps(run.impl)
    prompts = cases.document_prompts(seed, 3)
    if caps.seeded_sampling == "request":
        reqs = mixed_requests(caps, prompts, seed)
    else:
        reqs = [Request(p, 6, seed + i) for i, p in enumerate(prompts)]
    kw = {k: v for k, v, offered in (("prefix_caching", True, caps.prefix_caching),
                                     ("chunked_prefill", 3, caps.chunked_prefill)) if features and offered}
    with refusal(run, f"seeded sampling with {kw or 'defaults'}"):
        a = cases.generate(eng, reqs, cases.params(temperature=0.8, **kw))
        b = cases.generate(eng, reqs, cases.params(temperature=0.8, **kw))
    for i, (r, x, y) in enumerate(zip(reqs, a, b)):
        if r.seed is not None:
            check_exact(y.tokens, x.tokens, what=f"request {i} (seed {r.seed}): tokens of the second call with "
                                                 f"{kw or 'defaults'}").check()
    run.observe({"settings": tuple(sorted(kw)), "unseeded": sum(r.seed is None for r in reqs)})


def law_sampled_logprobs(run, device, seed, temperature, top_p):
    """EN-1 for sampled tokens: the logprobs an engine returns are those of the tokens it chose,
    of the model's raw logits (the float64 log-softmax before temperature and top-p, along the
    sampled path), at any temperature and top-p (top-p 1 where the engine offers none)."""
    eng, bound = run.impl, cases.dtype_bound(run.impl)
    top_p = top_p if _caps(eng).top_p else 1.0
    prompts = cases.document_prompts(seed, 3)
    with refusal(run, "sampling"):
        out = cases.generate(eng, [Request(p, 6, seed + i) for i, p in enumerate(prompts)],
                         cases.params(temperature=temperature, top_p=top_p))
    folder = cases.folders()["target"]
    for i, (c, p) in enumerate(zip(out, prompts)):
        cases.check_logprobs(c, cases.position_logits(folder, p, c.tokens), bound,
                         f"request {i} {p} (sampled, T={temperature}, top-p={top_p})")


def _logprobs(impl):
    return None if _caps(impl).logprobs else "the engine returns no logprobs"


def _speculative(impl):
    return None if _caps(impl).speculative else "the engine offers no speculative method"


def _seeded(impl):
    return None if _caps(impl).seeded_sampling != "none" else "the engine's sampling is not seeded"


#: Under ``ci`` (10 examples) an engine law draws 1 beyond its pinned examples: every example
#: runs whole engines several times (``dev``: 3, ``thorough``: 50).
_FEW = dict(params=("device",), max_examples=lambda n: max(1, n // 10))
EN1 = Law(claim="EN-1", technique="inference_engine", body=law_greedy_matches_reference, given={"seed": SEEDS},
          examples=(dict(seed=0),), kills=(Kills(("batch_dependent", "no_logprobs_short_prompt_flip")),), **_FEW,
    test="test_en1_greedy_matches_reference", after=cases.record_excused("EN-1"),
    zoo_tests=("test_en1_zoo_rejected",))
#: EN1S's sampling parameters: the raw and the processed log-softmax differ wherever T != 1 or top-p < 1.
TEMPERATURES, TOP_PS = st.sampled_from((0.5, 0.7, 1.0, 1.3)), st.sampled_from((1.0, 0.9, 0.8))
EN2 = Law(claim="EN-2", technique="inference_engine", body=law_output_independent_of_batching,
          given={"seed": SEEDS, "cuts": st.lists(st.integers(0, 8), max_size=3), "prefix_caching": st.booleans(),
                 "budget": st.sampled_from((None, 3, 5, 16)), "side": st.integers(0, 1), "mixed": st.booleans()},
          examples=(dict(seed=2, cuts=[], prefix_caching=True, budget=5, side=1, mixed=True),
                    dict(seed=1, cuts=[2], prefix_caching=True, budget=None, side=0, mixed=False)),
          kills=(Kills(("batch_dependent", "stale_prefix", "declared_bfloat16_batch_flips",
                        "seed_lost_beside_unseeded")),), **_FEW,
    test="test_en2_output_independent_of_batching", after=cases.record_excused("EN-2"),
    zoo_tests=("test_en2_zoo_rejected",))
EN3 = Law(claim="EN-3", technique="inference_engine", body=law_speculative_greedy,
          given={"seed": SEEDS, "gamma": st.integers(1, 4)}, examples=(dict(seed=3, gamma=1),),
          kills=(Kills(("bonus_from_draft",)),), applies=_speculative, **_FEW,
    test="test_en3_speculative_greedy",
    zoo_tests=("test_en3_zoo_rejected",))
def _sampled_here(impl):
    """Under the gating ``ci`` profile EN-3 sampled (thousands of requests per engine) judges the
    reference, every outside engine and the zoo; the suite's other built-in engines in ``dev``,
    ``thorough`` and the tox environments."""
    from hypothesis import settings

    gating = getattr(settings, "get_current_profile_name", lambda: "")().rsplit(".", 1)[-1] == "ci"
    if gating and getattr(impl, "origin", "") == "builtin" and getattr(impl, "name", "") in ("paged", "speculative"):
        return "EN-3 sampled runs on the suite's paged and speculative engines outside the ci profile (its cost)"
    return None


EN3S = Law(claim="EN-3", technique="inference_engine", body=law_sampled_distribution, given={"seed": SEEDS},
           examples=(dict(seed=4),), explicit_only=True, applies=_sampled_here,
           kills=(Kills(("ignores_temperature", "draft_positions_other_temperature", "bonus_from_draft")),),
           params=("device",),
    test="test_en3_sampled_distribution", after=sampled.record_power,
    zoo_tests=("test_en3_sampled_zoo_rejected",))
KV2 = Law(claim="KV-2", technique="inference_engine", body=law_same_seed_same_tokens,
          given={"seed": SEEDS, "features": st.booleans()}, examples=(dict(seed=5, features=True),),
          kills=(Kills(("unseeded", "seed_lost_beside_unseeded")),), applies=_seeded, **_FEW,
    test="test_engine_same_seed_same_tokens",
    zoo_tests=("test_engine_seed_zoo_rejected",))

EN1S = Law(claim="EN-1", technique="inference_engine", body=law_sampled_logprobs,
           given={"seed": SEEDS, "temperature": TEMPERATURES, "top_p": TOP_PS},
           examples=(dict(seed=6, temperature=0.7, top_p=0.9),),
           kills=(Kills(("argmax_logprobs", "processed_logprobs")),), applies=_logprobs, **_FEW,
    test="test_en1_sampled_logprobs",
    zoo_tests=("test_en1_sampled_zoo_rejected",))

