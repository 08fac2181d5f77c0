"""The checks of the speculative-decoding claims SD-2..SD-7 and SD-13 (SD-14's:
``properties/speculative/sd14_cases.py``), each a function of what it judges (a formula, an
enumeration, a set of measurements, a generator), so that the same comparison that gives the claim
its verdict (``properties/test_speculative*.py``, ``benchmarks/bench_speculative*.py``) can be fed a
known-bad input and shown to reject it (``properties/speculative/test_speculative_rejections.py``).

Every ``check_*`` raises AssertionError with a message naming the claim, the measured value,
the bound or the lecture's figure and the rule, and records what it compared
(:func:`inference_conformance.conformance.results.record`) when it passes; every ``judge_*`` returns the figure
claim's verdict ("holds" / "fails" / "inconclusive"). Bands are the lecture's printed precision
or the claim's own words ("about", "≈"), stated at each comparison; none is derived from the
input under test. SD-9's rule is a trend rule of :mod:`inference_conformance.conformance.trends`.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from inference_conformance.conformance import results, sizes
from inference_conformance.conformance.tolerance import Comparison, report_verdict
from inference_conformance.reference import speculative as ref
from inference_conformance.reference import speculative_tree as ref_tree

#: The exact rule of SD-2 and SD-4: enumeration against the claim's figure in float64.
EXACT_BOUND = 1e-12


def _exact(error: float, what: str) -> None:
    """The exact rule as the tolerance policy's verdict (noted for the test's row): raises
    AssertionError naming ``what``, the error and the bound when ``error`` > 1e-12."""
    report_verdict(Comparison(error <= EXACT_BOUND, "exact enumeration in float64", error, EXACT_BOUND, what)).check()


# ------------------------------------------------------------------------------------- SD-2
def check_sd2(round_outcomes: Callable = ref.round_outcomes) -> tuple[float, float]:
    """SD-2 on ``round_outcomes(draft_rows (γ, V), target_rows (γ+1, V)) -> {emitted tuple:
    probability}`` (an enumerator of one round, :func:`inference_conformance.reference.speculative.round_outcomes`):
    CS336's two-token example (its notation: q the target (0.3, 0.7), p the draft (0.6, 0.4),
    p(A) > q(A)), γ = 1: the first emitted token is A with probability q(A) and B with q(B), to
    1e-12. Returns (P[A], P[B])."""
    target, draft = np.array([0.3, 0.7]), np.array([0.6, 0.4])           # CS336's q, p
    outcomes = round_outcomes(draft[None], np.stack([target, target]))
    P_A = sum(pr for seq, pr in outcomes.items() if seq[0] == 0)
    P_B = sum(pr for seq, pr in outcomes.items() if seq[0] == 1)
    err = max(abs(P_A - target[0]), abs(P_B - target[1]))
    results.record("SD-2", measured=err, bound=EXACT_BOUND, lecture="P[A] = q(A), P[B] = q(B)",
                   unit="max |P - q| (CS336's q is the target)", rule="exact enumeration", P_A=P_A, P_B=P_B)
    _exact(err, f"SD-2: P[A] = {P_A:.6g}, P[B] = {P_B:.6g} of the first emitted token vs q(A) = 0.3, q(B) = 0.7")
    return P_A, P_B


# ------------------------------------------------------------------------------------- SD-3
#: SD-3: the poor draft's γ, the token cap every arm shares (the engine needs 2γ + 2 free slots in
#: the models' 128 positions), rows per engine batch
#: (``benchmarks/speculative/bench_speculative_experiments.py::test_sd3_grammatical_fraction``); the
#: documents per arm and the equivalence margin are sizes (:mod:`inference_conformance.conformance.sizes`:
#: 1000 documents and ±4 points by default, 4000 and ±2 points with ``--full``).
SD3_GAMMA, SD3_MAX_TOKENS, SD3_BATCH = 4, 118, 250
#: SD-3's equivalence test (two one-sided tests at 5% each): speculative and target are "as
#: grammatical" when the 90% interval of their difference lies within ±margin. At a grammatical
#: rate of 0.93 it declares equivalence with probability 0.94 when they are equal, at both sizes
#: (1000 documents per arm and ±4 points, 4000 and ±2 points, about twice the typical change of
#: seed at 1000 documents), and with probability about 5% when the output is one margin less
#: grammatical (:func:`tost_pass`). SD3_MARGIN: the full size's margin, the default of the rules.
SD3_MARGIN, SD3_Z = sizes.SIZES["sd3_margin"].full, 1.644854


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion k / n."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / (1 + z * z / n)
    return centre - half, centre + half


def diff_ci(k1: int, n1: int, k2, n2: int, z: float) -> tuple:
    """Difference of two proportions k1/n1 - k2/n2 with its two-sided normal (Wald) interval at z
    (``k2`` may be an array of counts: the intervals of each)."""
    p1, p2 = k1 / n1, k2 / n2
    half = z * (p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2) ** 0.5
    return p1 - p2, p1 - p2 - half, p1 - p2 + half


def judge_sd3(k_spec: int, k_target: int, n: int, margin: float = SD3_MARGIN) -> str:
    """SD-3's verdict on the grammatical counts of speculative decoding and of the target, ``n``
    documents each: "holds" when the 90% interval of the difference lies within ±``margin``
    (a fraction; equivalence, two one-sided tests at 5%), "fails" when it lies wholly outside (a
    difference larger than the margin shown), "inconclusive" when it straddles a margin."""
    _, lo, hi = diff_ci(k_spec, n, k_target, n, SD3_Z)
    if -margin < lo and hi < margin:
        return "holds"
    return "fails" if hi < -margin or lo > margin else "inconclusive"


def tost_pass(n: int, p_spec: float, p_target: float, margin: float = SD3_MARGIN) -> float:
    """Probability that SD-3's equivalence test at ±``margin`` passes when speculative and target
    write grammatical documents at the rates p_spec and p_target, ``n`` documents each (exact:
    every pair of binomial(n) counts)."""
    from scipy import stats as sps

    k = np.arange(n + 1)
    w1, w2 = sps.binom.pmf(k, n, p_spec), sps.binom.pmf(k, n, p_target)
    total = 0.0
    for k1 in np.flatnonzero(w1 > 1e-15):
        _, lo, hi = diff_ci(int(k1), n, k, n, SD3_Z)
        total += w1[k1] * float(w2[(lo > -margin) & (hi < margin)].sum())
    return total


# ------------------------------------------------------------------------------------- SD-4
#: The draft costs SD-4's speedup part is checked at (c = draft step / target step).
SD4_COSTS = (0.0, 0.05, 0.3)


def check_sd4(alpha: float, tokens_per_call: Callable = ref.tokens_per_call,
              speedup: Callable = ref.speedup) -> None:
    """SD-4 at one α on ``tokens_per_call(α, γ)`` and ``speedup(α, γ, c)``: when every position
    accepts with the same α (draft one-hot on token 0, target (α, 1 − α, 0): Σ min(p, q) = α),
    the enumerated expected tokens per round equals ``tokens_per_call`` (1e-12, γ = 1..4), and
    ``speedup`` equals those enumerated tokens over the cost of a round, 1 + γc (γ draft steps
    at c each and one target step), for c in :data:`SD4_COSTS`. Records one row per γ."""
    q_row = np.array([1.0, 0.0, 0.0])
    p_row = np.array([alpha, 1 - alpha, 0.0])
    for gamma in range(1, 5):
        outcomes = ref.round_outcomes(np.tile(q_row, (gamma, 1)), np.tile(p_row, (gamma + 1, 1)))
        enumerated = sum(len(s) * pr for s, pr in outcomes.items())
        formula = tokens_per_call(alpha, gamma)
        _exact(abs(enumerated - formula), f"SD-4: tokens per call at alpha={alpha}, gamma={gamma}: formula "
                                          f"{formula:.6g} vs enumeration {enumerated:.6g} ((1 - a^(g+1)) / (1 - a))")
        for c in SD4_COSTS:
            s = speedup(alpha, gamma, c)
            assert abs(s - enumerated / (1 + gamma * c)) <= EXACT_BOUND, (
                f"SD-4: speedup at alpha={alpha}, gamma={gamma}, c={c}: {s:.6g}, not the enumerated tokens per "
                f"call over 1 + gamma c = {enumerated / (1 + gamma * c):.6g} (rule: tokens_per_call / (1 + gamma c))")
        results.record("SD-4", measured=enumerated, lecture=formula, bound=EXACT_BOUND,
                       unit="tokens per target call", rule="enumeration equals (1 - a^(g+1)) / (1 - a)",
                       gamma=gamma, tokens_per_call=enumerated, alpha=alpha, draft=f"formula alpha={alpha}")


# ------------------------------------------------------------------------------------- SD-6
#: Exercise 7 of the lecture (SD-6): α = 0.8, c = 0.05.
EXERCISE_7 = {1: 1.71, 4: 2.80, 8: 3.09, 10: 3.05}


def check_sd6(speedup: Callable = ref.speedup, best_gamma: Callable = ref.best_gamma) -> dict[int, float]:
    """SD-6 on ``speedup(α, γ, c)`` and ``best_gamma(α, c)``: at α = 0.8, c = 0.05 the speedups
    of :data:`EXERCISE_7` to the lecture's printed precision (±0.005), and the best γ within 1
    of 8 ("near γ = 8"). Returns the table γ = 1..12."""
    table = {g: speedup(0.8, g, 0.05) for g in range(1, 13)}
    best = best_gamma(0.8, 0.05)
    results.record("SD-6", measured={g: round(s, 3) for g, s in table.items()}, lecture=EXERCISE_7,
                   unit="speedup (x)", rule="tokens_per_call / (1 + gamma c), alpha=0.8, c=0.05",
                   best_gamma=best)
    for g, lecture in EXERCISE_7.items():
        assert abs(table[g] - lecture) <= 0.005 + 1e-12, (
            f"SD-6: speedup at gamma={g}: formula {table[g]:.4f}, lecture {lecture} (rule: within 0.005, "
            "the lecture's printed precision)")
    assert abs(best - 8) <= 1, f"SD-6: best gamma {best}, lecture: near 8 (rule: within 1 of 8)"
    return table


# ------------------------------------------------------------------------------------- SD-5
#: SD-5 on the small world: rounds of B = 8 documents, 32 new tokens each (256 per γ), γ = 1..10.
SD5_ROWS, SD5_TOKENS, SD5_GAMMAS = 8, 32, tuple(range(1, 11))
#: The claim's figures (lecture 002 §2): α of each draft, tokens per call (γ = 8 for the good
#: draft; every γ >= 4 for the poor one, "about 3 whatever γ"), and the tolerances "≈" and
#: "about" are read with: α within 0.03, tokens per call within 0.5.
SD5_LECTURE = {"draft_good": dict(alpha=0.92, tokens=6.0, gammas=(8,)),
               "draft_poor": dict(alpha=0.69, tokens=3.0, gammas=tuple(g for g in SD5_GAMMAS if g >= 4))}
SD5_ALPHA_TOL, SD5_TOKENS_TOL = 0.03, 0.5
#: "Measured slightly below the formula", one-sided: measured tokens per call not above the
#: formula at the measured α (pooled z over every round of γ = 1..10 at most z_0.99 = 2.326),
#: and not more than 20% below it (a round loop that loses tokens is).
SD5_Z, SD5_LOW = 2.326, 0.8


class RoundLog:
    """A verify that records, per call, the emitted tokens (num_accepted + 1) of every row still
    generating (``speculative_generate`` advances a row by num_accepted + 1 until it has
    ``new_tokens``; finished rows are verified but not counted)."""

    def __init__(self, B, new_tokens):
        self.lengths, self.goal, self.emitted = np.zeros(B, dtype=np.int64), new_tokens, []

    def __call__(self, draft_tokens, draft_probs, target_probs, *, generator):
        tokens, n = ref.verify(draft_tokens, draft_probs, target_probs, generator=generator)
        active = self.lengths < self.goal
        e = n.numpy() + 1
        self.emitted += e[active].tolist()
        self.lengths += np.where(active, e, 0)
        return tokens, n


def sd5_below_formula(by_gamma: dict) -> tuple[float, float, float]:
    """(z, mean ratio, the smallest relative excess over the formula found with probability 0.9)
    of measured tokens per call against the formula, pooled over γ: z = Σ (e − f_γ) / √Σ (e − ē_γ)²
    over every round's emitted count e. ``by_gamma``: {γ: (α, [emitted per round], formula)}."""
    excess = sum(float(np.sum(np.asarray(e) - f)) for _, e, f in by_gamma.values())
    var = sum(float(np.sum((np.asarray(e) - np.mean(e)) ** 2)) for _, e, _ in by_gamma.values())
    total_formula = sum(len(e) * f for _, e, f in by_gamma.values())
    ratio = float(np.mean([np.mean(e) / f for _, e, f in by_gamma.values()]))
    return excess / var ** 0.5, ratio, (SD5_Z + 1.2816) * var ** 0.5 / total_formula


def sd5_parts(draft: str, by_gamma: dict) -> dict:
    """SD-5's claim for ``draft`` ("draft_good" / "draft_poor") judged part by part on its
    measurements ``by_gamma`` ({γ: (measured α, [tokens emitted per round], the formula
    (1 − α^(γ+1)) / (1 − α) at that α)}, γ = 1..10): ``mean_alpha`` and ``alpha_holds`` (within
    0.03 of the lecture's α), ``tokens`` (mean tokens per call at the claim's γ) with ``far`` (those
    more than 0.5 from its figure) and ``tokens_holds``, ``z``, ``ratio`` (measured / formula, mean
    over γ), ``detectable`` and ``below_holds`` (not above the formula, z <= 2.326, and at most 20%
    below it)."""
    lec = SD5_LECTURE[draft]
    mean_alpha = float(np.mean([a for a, _, _ in by_gamma.values()]))
    tokens = {g: float(np.mean(by_gamma[g][1])) for g in lec["gammas"]}
    far = {g: round(t, 2) for g, t in tokens.items() if abs(t - lec["tokens"]) > SD5_TOKENS_TOL}
    z, ratio, detectable = sd5_below_formula(by_gamma)
    return dict(mean_alpha=mean_alpha, alpha_holds=abs(mean_alpha - lec["alpha"]) <= SD5_ALPHA_TOL, tokens=tokens,
                far=far, tokens_holds=not far, z=z, ratio=ratio, detectable=detectable,
                below_holds=bool(z <= SD5_Z and ratio >= SD5_LOW))


def judge_sd5(draft: str, by_gamma: dict) -> str:
    """SD-5's verdict for ``draft`` on its measurements (:func:`sd5_parts`): "holds" when every
    part does (the lecture's α and tokens per call, slightly below the formula), else "fails"."""
    parts = sd5_parts(draft, by_gamma)
    return "holds" if parts["alpha_holds"] and parts["tokens_holds"] and parts["below_holds"] else "fails"


def check_sd5_tokens_kept(draft: str, by_gamma: dict) -> float:
    """The part of SD-5 the suite fails on: measured tokens per call, over the formula at the
    measured α, averages at least 0.8 over γ (a verifier or a round loop that loses tokens is
    further below). Returns that mean ratio."""
    ratio = sd5_parts(draft, by_gamma)["ratio"]
    assert ratio >= SD5_LOW, (f"SD-5: {draft}: measured tokens per call / formula averages {ratio:.3f} over "
                              f"gamma={min(by_gamma)}..{max(by_gamma)} (rule: >= {SD5_LOW}; more than "
                              f"{1 - SD5_LOW:.0%} below the formula: tokens lost)")
    return ratio


# ------------------------------------------------------------------------------------- SD-7
def check_sd7(target, draft, gamma: int, verify_fn=None, rows: int = 3, n_tokens: int = 24,
              draft_name: str = "") -> int:
    """SD-7 (exercise 8) on the small world's ``target`` and ``draft``
    (:class:`inference_conformance.reference.transformer.Transformer`, float64): greedy speculative decoding
    (:func:`inference_conformance.reference.speculative.speculative_generate`, greedy, with ``verify_fn`` as its verifier:
    None for :func:`inference_conformance.reference.speculative.verify_greedy`) of ``rows`` rows from ``<bos>``,
    ``n_tokens`` new tokens at γ = ``gamma``, emits exactly the tokens of greedy decoding with the
    target (no cache). Records the tokens differing (0; ``draft_name`` names the draft in the
    row) and returns it."""
    import torch

    from inference_conformance.conformance.tolerance import assert_exact
    from inference_conformance.reference.transformer import generate
    from inference_conformance.smallworld.tokenizer import tokenizer

    prompt = torch.full((rows, 1), tokenizer().bos_id, dtype=torch.int64)
    out, st = ref.speculative_generate(target, draft, prompt, n_tokens, gamma, greedy=True, verify_fn=verify_fn)
    out_ref, _ = generate(target, prompt, n_tokens)
    differing = int((out != out_ref).sum())
    assert_exact(out, out_ref, what=f"SD-7: greedy speculative ({draft_name}, gamma={gamma}) vs greedy target: "
                                    f"{differing} tokens differ (rule: exact)")
    results.record("SD-7", measured=differing, bound=0, unit="tokens differing", rule="exact", gamma=gamma,
                   draft=draft_name, alpha=ref.measured_alpha(st))
    return differing


# ------------------------------------------------------------------------------------ SD-13
#: ε values of SD-13's figure (δ = sqrt(ε), Medusa's default pairing), and the trees it is
#: measured on (:data:`inference_conformance.properties.speculative_tree.cases.TREE_STAT_CONFIGS`).
TYPICAL_EPSILONS = (0.01, 0.03, 0.09, 0.2, 0.3, 0.5)
TYPICAL_CASE = "binary-V3"
TYPICAL_TREES = (TYPICAL_CASE, "three-drafts-V3")
#: Below this total-variation distance typical acceptance would look exact (the exact rule's
#: float64 enumeration gives 1e-15; a real bias of the figure's settings gives > 1e-2).
SD13_INEXACT = 1e-3


def check_sd13_figure(typical: Callable = ref_tree.typical_acceptance,
                      total_variation: Callable = ref_tree.tree_total_variation) -> dict:
    """SD-13's figure on ``typical(ε, δ) -> Rule`` and ``total_variation(parents, q, p, V, rule)``
    (the exact enumerator): on a dense binary tree and three independent drafts over V = 3, the
    distance of typical acceptance from the target at every ε of :data:`TYPICAL_EPSILONS`
    (δ = sqrt(ε)) is > 1e-3 ("not exact, by design"). Returns {tree: {ε: TV}}."""
    from inference_conformance.properties.speculative_tree.cases import TREE_STAT_CONFIGS

    figure = {}
    for name in TYPICAL_TREES:
        case = TREE_STAT_CONFIGS[name]
        figure[name] = {eps: round(total_variation(case.parents, case.q, case.p, case.V,
                                                   typical(eps, math.sqrt(eps))), 4)
                        for eps in TYPICAL_EPSILONS}
    low = min(min(f.values()) for f in figure.values())
    assert low > SD13_INEXACT, (f"SD-13: typical acceptance's total-variation distance {low:.3g} <= {SD13_INEXACT:g} "
                                f"somewhere (rule: > {SD13_INEXACT:g} at every epsilon, not exact by design): {figure}")
    results.record("SD-13", measured=figure[TYPICAL_CASE], lecture="not exact, by design",
                   unit="total-variation distance from the target (epsilon -> TV, delta = sqrt(epsilon))",
                   rule="exact enumeration over depth + 1 tokens; exact verification gives 0",
                   what=f"not exact, by design: TV by epsilon on {TYPICAL_CASE}; three drafts {figure['three-drafts-V3']}")
    return figure


def check_sd13_limits(typical: Callable = ref_tree.typical_acceptance,
                      total_variation: Callable = ref_tree.tree_total_variation) -> dict:
    """SD-13's limits on the same ``typical`` and ``total_variation``: the distance is 0 (1e-12)
    where typical acceptance never accepts a token the exact rule could reject, a threshold >= 1
    (ε >= 1, δ >= exp(H_max): nothing accepted, every token from p) and a one-hot target (only its
    token passes); and > 1e-3 on the dense tree at ε = 0.09, δ = 0.3 (the same enumeration can
    find it inexact). Returns {limit: TV}."""
    from inference_conformance.properties.speculative_tree.cases import TREE_STAT_CONFIGS, tree_case

    dense = TREE_STAT_CONFIGS[TYPICAL_CASE]
    never = typical(1.0, math.exp(math.log(dense.V)) + 1.0)
    onehot = tree_case(dense.parents, 3, 7, "onehot-p")
    limits = {"threshold >= 1": total_variation(dense.parents, dense.q, dense.p, dense.V, never),
              "one-hot target": total_variation(onehot.parents, onehot.q, onehot.p, onehot.V, typical(0.09, 0.3))}
    results.record("SD-13", measured={k: float(f"{v:.3g}") for k, v in limits.items()}, bound=EXACT_BOUND,
                   unit="total-variation distance in the exact limits", rule="exact enumeration, float64")
    assert max(limits.values()) <= EXACT_BOUND, (
        f"SD-13: typical acceptance not exact in its limits: {limits} (rule: total variation <= {EXACT_BOUND:g} "
        "where no token a correct rule could reject is accepted)")
    inexact = total_variation(dense.parents, dense.q, dense.p, dense.V, typical(0.09, 0.3))
    assert inexact > SD13_INEXACT, (f"SD-13: the same enumeration found typical acceptance exact on a dense tree "
                                    f"(TV {inexact:.3g} <= {SD13_INEXACT:g} at epsilon 0.09, delta 0.3)")
    return limits

