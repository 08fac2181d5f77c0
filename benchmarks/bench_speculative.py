"""Speculative decoding: the batched verifier's time against the reference's, and the calibration
of the statistical SD-1 law (its false-alarm rate and its power).

- ``test_bench_verify``: one ``verify`` call of B rounds, γ draft tokens, the small world's
  vocabulary (V = 294), the batched PyTorch verifier and the float64 reference in one run
  (``over_reference``); bytes per call = the probabilities read.
- ``test_sd1_law_calibration``: 200 reseeded runs of the SD-1 statistical check on the batched
  verifier (a correct one) give the measured false-alarm rate, which must not exceed the stated
  α beyond sampling error (binomial tail at 1e-3), and 50 runs on the 0.97-acceptance verifier of
  the zoo give the power at the sizes CI uses. It is slow (about a minute on one core), so
  ``.ci/run`` (CI=true) skips it; ``python -m inference_conformance.reports`` runs it and the report shows its row
  (claim SD-1).

Goals (issue: H200 when lent; not asserted, and recorded as unmeasured on a CPU): verifying up
to 8 tokens costs <= 1.15x a one-token target step when memory-bound; end-to-end speedup >=
0.85x the formula at the measured α and c (``test_sd9_speculative_vs_target_only``, which also
shows the formula with the verification at its measured cost, separating a compute-bound
verification from the engine's overhead).
"""
from __future__ import annotations


import pytest
import torch

from inference_conformance.benchmarks.timing import median_seconds, paired_ratio, paired_ratios, ratio_estimate
from inference_conformance.conformance import results
from inference_conformance.conformance.registry import load
from inference_conformance.conformance.trends import best_gamma, sd9_fields
from inference_conformance.properties.speculative_cases import ALPHA, STAT_SIZES, sd1_law_verdicts
from inference_conformance.properties.speculative_claims_cases import (SD3_DOCS, SD3_GAMMA, SD3_MARGIN, SD3_MAX_TOKENS, SD3_BATCH, SD3_Z,
                                                 diff_ci, judge_sd3, tost_pass, wilson)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: (B, γ) per device.
SIZES = {"cuda": ((1, 4), (64, 4), (256, 8)), "cpu": ((16, 4),)}
V = 294


def pytest_generate_tests(metafunc):
    from inference_conformance.conformance.device import current_device

    if metafunc.definition.name == "test_bench_verify":
        sizes = SIZES[current_device()]
        metafunc.parametrize("B,gamma", sizes, ids=[f"B{b}-g{g}" for b, g in sizes])


def test_bench_verify(benchmark, device, B, gamma):
    from inference_conformance.optimized.speculative import verify
    from inference_conformance.reference.speculative import verify as verify_ref

    g = torch.Generator().manual_seed(0)
    q = torch.softmax(torch.randn(B, gamma, V, generator=g, dtype=torch.float64), -1).float().to(device)
    p = torch.softmax(torch.randn(B, gamma + 1, V, generator=g, dtype=torch.float64), -1).float().to(device)
    tok = torch.multinomial(q.reshape(-1, V).double().cpu(), 1, generator=g).reshape(B, gamma).to(device)
    gen = torch.Generator(device=device).manual_seed(1)
    repeats = 3 if benchmark.disabled else 20

    def run():
        return verify(tok, q, p, generator=gen)

    t = median_seconds(run, device, repeats)
    t_ref = median_seconds(lambda: verify_ref(tok, q, p, generator=gen), device, 3)
    nbytes = (q.numel() + p.numel()) * q.element_size()
    results.bench_info(benchmark, technique="speculative", backend="torch", device=device, dtype="float32",
                       batch=B, gamma=gamma, vocab_size=V, bytes=nbytes, median_s=t, reference_median_s=t_ref,
                       over_reference=t / t_ref,
                       goal="verifying up to 8 tokens <= 1.15x a one-token target step (memory-bound)")
    benchmark.pedantic(run, rounds=repeats, warmup_rounds=0)


#: Reseeded runs of the calibration on the batched verifier: false alarms are judged against
#: binom.ppf(0.999, 1000, 1e-3) = 5, a check that rejects a verifier or law at 1e-2 false
#: alarms with probability 0.93 (200 runs, the former size, had a limit of 3 and power 0.14);
#: runs per subtle zoo entry; exact multinomial draws of the whole law (limit 35; power 1.0
#: against 1e-2, 0.9997 against 3e-3).
CALIBRATION_RUNS, POWER_RUNS, EXACT_DRAWS = 1000, 50, 20_000


@pytest.mark.claim("SD-1")
@pytest.mark.experiment("slow calibration run (several minutes on one core)")
def test_sd1_law_calibration(device):
    """The statistical SD-1 law's error rates at the sizes CI uses: its false-alarm rate on
    20,000 exact multinomial draws of a correct verifier's rounds, the batched (correct)
    verifier's false alarms over 1000 reseeded runs, and the power against each known-bad
    verifier of a few percent bias over 50 runs of its real code."""
    from scipy import stats as sps  # here: every benchmark process imports this module

    from inference_conformance.properties.speculative_calibration_cases import SUBTLE_BIASES, sd1_law_false_alarms

    exact_k, exact_limit = sd1_law_false_alarms(EXACT_DRAWS, seed=1)
    good = load("speculative", "torch", "inference_conformance.optimized.speculative:verify", "builtin")

    def rejected(impl, seed):
        return any(not v.ok for v in sd1_law_verdicts(impl, 1000 + seed, device))

    false_alarms = sum(rejected(good, s) for s in range(CALIBRATION_RUNS))
    detections = {name: sum(rejected(load("speculative", name, f"inference_conformance.properties.zoo_speculative:{name}", "zoo"), s)
                            for s in range(POWER_RUNS)) for name in sorted(SUBTLE_BIASES)}
    stated = ALPHA                                          # the whole law's family-wise rate (Bonferroni)
    limit = int(sps.binom.ppf(1 - 1e-3, CALIBRATION_RUNS, stated))
    power_1e2 = float(sps.binom.sf(limit, CALIBRATION_RUNS, 1e-2))
    results.record("SD-1", measured=false_alarms / CALIBRATION_RUNS, bound=stated,
                   unit="false-alarm rate of the statistical law (correct verifier)",
                   rule=f"{CALIBRATION_RUNS} reseeded runs, rounds per pair {STAT_SIZES}; "
                        f"false alarms <= {limit} (binomial tail 1e-3); power against a rate of 1e-2: {power_1e2:.2f}",
                   what="power against " + ", ".join(f"{n}: {k}/{POWER_RUNS}" for n, k in detections.items()),
                   false_alarms=false_alarms, runs=CALIBRATION_RUNS, power=min(detections.values()) / POWER_RUNS,
                   power_runs=POWER_RUNS, trials=sum(STAT_SIZES.values()))
    assert exact_k <= exact_limit, f"{exact_k} false alarms in {EXACT_DRAWS} exact draws (limit {exact_limit})"
    assert false_alarms <= limit, f"{false_alarms} false alarms in {CALIBRATION_RUNS} runs (limit {limit})"
    weak = {n: k for n, k in detections.items() if k < 0.9 * POWER_RUNS}
    assert not weak, f"power below 0.9 against {weak} (of {POWER_RUNS} runs)"


# ------------------------------------------------------------------------ SD-3 (report experiment)
def test_sd3_equivalence_test_power():
    """SD-3's verdict can fail as stated: at 4000 documents per arm its equivalence test passes
    an output 2 points less grammatical (0.91 against 0.93) with probability at most 5%, and
    equal ones with probability at least 0.9 (the former rule, an interval containing 0 at 1000
    documents, passed the 2-point deficit more often than not)."""
    assert tost_pass(SD3_DOCS, 0.93 - SD3_MARGIN, 0.93) <= 0.051
    assert tost_pass(SD3_DOCS, 0.93, 0.93) >= 0.9


@pytest.mark.claim("SD-3")
@pytest.mark.experiment("report experiment (a few minutes on one core)")
def test_sd3_grammatical_fraction():
    """SD-3 on the small world: 4000 documents each from the poor draft alone, the target alone
    (two seeds: the size of a change of seed) and speculative sampling (the cached engine, poor
    draft, γ = 4), every arm capped at the same number of tokens; the grammatical fraction of
    each with its 95% Wilson interval, and speculative minus target judged by an equivalence
    test: the claim holds when the 90% interval of the difference lies within ±2 points (power
    and size stated in the row)."""
    from inference_conformance.optimized.speculative_engine import SpeculativeEngine
    from inference_conformance.smallworld.checker import is_grammatical
    from inference_conformance.smallworld.checkpoints import load_model
    from inference_conformance.smallworld.sample import sample_ids
    from inference_conformance.smallworld.tokenizer import tokenizer

    tok = tokenizer()
    target, draft = load_model("target", torch.float32), load_model("draft_poor", torch.float32)

    def alone(model, seed):
        g = torch.Generator().manual_seed(seed)
        return [tok.document_words(r.tolist()) for i in range(0, SD3_DOCS, SD3_BATCH)
                for r in sample_ids(model, SD3_BATCH, 1.0, g, max_len=SD3_MAX_TOKENS)]

    def speculative(seed):
        g = torch.Generator().manual_seed(seed)
        engine = SpeculativeEngine(target, draft, gamma=SD3_GAMMA, max_batch=SD3_BATCH,
                                   max_seq_len=target.cfg.max_seq_len)
        docs, rounds, accepted, drafted = [], 0, 0, 0
        for _ in range(0, SD3_DOCS, SD3_BATCH):
            out, st = engine.generate(torch.full((SD3_BATCH, 1), tok.bos_id), SD3_MAX_TOKENS, generator=g)
            docs += [tok.document_words(r.tolist()) for r in out]
            rounds, accepted, drafted = rounds + st["rounds"], accepted + st["accepted"], drafted + st["drafted"]
        return docs, accepted / drafted

    arms = {"draft alone (draft_poor)": alone(draft, 0), "target alone (seed 0)": alone(target, 0),
            "target alone (seed 1)": alone(target, 1)}
    spec_docs, acc_rate = speculative(0)
    arms[f"speculative (draft_poor, gamma={SD3_GAMMA})"] = spec_docs
    lecture = {"draft alone (draft_poor)": "8.4%", f"speculative (draft_poor, gamma={SD3_GAMMA})": "94.6%"}
    k = {}
    for name, docs in arms.items():
        k[name] = sum(is_grammatical(d) for d in docs)
        lo, hi = wilson(k[name], SD3_DOCS)
        results.record("SD-3", measured=k[name] / SD3_DOCS, lecture=lecture.get(name), unit="grammatical fraction",
                       rule=f"{SD3_DOCS} documents at temperature 1, capped at 118 tokens; 95% Wilson interval",
                       what=name, documents=SD3_DOCS, grammatical=k[name] / SD3_DOCS, ci_low=lo, ci_high=hi,
                       draft="draft_poor", gamma=SD3_GAMMA)
    spec = f"speculative (draft_poor, gamma={SD3_GAMMA})"
    d, lo, hi = diff_ci(k[spec], SD3_DOCS, k["target alone (seed 0)"], SD3_DOCS, SD3_Z)
    seed_change = abs(k["target alone (seed 1)"] - k["target alone (seed 0)"]) / SD3_DOCS
    holds = judge_sd3(k[spec], k["target alone (seed 0)"], SD3_DOCS) == "holds"
    power0, size = tost_pass(SD3_DOCS, 0.93, 0.93), tost_pass(SD3_DOCS, 0.93 - SD3_MARGIN, 0.93)
    results.record("SD-3", measured=d, lecture="no larger than a change of seed", unit="fraction (speculative - target)",
                   rule=f"equivalence (two one-sided tests at 5%): the 90% interval of the difference within "
                        f"±{SD3_MARGIN}; passes with probability {power0:.2f} when both are 0.93 grammatical, "
                        f"{size:.3f} when speculative is {SD3_MARGIN} less",
                   what=f"90% interval [{lo:.3f}, {hi:.3f}]; change of seed: {seed_change:.3f}; draft acceptance "
                        f"{acc_rate:.3f}", ci_low=lo, ci_high=hi, holds=holds, power=power0,
                   trend_rule=f"speculative as grammatical as the target (within ±{SD3_MARGIN})",
                   documents=SD3_DOCS)
    assert holds, (f"speculative - target = {d:.3f} (90% interval [{lo:.3f}, {hi:.3f}]) not within "
                   f"±{SD3_MARGIN}; change of seed {seed_change:.3f}")


# ------------------------------------------------------------------------ SD-9 (wall clock)
#: SD-9: γ values, tokens generated per run (B = 1), per device.
SD9_GAMMAS = {"cuda": tuple(range(1, 9)), "cpu": tuple(range(1, 9))}
SD9_TOKENS = 96


@pytest.mark.claim("SD-9")
@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_sd9_speculative_vs_target_only(benchmark, device, mode):
    """SD-9 on the small world at B = 1: wall-clock tokens/s of the speculative engine (both
    drafts, γ = 1..8) against target-only decoding through the same cached
    engine, next to the SD-4 formula at the measured α and the measured c (one draft step / one
    target step); the cost of scoring γ + 1 tokens in one target forward relative to a one-token
    step. Goals (issue, not asserted): verifying up to 8 tokens <= 1.15x a one-token step when
    memory-bound; measured speedup >= 0.85x the formula. The trend holds when the good draft's best
    γ is faster than target-only and the poor draft's best γ is at most 4 (the rule
    :func:`inference_conformance.conformance.trends.sd9_fields`, shown failing in ``properties/test_speculative_rejections.py``)."""
    from inference_conformance.optimized.speculative_engine import CachedModel, SpeculativeEngine
    from inference_conformance.reference.speculative import measured_alpha, speedup, tokens_per_call
    from inference_conformance.smallworld.checkpoints import load_model
    from inference_conformance.smallworld.tokenizer import tokenizer

    temperature = 0.0 if mode == "greedy" else 1.0
    target = load_model("target", torch.float32, device)
    drafts = {name: load_model(name, torch.float32, device) for name in ("draft_good", "draft_poor")}
    prompt = torch.full((1, 1), tokenizer().bos_id, device=device)
    repeats = 1 if benchmark.disabled else 5
    gammas = SD9_GAMMAS[device if device in SD9_GAMMAS else "cpu"] if not benchmark.disabled else (1, 4)
    n_tokens = SD9_TOKENS if not benchmark.disabled else 24
    cap = target.cfg.max_seq_len

    def one_at_a_time(model):
        eng = CachedModel(model, 1, cap)
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

    # every ratio from back-to-back alternating runs (paired_ratio): a shared machine's load
    # changes while the benchmark runs, and moves both sides of a paired ratio alike
    target_only = one_at_a_time(target)
    t_target = median_seconds(target_only, device, repeats)
    c_of = {name: paired_ratio(one_at_a_time(m), target_only, device, repeats) for name, m in drafts.items()}
    # the cost of a γ+1-token target forward relative to a one-token step, at a 32-token context
    engs = {k: CachedModel(target, 1, cap) for k in (1, *(g + 1 for g in gammas))}
    ctx = torch.randint(4, target.cfg.vocab_size, (1, 48), generator=torch.Generator().manual_seed(1)).to(device)

    def forward(k):
        """(run, setup) of one k-token target forward after a 32-token context (set up untimed)."""
        eng = engs[k]
        return (lambda: eng.extend(ctx[:, 32:32 + k], torch.tensor([k])),
                lambda: (eng.start(1), eng.extend(ctx[:, :32], torch.tensor([32]))))

    verify_reps = 5 if benchmark.disabled else 31

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
    by_gamma, rows = {name: {} for name in drafts}, []
    for name, draft in drafts.items():
        c = c_of[name]
        for gamma in gammas:
            engine = SpeculativeEngine(target, draft, gamma=gamma, max_batch=1, max_seq_len=cap, temperature=temperature)
            stats = {}

            def run(engine=engine, stats=stats):
                gen = torch.Generator(device=device).manual_seed(0)
                stats.update(engine.generate(prompt, n_tokens, generator=gen)[1])

            est = ratio_estimate(paired_ratios(target_only, run, device, repeats))  # target-only time / speculative
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
    # the verdict only from a real benchmark run (the CI smoke run times one repeat of 24 tokens)
    # judged only on every γ of 1..8 (on {1, 2, 4, 8} "best γ <= 4" held by construction: 3 of 4)
    # the good draft's speed-up at its best γ judged by its interval against 1 (the best of 8 is
    # picked from the same run: its interval leans high, the poor draft's best γ is a point)
    verdict = ({} if benchmark.disabled or tuple(gammas) != tuple(range(1, 9))
               else sd9_fields(by_gamma["draft_good"], by_gamma["draft_poor"]))
    results.record("SD-9", measured=round(good.estimate, 3), unit=f"best speedup of the good draft ({mode})",
                   lecture="faster than target-only; speedup >= 0.85x the formula" + unmeasured,
                   what=f"good draft best gamma {good_gamma}; poor draft best gamma {poor_gamma} "
                        f"(speedup {poor.estimate:.2f})",
                   best_gamma=good_gamma, device=device, **verdict)
    for row in rows:                 # after the summary: the report's ledger shows the first rows
        results.record("SD-9", **row)
    results.bench_info(benchmark, technique="speculative", backend="speculative_engine", device=device,
                       dtype="float32", batch=1, claim="SD-9",
                       what=f"target-only decoding: {n_tokens / t_target:.1f} tokens/s")
    benchmark.pedantic(one_at_a_time(target), rounds=repeats, warmup_rounds=0)


# ------------------------------------------------------------ SD-10 / SD-14: token trees
#: Tree widths per depth (children of every node of that depth) per device: N nodes, depth len(widths).
TREE_WIDTHS = {"cuda": ((4, 2, 2), (8, 4, 2, 1)), "cpu": ((2, 2, 1),)}


def _tree_of(widths):
    parents, frontier = [], [-1]
    for w in widths:
        nxt = []
        for u in frontier:
            for _ in range(w):
                parents.append(u)
                nxt.append(len(parents) - 1)
        frontier = nxt
    return parents


def _branches(parents):
    """Each root-to-leaf path (node lists) of the tree."""
    kids = {i for i in parents if i >= 0}
    out = []
    for leaf in (i for i in range(len(parents)) if i not in kids):
        path, j = [], leaf
        while j >= 0:
            path.append(j)
            j = parents[j]
        out.append(path[::-1])
    return out


@pytest.mark.claim("SD-10")
@pytest.mark.parametrize("widths", [w for ws in TREE_WIDTHS.values() for w in ws], ids=lambda w: "w" + "-".join(map(str, w)))
def test_bench_tree_one_forward_vs_branches(benchmark, device, widths):
    """A token tree of N nodes scored in one target forward (tree attention) against its
    root-to-leaf branches scored one forward each (about N / depth forwards), the shipped target
    in float32 after a 32-token prefix: the ratio branches / tree (the Triton kernel on a GPU,
    the reference core on a CPU, where the interpreter's time would be measured instead)."""
    from inference_conformance.conformance.device import current_device
    from inference_conformance.optimized.speculative_tree_engine import TreeCachedModel
    from inference_conformance.smallworld.checkpoints import load_model

    if widths not in TREE_WIDTHS[current_device()]:
        pytest.skip(f"tree widths {widths} are measured on the other device")
    parents = _tree_of(widths)
    branches = _branches(parents)
    model = load_model("target", torch.float32, device)
    m = TreeCachedModel(model, 1, 128)
    m.attention = "triton" if device == "cuda" else "torch"
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(4, 294, (1, 32), generator=g).to(device)
    tokens = torch.randint(4, 294, (1, len(parents)), generator=g).to(device)
    par = torch.tensor(parents, dtype=torch.int64)
    m.start(1)
    m.extend(prefix, torch.tensor([32]))
    back = torch.tensor([32])

    def tree():
        m.tree_forward(tokens, par)
        m.rollback(back)

    def one_by_one():
        for path in branches:
            m.extend(tokens[:, path], torch.tensor([len(path)]), check_ids=False)
            m.rollback(back)

    repeats = 3 if benchmark.disabled else 15
    ratios = paired_ratios(one_by_one, tree, device, repeats)
    est = ratio_estimate(ratios)
    t_tree = median_seconds(tree, device, repeats)
    results.bench_info(benchmark, technique="speculative", backend=m.attention, device=device, dtype="float32",
                       batch=1, nodes=len(parents), median_s=t_tree, what="branch forwards / one tree forward",
                       forwards=len(branches), ratio=round(est.estimate, 3))
    results.record("SD-10", measured=round(est.estimate, 3), unit=f"time of {len(branches)} branch forwards / one tree "
                   f"forward ({len(parents)} nodes, {device})", nodes=len(parents))
    benchmark.pedantic(tree, rounds=repeats, warmup_rounds=0)


#: Drafters of the tokens-per-call table, and new tokens per prompt per device.
TPC_DRAFTERS = ("chain", "tree", "heads", "self", "lookup")
TPC_TOKENS = {"cuda": 48, "cpu": 16}


@pytest.mark.claim("SD-14")
@pytest.mark.parametrize("drafter", TPC_DRAFTERS)
def test_bench_tokens_per_call(benchmark, device, drafter):
    """Greedy tree speculation on the small world (the shipped target, float32) from two prompts
    (free generation from <bos>, and a copy prompt): tokens per target call and wall-clock
    tokens/s for a draft chain (γ = 4), a top-k draft tree (2, 2, 1), Medusa-style heads (2),
    self-speculation (block 1 skipped, γ = 4) and prompt lookup (3-grams, 5 tokens)."""
    import time

    from inference_conformance.conformance.device import current_device
    from inference_conformance.optimized.speculative_drafters import (ChainDrafter, HeadsDrafter, PromptLookupDrafter,
                                                                      SelfSpeculativeDrafter, TopKTreeDrafter)
    from inference_conformance.optimized.speculative_tree_engine import TreeSpeculativeEngine
    from inference_conformance.smallworld.checkpoints import load_model
    from inference_conformance.smallworld.data import encode, split
    from inference_conformance.smallworld.tokenizer import tokenizer

    target = load_model("target", torch.float32, device)
    draft = load_model("draft_good", torch.float32, device)
    if drafter == "heads":
        from inference_conformance.smallworld.heads import shipped_heads

        heads = shipped_heads().over(target)
    d = {"chain": lambda: ChainDrafter(draft, 4), "tree": lambda: TopKTreeDrafter(draft, (2, 2, 1)),
         "heads": lambda: HeadsDrafter(target, heads), "self": lambda: SelfSpeculativeDrafter(target, (1,), 4),
         "lookup": lambda: PromptLookupDrafter(3, 5)}[drafter]()
    doc = encode(split("val", 1))[0]
    prompts = [torch.tensor([[tokenizer().bos_id]]), torch.tensor([doc[:-1] + doc[:4]])]
    n = TPC_TOKENS[current_device()]
    attention = "triton" if device == "cuda" else "torch"
    total = {"rounds": 0, "emitted": 0}
    t0 = time.perf_counter()
    for p in prompts:
        _, s = TreeSpeculativeEngine(target, d, max_seq_len=128, attention=attention).generate(p.to(device), n)
        total = {k: total[k] + s[k] for k in total}
    wall = time.perf_counter() - t0
    tpc = total["emitted"] / total["rounds"]
    results.bench_info(benchmark, technique="speculative", backend=attention, device=device, dtype="float32",
                       batch=1, drafter=drafter, tokens_per_call=round(tpc, 3), rounds=total["rounds"],
                       tokens_per_s=total["emitted"] / wall)
    results.record("SD-14", measured=round(tpc, 3), unit=f"tokens per target call, {drafter} (benchmark prompts)",
                   drafter=drafter, tokens_per_call=round(tpc, 3), rounds=total["rounds"])
    benchmark.pedantic(lambda: None, rounds=1, warmup_rounds=0)
