"""Speculative decoding: SD-9, the wall-clock speedup of the speculative engine against
target-only decoding on the small world at B = 1, at the sizes of
:mod:`inference_conformance.conformance.sizes` (γ in {1, 2, 4, 6, 8}, 64 tokens per run by default;
γ = 1..8, 96 tokens under ``--full``), its result kept in the experiment cache
(:mod:`inference_conformance.conformance.cache`; the machine is part of the key, a timing is never
reused on another machine): a rerun with the same code, checkpoints, machine and size records the
stored rows, marked ``cached``.

Goals (issue: H200 when lent; not asserted, and recorded as unmeasured on a CPU): verifying up
to 8 tokens costs <= 1.15x a one-token target step when memory-bound; end-to-end speedup >=
0.85x the formula at the measured α and c (the rows also show the formula with the verification
at its measured cost, separating a compute-bound verification from the engine's overhead).
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.benchmarks.timing import median_seconds, paired_ratio, paired_ratios, ratio_estimate
from inference_conformance.conformance import cache, results, sizes
from inference_conformance.conformance.trends import best_gamma, sd9_fields

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.claim("SD-9")
@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_sd9_speculative_vs_target_only(benchmark, device, mode):
    """SD-9 on the small world at B = 1: wall-clock tokens/s of the speculative engine (both
    drafts, each γ of the stated set) against target-only decoding through the same cached
    engine, next to the SD-4 formula at the measured α and the measured c (one draft step / one
    target step); the cost of scoring γ + 1 tokens in one target forward relative to a one-token
    step. Goals (issue, not asserted): verifying up to 8 tokens <= 1.15x a one-token step when
    memory-bound; measured speedup >= 0.85x the formula. The trend holds when the good draft's best
    γ is faster than target-only and the poor draft's best γ is at most 4 (the rule
    :func:`inference_conformance.conformance.trends.sd9_fields`, shown failing in
    ``properties/speculative/test_speculative_rejections.py``)."""
    from inference_conformance.smallworld.checkpoints import load_model
    from inference_conformance.smallworld.tokenizer import tokenizer

    temperature = 0.0 if mode == "greedy" else 1.0
    target = load_model("target", torch.float32, device)
    drafts = {name: load_model(name, torch.float32, device) for name in ("draft_good", "draft_poor")}
    prompt = torch.full((1, 1), tokenizer().bos_id, device=device)
    smoke = benchmark.disabled         # the CI smoke run: one repeat of 24 tokens at γ = 1 and 4, no verdict
    repeats = 1 if smoke else sizes.size("sd9_repeats")
    gammas = (1, 4) if smoke else tuple(sizes.size("sd9_gammas"))
    n_tokens = 24 if smoke else sizes.size("sd9_tokens")

    def compute():
        return _measure(target, drafts, prompt, device=device, mode=mode, temperature=temperature, gammas=gammas,
                        n_tokens=n_tokens, repeats=repeats, smoke=smoke)

    got = compute() if smoke else cache.experiment(
        "SD-9 wall clock", compute, seed=0, size={"gammas": gammas, "tokens": n_tokens, "repeats": repeats},
        params={"mode": mode, "device": device, "machine": cache.machine()}).value
    results.bench_info(benchmark, technique="speculative", backend="speculative_engine", device=device,
                       dtype="float32", batch=1, claim="SD-9",
                       what=f"target-only decoding: {n_tokens / got['t_target']:.1f} tokens/s")
    benchmark.pedantic(_one_at_a_time(target, prompt, n_tokens, temperature, device), rounds=repeats,
                       warmup_rounds=0)


def _one_at_a_time(model, prompt, n_tokens: int, temperature: float, device: str):
    """A function that decodes ``n_tokens`` tokens one target step at a time after ``prompt``
    (B = 1) through the cached engine of ``model``."""
    from inference_conformance.optimized.speculative.engine import CachedModel

    eng = CachedModel(model, 1, model.cfg.max_seq_len)
    gen = torch.Generator(device=device).manual_seed(0)

    def run():
        eng.start(1)
        one = torch.ones(1, dtype=torch.int64)
        logits = eng.extend(prompt, one)[:, -1]
        for _ in range(n_tokens):      # ids checked as little as in the speculative engine
            nxt = logits.argmax(-1) if temperature == 0 else torch.multinomial(torch.softmax(logits, -1), 1,
                                                                                 generator=gen)[:, 0]
            logits = eng.extend(nxt[:, None], one, check_ids=False)[:, 0]
    return run


def _measure(target, drafts: dict, prompt, *, device: str, mode: str, temperature: float, gammas: tuple,
             n_tokens: int, repeats: int, smoke: bool) -> dict:
    """SD-9's measurements, recorded as its rows: returns {"t_target": seconds of target-only
    decoding, "ratios": {draft: {str(γ): [target-only time / speculative time, ...]}}}."""
    from inference_conformance.optimized.speculative.engine import CachedModel, SpeculativeEngine
    from inference_conformance.reference.speculative import measured_alpha, speedup, tokens_per_call

    # every ratio from back-to-back alternating runs (paired_ratio): a shared machine's load
    # changes while the benchmark runs, and moves both sides of a paired ratio alike
    target_only = _one_at_a_time(target, prompt, n_tokens, temperature, device)
    t_target = median_seconds(target_only, device, repeats)
    c_of = {name: paired_ratio(_one_at_a_time(m, prompt, n_tokens, temperature, device), target_only, device, repeats)
            for name, m in drafts.items()}
    # the cost of a γ+1-token target forward relative to a one-token step, at a 32-token context
    engs = {k: CachedModel(target, 1, target.cfg.max_seq_len) for k in (1, *(g + 1 for g in gammas))}
    ctx = torch.randint(4, target.cfg.vocab_size, (1, 48), generator=torch.Generator().manual_seed(1)).to(device)

    def forward(k):
        """(run, setup) of one k-token target forward after a 32-token context (set up untimed)."""
        eng = engs[k]
        return (lambda: eng.extend(ctx[:, 32:32 + k], torch.tensor([k])),
                lambda: (eng.start(1), eng.extend(ctx[:, :32], torch.tensor([32]))))

    verify_reps = 5 if smoke else 31

    def verify_cost(k):
        (run_k, setup_k), (run_1, setup_1) = forward(k), forward(1)
        return paired_ratio(run_k, run_1, device, verify_reps, setup_a=setup_k, setup_b=setup_1)

    verify_ratio = {g + 1: verify_cost(g + 1) for g in gammas}
    unmeasured = "" if device == "cuda" else " (a GPU goal: unmeasured without a GPU)"
    results.record("SD-9", measured=max(verify_ratio.values()),
                   lecture="<= 1.15x (memory-bound, issue goal)" + unmeasured,
                   unit=f"time of a {max(gammas) + 1}-token target forward / a one-token step",
                   what=f"by tokens scored: { {k: round(v, 2) for k, v in verify_ratio.items()} }",
                   device=device, goal="verifying up to 8 tokens <= 1.15x a one-token step when memory-bound"
                                       + unmeasured)
    by_gamma, ratios, rows = {name: {} for name in drafts}, {name: {} for name in drafts}, []
    for name, draft in drafts.items():
        c = c_of[name]
        for gamma in gammas:
            engine = SpeculativeEngine(target, draft, gamma=gamma, max_batch=1, max_seq_len=target.cfg.max_seq_len,
                                       temperature=temperature)
            stats = {}

            def run(engine=engine, stats=stats):
                gen = torch.Generator(device=device).manual_seed(0)
                stats.update(engine.generate(prompt, n_tokens, generator=gen)[1])

            ratios[name][gamma] = paired_ratios(target_only, run, device, repeats)  # target-only time / speculative
            est = ratio_estimate(ratios[name][gamma])
            measured = est.estimate
            t = t_target / measured
            alpha = measured_alpha(stats)
            formula = speedup(min(alpha, 1.0), gamma, c)
            # the formula with verification at its measured cost r (a (γ+1)-token forward / a
            # one-token step) instead of the lecture's 1: what is left between it and the
            # measurement is the engine's overhead per round
            r = verify_ratio[gamma + 1]
            formula_v = tokens_per_call(min(alpha, 1.0), gamma) / (gamma * c + r)
            by_gamma[name][gamma] = est
            rows.append(dict(measured=round(measured, 3), lecture=round(formula, 3),
                             unit="x target-only (wall clock, B = 1)",
                             rule="lecture column: (1 - a^(g+1)) / ((1 - a)(1 + g c)) at the measured alpha and c "
                                  "(verification priced at one step); formula_at_verify_cost: "
                                  "(1 - a^(g+1)) / ((1 - a)(g c + r)), r the measured verification cost",
                             gamma=gamma, draft=f"{name} ({mode})", alpha=round(alpha, 3), device=device,
                             tokens_per_s=n_tokens / t, verify_cost=round(r, 3),
                             formula_at_verify_cost=round(formula_v, 3),
                             what=(f"{name} {mode} gamma={gamma} (c {c:.2f}, verification r {r:.2f}x a step, formula "
                                   f"at r {formula_v:.2f}x, measured / that {measured / formula_v:.2f})"),
                             goal="measured >= 0.85x the formula" + unmeasured))
    (good_gamma, good), (poor_gamma, poor) = best_gamma(by_gamma["draft_good"]), best_gamma(by_gamma["draft_poor"])
    # the verdict only from a real benchmark run (the CI smoke run times one repeat of 24 tokens),
    # on the stated γ set: both sizes' sets hold γ above 4 (on {1, 2, 4, 8} "best γ <= 4" held by
    # construction: 3 of 4); the good draft's speed-up at its best γ judged by its interval
    # against 1 (the best is picked from the same run: its interval leans high, the poor
    # draft's best γ is a point)
    verdict = {} if smoke else sd9_fields(by_gamma["draft_good"], by_gamma["draft_poor"])
    results.record("SD-9", measured=round(good.estimate, 3), unit=f"best speedup of the good draft ({mode})",
                   lecture="faster than target-only; speedup >= 0.85x the formula" + unmeasured,
                   what=f"good draft best gamma {good_gamma}; poor draft best gamma {poor_gamma} "
                        f"(speedup {poor.estimate:.2f})",
                   rule=f"{sizes.stated('sd9_gammas')}; {sizes.stated('sd9_tokens')}; "
                        f"{sizes.stated('sd9_repeats')}" if not smoke else "CI smoke run: no verdict",
                   best_gamma=good_gamma, device=device, **verdict)
    for row in rows:                 # after the summary: the report's ledger shows the first rows
        results.record("SD-9", **row)
    return {"t_target": t_target,
            "ratios": {name: {str(g): list(r) for g, r in by.items()} for name, by in ratios.items()}}
