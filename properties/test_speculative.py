"""Laws of speculative decoding (claims SD-1, SD-2, SD-4..SD-7; lecture 002 §2, Leviathan et al.
2023). The checks of SD-2 and SD-4..SD-7 are functions of what they judge in
``properties/speculative_claims_cases.py``, shown rejecting known-bad inputs in
``properties/test_speculative_rejections.py``.

SD-1 is checked two ways. Exactly: the float64 enumerator (``inference_conformance.reference.speculative``) sums every
accept/reject path of repeated rounds, and the distribution of the first emitted token, and of
the first two, must equal the target's to 1e-12 for drawn (p, q) pairs and the pinned boundary
classes (disjoint supports, q = 0 where p > 0, p = q, one-hot, tiny probabilities). On samples,
for every registered ``verify`` (``--impl speculative=module:fn`` ones included): one batch of
independent rounds per fixed (p, q) pair (two dense ones, three boundary classes), four G-tests
per pair (first token, first two, number accepted, (number accepted, last token)) at a stated
family-wise false-alarm rate for the whole law, after exact checks of the output's structure. The bug zoo (``properties/zoo_speculative.py``) is each shown rejected.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import note
from hypothesis import strategies as st

from inference_conformance.conformance import results
from inference_conformance.conformance.contracts.speculative import PAD
from inference_conformance.conformance.tolerance import Verdict, report_verdict, assert_exact
from inference_conformance.conformance.laws import Kills, Law
from inference_conformance.properties.speculative_cases import (
    ALPHA,
    OUTCOMES,
    PINNED,
    STAT_CONFIGS,
    STAT_SIZES,
    SUBTLE_BIASES,
    certain_cases,
    extend,
    first_two_token_distribution,
    law_limit,
    law_rejections,
    marginals,
    outcome_counts,
    pq_pairs,
    run_trials,
    sd1_law_false_alarms,
    sd1_law_verdicts,
    verifier_outcomes,
)
from inference_conformance.conformance.stats import check_counts, upper_bound
from inference_conformance.properties.speculative_claims_cases import (SD5_ALPHA_TOL, SD5_GAMMAS, SD5_LECTURE, SD5_LOW, SD5_ROWS, SD5_TOKENS,
                                                 SD5_TOKENS_TOL, SD5_Z, RoundLog, check_sd2, check_sd4, check_sd5_tokens_kept,
                                                 check_sd6, check_sd7, sd5_parts)
from inference_conformance.reference import speculative as ref

TECH = "speculative"
ZOO_ALL = ("late_rejection", "resample_from_p", "accept_q_over_p", "continue_after_rejection",
           "drops_bonus_token", "unnormalised_residual", "acceptance_times_097", "residual_toward_q",
           "bonus_from_q")
#: The exact rule of SD-1: the enumerated distribution equals the target's to this bound (float64).
EXACT_BOUND = 1e-12

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _exact_verdict(dist, expected, what, accept=ref.accept_min_p_over_q, bound=EXACT_BOUND) -> Verdict:
    err = float(np.abs(np.asarray(dist) - np.asarray(expected)).max())
    return Verdict(err <= bound, f"exact enumeration in float64: max |P - p| <= {bound:g}", err, bound, what)


def sd1_exact(pq, accept=ref.accept_min_p_over_q) -> list[Verdict]:
    """The enumerated distributions of the first and first two emitted tokens vs the target's."""
    out = []
    for n in (1, 2):
        q_rows, p_rows = extend(pq, n)
        dist = ref.prefix_distribution(q_rows, p_rows, pq.gamma, n, accept=accept)
        expected = p_rows[0] if n == 1 else np.outer(p_rows[0], p_rows[1])
        out.append(_exact_verdict(dist, expected, f"{pq!r}: first {n} emitted token(s)"))
    return out


def law_sd1_exact(run, pq):
    """SD-1 exactly on one (p, q): the enumerated distributions of the first and first two emitted
    tokens are the target's; each comparison's error is observed."""
    note(f"q={pq.q.tolist()} p={pq.p.tolist()}")
    for v in sd1_exact(pq):
        run.observe(v.error)
        report_verdict(v).check()


#: SD-1's exact law (no implementation: the reference's enumeration of every path).
SD1_EXACT = Law(claim="SD-1", technique=TECH, body=law_sd1_exact, params=(), given={"pq": pq_pairs()},
                examples=tuple(dict(pq=PINNED[i]) for i in range(5)))


@pytest.mark.claim("SD-1")
def test_sd1_exact_enumeration():
    """SD-1 exactly: for drawn and pinned (p, q), the distribution of the first emitted token and
    of the first two equals the target's to 1e-12 (float64 enumeration of every path)."""
    run = SD1_EXACT(ref)
    results.record("SD-1", measured=max(run.observations), bound=EXACT_BOUND, lecture="5e-7 on 200 documents",
                   unit="max |P(emitted) - p| over the enumerated distributions",
                   rule="exact enumeration of every accept/reject path, float64", what="exact error")


@pytest.mark.claim("SD-1")
@pytest.mark.parametrize("rule", ["min(1, q/p)", "0.97 min(1, p/q)", "1 (accept every draft)"])
def test_sd1_exact_check_rejects_wrong_acceptance(rule):
    """The exact check can fail: enumerating with a wrong acceptance rule moves the emitted
    distribution away from p by far more than the bound, on the pinned pairs where p != q."""
    accept = {"min(1, q/p)": lambda p, q: min(1.0, q / p) if p > 0 else 0.0,
              "0.97 min(1, p/q)": lambda p, q: 0.97 * min(1.0, p / q),
              "1 (accept every draft)": lambda p, q: 1.0}[rule]
    errors = [v.error for pq in (PINNED[0], PINNED[1], PINNED[3]) for v in sd1_exact(pq, accept)]
    assert max(errors) > 1e-3, f"acceptance {rule} passed the exact SD-1 check (errors {errors})"


@pytest.mark.claim("SD-2")
def test_sd2_two_token_example():
    """SD-2, the two-token proof of CS336 (its notation: q the target, p the draft): a draft
    that over-proposes A (p(A) > q(A)) is accepted on A with probability q(A)/p(A) and always
    on B, and a rejection always yields B: P[A] = q(A), P[B] = q(B), by exact enumeration
    (:func:`inference_conformance.properties.speculative_claims_cases.check_sd2`)."""
    check_sd2(ref.round_outcomes)


# --------------------------------------------------------------- SD-1 on samples, every verify
def law_sd1_statistical(run, device, seed: int = 7):
    """SD-1 on samples: for each fixed pair of :data:`STAT_CONFIGS`, one ``verify`` call over its
    independent rounds; structure exactly, then four G-tests, ALPHA family-wise over the law."""
    impl = run.impl
    failed = [v for v in sd1_law_verdicts(impl, seed, device) if not v.ok]
    failed.sort(key=lambda v: -(v.error / v.bound if v.bound > 0 else float("inf")))
    more = f" (+{len(failed) - 3} more)" if len(failed) > 3 else ""
    assert not failed, "; ".join(f"{v.what}: {v.detail}" for v in failed[:3]) + more


#: SD-1 on samples, over every registered verify.
SD1_STATISTICAL = Law(claim="SD-1", technique=TECH, body=law_sd1_statistical, params=("device",),
                      kills=(Kills(ZOO_ALL),))
test_sd1_statistical = SD1_STATISTICAL.conformance_test(
    "test_sd1_statistical",
    doc="""SD-1 for every registered verify: empirical first token, first two tokens and number
    accepted follow the exact distributions, for two dense pairs and three boundary classes
    (G-tests, family-wise false-alarm rate 1e-3 over the whole law, fixed seeds).""")
(test_sd1_zoo_rejected,) = SD1_STATISTICAL.zoo_tests("test_sd1_zoo_rejected")


# --------------------------------------- the statistical law's own error rates, exactly
#: Exact multinomial draws of the whole law under ``ci`` (``benchmarks/bench_speculative.py``
#: makes 20,000): the false-alarm count is judged against binom.ppf(1 − 1e-3, draws, ALPHA).
LAW_DRAWS, POWER_DRAWS = 2000, 1000


@pytest.mark.claim("SD-1")
def test_verifier_outcomes_equal_the_enumeration():
    """The closed form of a round's distribution (speculative_cases.verifier_outcomes, unbiased)
    equals the reference's walk over every path, on the law's pairs and the pinned classes."""
    for pq in (*STAT_CONFIGS.values(), *PINNED):
        a, b = verifier_outcomes(pq.q, pq.p), ref.round_outcomes(pq.q, pq.p)
        err = max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))
        assert err <= EXACT_BOUND, f"{pq!r}: closed form vs enumeration differ by {err:.3g}"


@pytest.mark.claim("SD-1")
def test_sd1_law_false_alarm_rate_exact_draws():
    """The law's family-wise false-alarm rate is at most ALPHA = 1e-3: on 2000 exact draws
    (ci; 20,000 in the report) its false alarms do not exceed binom.ppf(0.999, 2000, 1e-3) = 8.
    That check rejects a law whose real rate is 1e-2 with probability 0.998."""
    k, limit = sd1_law_false_alarms(LAW_DRAWS)
    assert k <= limit, f"{k} false alarms in {LAW_DRAWS} exact draws (limit {limit})"


def test_sd1_law_calibration_rejects_a_law_without_bonferroni():
    """The calibration can fail: the same law with every G-test at ALPHA (no division over the
    24 tests, a family-wise rate near 1e-2) exceeds the limit on the same draws."""
    k, _ = law_rejections(LAW_DRAWS, 0, alpha=ALPHA * len(OUTCOMES) * len(STAT_CONFIGS))
    assert k > law_limit(LAW_DRAWS), f"a law without Bonferroni passed the calibration ({k} false alarms)"


@pytest.mark.claim("SD-1")
@pytest.mark.parametrize("bias", sorted(SUBTLE_BIASES))
def test_sd1_law_power_against_subtle_biases(bias):
    """The law's power against each known-bad verifier of a few percent bias (the zoo's
    acceptance x 0.97, residual mixed 3% toward q, bonus from q 3%), on 1000 exact draws of its
    rounds: at least 0.9 with 99.9% confidence (Clopper-Pearson lower bound), each check's
    rejection rate recorded."""
    k, per_check = law_rejections(POWER_DRAWS, 1, **SUBTLE_BIASES[bias])
    lower = 1 - upper_bound(POWER_DRAWS - k, POWER_DRAWS)
    strong = {c: round(n / POWER_DRAWS, 3) for c, n in sorted(per_check.items(), key=lambda x: -x[1])[:4] if n}
    results.record("SD-1", measured=k / POWER_DRAWS, bound=0.9, unit=f"power of the statistical law against {bias}",
                   rule=f"{POWER_DRAWS} exact draws of the biased rounds, rounds per pair {STAT_SIZES}; "
                        f"99.9% lower bound {lower:.3f} >= 0.9", what=f"strongest checks {strong}",
                   power=k / POWER_DRAWS, power_runs=POWER_DRAWS, draft=bias)
    assert lower >= 0.9, f"power against {bias}: {k}/{POWER_DRAWS} (lower bound {lower:.3f})"


@pytest.mark.parametrize("bias", sorted(SUBTLE_BIASES))
def test_subtle_zoo_entries_follow_their_enumeration(bias):
    """Each of those zoo verifiers emits the distribution verifier_outcomes gives for its bias
    (G-tests at 1e-3 on every pair), so the power stated above is that entry's power."""
    from inference_conformance.conformance import registry

    impl = {i.name: i for i in registry.zoo("speculative")}[bias]
    for name, pq in STAT_CONFIGS.items():
        tokens, n = run_trials(impl, pq, STAT_SIZES[name], seed=5, device="cpu")
        counts = outcome_counts(tokens, n, pq.V, pq.gamma)
        exact = marginals(verifier_outcomes(pq.q, pq.p, **SUBTLE_BIASES[bias]), pq.V, pq.gamma)
        for k in OUTCOMES:
            check_counts(counts[k], exact[k], alpha=ALPHA / len(OUTCOMES) / len(STAT_CONFIGS),
                         what=f"{bias} on {name}: {k} vs its own enumerated distribution").check()


# ------------------------------------------------ SD-1 structure: decisions that are certain
def law_sd1_certain(run, device):
    """Every certain decision (accept when p(x) >= q(x) > 0, reject when p(x) = 0, the only token
    of a one-hot residual or bonus) made in every row, for several rows and γ up to 8."""
    impl = run.impl
    failed = []
    for label, d, q, p, tok, n in certain_cases():
        d_t = torch.tensor(d, dtype=torch.int64, device=device)
        q_t = torch.tensor(q, dtype=torch.float64, device=device)
        p_t = torch.tensor(p, dtype=torch.float64, device=device)
        for seed in range(4):
            tokens, acc = impl(d_t, q_t, p_t, generator=torch.Generator(device=device).manual_seed(seed))
            got_t, got_n = tokens.cpu().tolist(), acc.cpu().tolist()
            if got_t != tok or got_n != n:
                bad = next(b for b in range(len(n)) if got_t[b] != tok[b] or got_n[b] != n[b])
                failed.append(f"{label}, seed {seed}, row {bad}: tokens {got_t[bad]} n {got_n[bad]}, "
                              f"expected tokens {tok[bad]} n {n[bad]}")
                break
    assert not failed, f"{len(failed)} certain case(s) wrong: " + "; ".join(failed[:3])


SD1_CERTAIN = Law(claim="SD-1", technique=TECH, body=law_sd1_certain, params=("device",),
                  kills=(Kills(("accept_fp16", "row0_probs", "long_gamma_bonus")),))
test_sd1_certain_decisions = SD1_CERTAIN.conformance_test("test_sd1_certain_decisions", doc="")
(test_sd1_certain_zoo_rejected,) = SD1_CERTAIN.zoo_tests("test_sd1_certain_zoo_rejected")


#: Small batch, a draft token over-proposed (q(1) = .99 > p(1) = .5): rejected about half the
#: time, and the correction must be token 0, the only one with positive residual.
_SMALL_PINNED = dict(B=8, gamma=1, V=2, q=[[[0.01, 0.99]]] * 8, p=[[[0.5, 0.5], [0.5, 0.5]]] * 8,
                     d=[[1]] * 8)


@st.composite
def _small_batches(draw):
    B, gamma, V = draw(st.integers(1, 8)), draw(st.integers(1, 8)), draw(st.integers(2, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))

    def rows(n):
        r = rng.gamma(0.5, size=(B, n, V)) * (rng.random((B, n, V)) < 0.7)
        r[..., 0] += 1e-3
        return (r / r.sum(-1, keepdims=True)).tolist()

    q = rows(gamma)
    d = [[int(rng.choice(V, p=np.asarray(q[b][i]))) for i in range(gamma)] for b in range(B)]
    return dict(B=B, gamma=gamma, V=V, q=q, p=rows(gamma + 1), d=d)


def _structure_failures(tokens, n, d, q, p, gamma):
    out = []
    for b, (row, k) in enumerate(zip(tokens, n)):
        if not 0 <= k <= gamma or row[:k] != d[b][:k] or any(t != PAD for t in row[k + 1:]):
            out.append(f"row {b}: tokens {row} n {k} vs drafts {d[b]}")
        elif k < gamma:
            resid = [max(0.0, pv - qv) for pv, qv in zip(p[b][k], q[b][k])]
            if sum(resid) > 0 and resid[row[k]] <= 0:
                out.append(f"row {b}: correction {row[k]} at position {k} has residual "
                           f"max(0, p - q) = 0 (p = {p[b][k][row[k]]:.3g}, q = {q[b][k][row[k]]:.3g})")
        elif p[b][gamma][row[gamma]] <= 0:
            out.append(f"row {b}: bonus {row[gamma]} has p[γ] = 0")
    return out


def law_sd1_small_batch_structure(run, device, case):
    """Small batches (B = 1..8), drawn γ: accepted tokens are the drafts, a correction always has
    positive residual, the bonus positive p[γ], padding after; 40 calls per example."""
    impl = run.impl
    d_t = torch.tensor(case["d"], dtype=torch.int64, device=device)
    q_t = torch.tensor(case["q"], dtype=torch.float64, device=device)
    p_t = torch.tensor(case["p"], dtype=torch.float64, device=device)
    gen = torch.Generator(device=device).manual_seed(1)
    for _ in range(40):
        tokens, n = impl(d_t, q_t, p_t, generator=gen)
        bad = _structure_failures(tokens.cpu().tolist(), n.cpu().tolist(), case["d"], case["q"],
                                  case["p"], case["gamma"])
        assert not bad, f"B={case['B']} γ={case['gamma']} V={case['V']}: " + "; ".join(bad[:3])


SD1_SMALL_BATCH = Law(claim="SD-1", technique=TECH, body=law_sd1_small_batch_structure, params=("device",),
                      given={"case": _small_batches()}, examples=(dict(case=_SMALL_PINNED),),
                      kills=(Kills(("small_batch_from_p", "resample_from_p")),))
test_sd1_small_batch_structure = SD1_SMALL_BATCH.conformance_test("test_sd1_small_batch_structure", doc="")
(test_sd1_small_batch_zoo_rejected,) = SD1_SMALL_BATCH.zoo_tests("test_sd1_small_batch_zoo_rejected")


# ---------------------------------------------------------------- extreme ratios, randomness
def _extreme_inputs(B, dtype, device):
    """Position 0 drafts a token with q = 1e-12 and p ~ 1 (always accepted); position 1 drafts a
    token with p = 0 < q (always rejected, the correction from the residual)."""
    q = torch.tensor([[1e-12, 0.5, 0.5 - 1e-12, 0.0], [0.6, 0.2, 0.2 - 1e-7, 1e-7]], dtype=torch.float64)
    p = torch.tensor([[1 - 2e-9, 1e-9, 1e-9, 0.0], [0.0, 0.2, 0.4, 0.4], [0.25, 0.25, 0.25, 0.25]],
                     dtype=torch.float64)
    tok = torch.tensor([[0, 0]]).expand(B, 2).contiguous()
    return (tok.to(device), q.to(dtype)[None].expand(B, -1, -1).contiguous().to(device),
            p.to(dtype)[None].expand(B, -1, -1).contiguous().to(device), q, p)


def _tiny_residual_inputs(B, dtype, device):
    """γ = 1: the draft token has p = 0 and a tiny q (1e-12 in float64, 1e-6 in float32), so it is
    rejected in every round and the residual max(0, p − q) has a single positive entry, of that
    tiny size, at token 1: the correction is token 1 in every round."""
    eps = 1e-12 if dtype == torch.float64 else 1e-6
    q = torch.tensor([[eps, 1 - eps, 0.0, 0.0]], dtype=torch.float64)
    p = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    tok = torch.zeros(B, 1, dtype=torch.int64)
    return (tok.to(device), q.to(dtype)[None].expand(B, -1, -1).contiguous().to(device),
            p.to(dtype)[None].expand(B, -1, -1).contiguous().to(device))


def law_sd1_extreme_ratios(run, device, dtype):
    """q(x) = 1e-12 with p(x) ~ 1 is accepted in every round; p(x) = 0 with q(x) > 0 is rejected
    in every round, and the corrections follow norm(max(0, p − q)) (G-test, α = 1e-3); when that
    residual's whole mass is tiny (p(x) = 0 with q(x) = 1e-12 beside it), it is still normalised:
    the correction is its one token in every round."""
    impl = run.impl

    B = 4000
    tok, qb, pb, q, p = _extreme_inputs(B, dtype, device)
    tokens, n = impl(tok, qb, pb, generator=torch.Generator(device=device).manual_seed(3))
    assert_exact(n.cpu(), torch.ones(B, dtype=torch.int64), what="num_accepted (accept q=1e-12, reject p=0)")
    resid = (p[1] - q[1]).clamp_min(0)
    resid = (resid / resid.sum()).numpy()
    counts = np.bincount(tokens[:, 1].cpu().numpy(), minlength=4)
    check_counts(counts, resid, alpha=ALPHA, what="corrections after rejecting a p = 0 token").check()
    tok, qb, pb = _tiny_residual_inputs(256, dtype, device)
    tokens, n = impl(tok, qb, pb, generator=torch.Generator(device=device).manual_seed(4))
    assert_exact(n.cpu(), torch.zeros(256, dtype=torch.int64), what="num_accepted (reject p = 0 beside a tiny q)")
    assert_exact(tokens[:, 0].cpu(), torch.ones(256, dtype=torch.int64),
                 what="correction drawn from a residual whose only mass is tiny (p − q at token 1)")


SD1_EXTREME = Law(claim="SD-1", technique=TECH, body=law_sd1_extreme_ratios, dtypes=(torch.float64, torch.float32),
                  kills=(Kills(("guarded_division", "tiny_residual_unnormalised"), (torch.float64,)),))
test_sd1_extreme_ratios = SD1_EXTREME.conformance_test("test_sd1_extreme_ratios", doc="")
(test_sd1_extreme_ratios_zoo_rejected,) = SD1_EXTREME.zoo_tests("test_sd1_extreme_ratios_zoo_rejected")


@pytest.mark.technique(TECH)
@pytest.mark.claim("SD-1")
def test_randomness_only_from_generator(impl, device):
    """Two calls with identically seeded generators return identical results whatever the global
    RNG's state; a differently seeded generator changes them; the inputs are left untouched."""
    from inference_conformance.properties.speculative_cases import tensors

    tok, qb, pb = tensors(STAT_CONFIGS["gamma3-V5"], 512, torch.float32, device, seed=11)
    saved = (tok.clone(), qb.clone(), pb.clone())
    torch.manual_seed(1)
    a = impl(tok, qb, pb, generator=torch.Generator(device=device).manual_seed(5))
    torch.manual_seed(2)
    torch.rand(1000)
    b = impl(tok, qb, pb, generator=torch.Generator(device=device).manual_seed(5))
    c = impl(tok, qb, pb, generator=torch.Generator(device=device).manual_seed(6))
    for x, y, what in zip(a, b, ("tokens", "num_accepted")):
        assert_exact(x, y, what=f"{what} of two calls with identically seeded generators")
    assert not torch.equal(a[0], c[0]), "a differently seeded generator gave identical tokens"
    for x, y, what in zip((tok, qb, pb), saved, ("draft_tokens", "draft_probs", "target_probs")):
        assert_exact(x, y, what=f"{what} after the call (inputs must not be mutated)")


# ------------------------------------------------------------------------ SD-4 / SD-6 formulas
@pytest.mark.claim("SD-4")
@pytest.mark.parametrize("alpha", [0.5, 0.69, 0.8, 0.92])
def test_sd4_tokens_per_call_formula_matches_enumeration(alpha):
    """SD-4: when every position accepts with the same α (p, q built so that Σ min(p, q) = α),
    the enumerated expected tokens per round equals (1 − α^(γ+1)) / (1 − α), γ = 1..4, and the
    estimated speedup is that over 1 + γc (:func:`inference_conformance.properties.speculative_claims_cases.check_sd4`)."""
    check_sd4(alpha, ref.tokens_per_call, ref.speedup)


@pytest.mark.claim("SD-6")
def test_sd6_exercise_7_table():
    """SD-6: the speedup formula at α = 0.8, c = 0.05 gives the lecture's table to its printed
    precision, and the best γ is near 8 (:func:`inference_conformance.properties.speculative_claims_cases.check_sd6`)."""
    check_sd6(ref.speedup, ref.best_gamma)


def test_formula_errors():
    with pytest.raises(ValueError, match="alpha"):
        ref.tokens_per_call(1.5, 3)
    with pytest.raises(ValueError, match="gamma"):
        ref.tokens_per_call(0.5, -1)
    with pytest.raises(ValueError, match="c"):
        ref.speedup(0.5, 3, -0.1)


# -------------------------------------------------------------- the small world (SD-5, SD-7)
def _world(dtype):
    from inference_conformance.smallworld.checkpoints import load_model

    return {name: load_model(name, dtype) for name in ("target", "draft_good", "draft_poor")}


def _bos(B):
    from inference_conformance.smallworld.tokenizer import tokenizer

    return torch.full((B, 1), tokenizer().bos_id, dtype=torch.int64)


@pytest.mark.claim("SD-5")
@pytest.mark.parametrize("draft", ["draft_good", "draft_poor"])
def test_sd5_tokens_per_call_on_small_world(draft):
    """SD-5: speculative sampling on the small world (reference verifier, no cache) for γ = 1..10:
    measured α (mean Σ min(p, q) over verified positions) and tokens per target call, recorded
    next to the formula (1 − α^(γ+1)) / (1 − α) at the measured α and the estimated speedup
    tokens per call / (1 + γc), c from the parameter counts (draft / target). The claim is judged
    as written, part by part (rows with ``holds``): the lecture's α and tokens per call within
    the stated tolerances ("not reproduced with the shipped drafts" where not), and "measured
    slightly below the formula" one-sided (not above it beyond sampling noise, z <= 2.326, and
    at most 20% below). The test fails only when measured is more than 20% below the formula:
    a verifier or a round loop that lost tokens."""

    models = _world(torch.float32)
    c = (sum(p.numel() for p in models[draft].parameters())
         / sum(p.numel() for p in models["target"].parameters()))
    by_gamma = {}
    for gamma in SD5_GAMMAS:
        gen = torch.Generator().manual_seed(gamma)
        log = RoundLog(SD5_ROWS, SD5_TOKENS)
        _, st = ref.speculative_generate(models["target"], models[draft], _bos(SD5_ROWS), SD5_TOKENS, gamma,
                                         generator=gen, verify_fn=log)
        assert len(log.emitted) == st["rounds"] and sum(log.emitted) == st["emitted"]
        alpha = ref.overlap_alpha(st)
        tpc = st["emitted"] / st["rounds"]
        formula = ref.tokens_per_call(alpha, gamma)
        by_gamma[gamma] = (alpha, log.emitted, formula)
        results.record("SD-5", measured=tpc, lecture=formula, unit="tokens per target call",
                       rule="measured on the small world; lecture column: the formula at the measured alpha",
                       gamma=gamma, tokens_per_call=tpc, alpha=round(alpha, 3), draft=draft,
                       estimated_speedup=round(tpc / (1 + gamma * c), 3), c_params=round(c, 4),
                       what=f"gamma {gamma}, estimated speedup {tpc / (1 + gamma * c):.2f}x at c = {c:.3f} "
                            f"(parameter counts); tokens per call")
        results.record("SD-5", measured=formula, unit="tokens per target call (formula)",
                       rule="(1 - a^(g+1)) / (1 - a) at the measured alpha",
                       gamma=gamma, tokens_per_call=formula, alpha=round(alpha, 3), draft=f"{draft} (formula)",
                       estimated_speedup=round(ref.speedup(min(alpha, 1.0), gamma, c), 3), c_params=round(c, 4))
    lec = SD5_LECTURE[draft]
    parts = sd5_parts(draft, by_gamma)
    mean_alpha, tokens, far = parts["mean_alpha"], parts["tokens"], parts["far"]
    shipped = "" if parts["alpha_holds"] else " (not reproduced with the shipped drafts)"
    results.record("SD-5", measured=round(mean_alpha, 3), lecture=lec["alpha"], unit="alpha (mean over gamma = 1..10)",
                   draft=draft, alpha=mean_alpha, holds=not shipped,
                   trend_rule=f"{draft}: alpha within {SD5_ALPHA_TOL} of the lecture's {lec['alpha']}{shipped}")
    where = "at gamma = 8" if draft == "draft_good" else "at every gamma >= 4"
    results.record("SD-5", measured={g: round(t, 2) for g, t in tokens.items()}, lecture=lec["tokens"],
                   unit="tokens per target call", draft=draft, holds=not far,
                   trend_rule=f"{draft}: about {lec['tokens']:g} tokens per call {where} (within {SD5_TOKENS_TOL})"
                              + (f"; not reproduced with the shipped drafts at gamma {sorted(far)}" if far else ""))
    z, ratio, detectable = parts["z"], parts["ratio"], parts["detectable"]
    results.record("SD-5", measured=round(ratio, 3), lecture="slightly below the formula", unit="measured / formula (mean over gamma)",
                   rule=f"one-sided: pooled z of measured - formula <= {SD5_Z} (1%) and ratio >= {SD5_LOW}; "
                        f"an excess of {detectable:.1%} is found with probability 0.9",
                   what=f"z = {z:.2f}", draft=draft, holds=parts["below_holds"],
                   trend_rule=f"{draft}: measured not above the formula (z <= {SD5_Z}), at most {1 - SD5_LOW:.0%} below"
                              + ("" if z <= SD5_Z else f"; measured ABOVE the formula (z = {z:.1f}): not reproduced"))
    check_sd5_tokens_kept(draft, by_gamma)


@pytest.mark.claim("SD-7")
@pytest.mark.parametrize("draft", ["draft_good", "draft_poor"])
@pytest.mark.parametrize("gamma", [1, 4])
def test_sd7_greedy_speculative_equals_greedy_target(draft, gamma):
    """SD-7 (exercise 8): greedy speculative decoding emits exactly the tokens of greedy decoding
    with the target, token for token, whatever the draft's quality (float64 models;
    :func:`inference_conformance.properties.speculative_claims_cases.check_sd7`)."""
    models = _world(torch.float64)
    check_sd7(models["target"], models[draft], gamma, draft_name=draft)


@pytest.mark.claim("SD-1")
@pytest.mark.parametrize("verifier", ["reference", "torch", "zoo:accept_q_over_p"])
def test_sd1_end_to_end_small_world(verifier):
    """SD-1 end to end: 3000 speculative generations on the small world (poor draft, γ = 2) emit
    their first two tokens with the target's own distribution (G-test, α = 1e-3, bins below 5
    expected pooled, the critical value from G's exact null distribution by Monte Carlo: the
    chi-square one rejected 2e-3 of correct runs here, tests/test_stats.py); the same run (same seed) with the min(1, q/p) verifier of the zoo is rejected.
    (Resampling from p, a subtler bias, needs more generations than this budget: G = 95 against
    a bound of 171 at 3000.)"""
    from inference_conformance.conformance import registry
    from inference_conformance.smallworld.tokenizer import tokenizer

    impls = {i.name: i for i in registry.builtins("speculative")}
    impls.update({f"zoo:{i.name}": i for i in registry.zoo("speculative")})
    models = _world(torch.float64)
    B, V = 3000, models["target"].cfg.vocab_size
    gen = torch.Generator().manual_seed(21)
    out, _ = ref.speculative_generate(models["target"], models["draft_poor"], _bos(B), 2, 2, generator=gen,
                                      verify_fn=impls[verifier].verify)
    counts = np.bincount((out[:, 1] * V + out[:, 2]).numpy(), minlength=V * V)
    exact = first_two_token_distribution(models["target"], tokenizer().bos_id)
    v = check_counts(counts, exact / exact.sum(), alpha=ALPHA, what=f"first two tokens, verifier {verifier}")
    if verifier.startswith("zoo:"):
        assert not v.ok, f"the end-to-end G-test accepted the known-bad {verifier}: {v.message()}"
    else:
        v.check()
