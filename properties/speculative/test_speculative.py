"""Laws of speculative decoding (claims SD-1, SD-2, SD-4..SD-7; lecture 002 §2, Leviathan et al.
2023). The checks of SD-2 and SD-4..SD-7 are functions of what they judge in
``properties/speculative/claims_cases.py``, shown rejecting known-bad inputs in
``properties/speculative/test_speculative_rejections.py``.

SD-1 is checked two ways. Exactly: the float64 enumerator (``inference_conformance.reference.speculative``) sums every
accept/reject path of repeated rounds, and the distribution of the first emitted token, and of
the first two, must equal the target's to 1e-12 for drawn (p, q) pairs and the pinned boundary
classes (disjoint supports, q = 0 where p > 0, p = q, one-hot, tiny probabilities). On samples,
for every registered ``verify`` (``--impl speculative=module:fn`` ones included): one batch of
independent rounds per fixed (p, q) pair (two dense ones, three boundary classes), four G-tests
per pair (first token, first two, number accepted, (number accepted, last token)) at a stated
family-wise false-alarm rate for the whole law, after exact checks of the output's structure. The bug zoo
(``properties/speculative/zoo.py``) is each shown rejected.
The statistical law's own calibration is in ``properties/speculative/test_speculative_calibration.py``; SD-1,
SD-5 and SD-7 on the small world's checkpoints in ``properties/speculative/test_speculative_small_world.py``.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import note
from hypothesis import strategies as st

from inference_conformance.conformance import results
from inference_conformance.conformance.contracts.speculative import PAD
from inference_conformance.conformance.tolerance import Comparison, report_verdict, assert_exact
from inference_conformance.conformance.laws import Kills, Law
from inference_conformance.properties.speculative.cases import (
    ALPHA,
    EXACT_BOUND,
    PINNED,
    STAT_CONFIGS,
    certain_cases,
    extend,
    pq_pairs,
    sd1_law_verdicts,
)
from inference_conformance.conformance.stats import check_counts
from inference_conformance.properties.speculative.claims_cases import (
    check_sd2,
    check_sd4,
    check_sd6,
)
from inference_conformance.reference import speculative as ref

TECH = "speculative"
ZOO_ALL = ("late_rejection", "resample_from_p", "accept_q_over_p", "continue_after_rejection",
           "drops_bonus_token", "unnormalised_residual", "acceptance_times_097", "residual_toward_q",
           "bonus_from_q")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _exact_verdict(dist, expected, what, accept=ref.accept_min_p_over_q, bound=EXACT_BOUND) -> Comparison:
    err = float(np.abs(np.asarray(dist) - np.asarray(expected)).max())
    return Comparison(err <= bound, f"exact enumeration in float64: max |P - p| <= {bound:g}", err, bound, what)


def sd1_exact(pq, accept=ref.accept_min_p_over_q) -> list[Comparison]:
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
@pytest.mark.suite_own("the exact enumeration, the oracle SD-1's statistical law is calibrated on")
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
@pytest.mark.suite_own("the lecture's worked two-token example")
def test_sd2_two_token_example():
    """SD-2, the two-token proof of CS336 (its notation: q the target, p the draft): a draft
    that over-proposes A (p(A) > q(A)) is accepted on A with probability q(A)/p(A) and always
    on B, and a rejection always yields B: P[A] = q(A), P[B] = q(B), by exact enumeration
    (:func:`inference_conformance.properties.speculative.claims_cases.check_sd2`)."""
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
(test_sd1_zoo_rejected,) = SD1_STATISTICAL.make_zoo_tests("test_sd1_zoo_rejected")


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
(test_sd1_certain_zoo_rejected,) = SD1_CERTAIN.make_zoo_tests("test_sd1_certain_zoo_rejected")


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
(test_sd1_small_batch_zoo_rejected,) = SD1_SMALL_BATCH.make_zoo_tests("test_sd1_small_batch_zoo_rejected")


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
(test_sd1_extreme_ratios_zoo_rejected,) = SD1_EXTREME.make_zoo_tests("test_sd1_extreme_ratios_zoo_rejected")


@pytest.mark.technique(TECH)
@pytest.mark.claim("SD-1")
def test_randomness_only_from_generator(impl, device):
    """Two calls with identically seeded generators return identical results whatever the global
    RNG's state; a differently seeded generator changes them; the inputs are left untouched."""
    from inference_conformance.properties.speculative.cases import tensors

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
@pytest.mark.suite_own("the lecture's tokens-per-call formula against the enumeration")
def test_sd4_tokens_per_call_formula_matches_enumeration(alpha):
    """SD-4: when every position accepts with the same α (p, q built so that Σ min(p, q) = α),
    the enumerated expected tokens per round equals (1 − α^(γ+1)) / (1 − α), γ = 1..4, and the
    estimated speedup is that over 1 + γc (:func:`inference_conformance.properties.speculative.claims_cases.check_sd4`)."""
    check_sd4(alpha, ref.tokens_per_call, ref.speedup)


@pytest.mark.claim("SD-6")
@pytest.mark.suite_own("the lecture's exercise 7 table")
def test_sd6_exercise_7_table():
    """SD-6: the speedup formula at α = 0.8, c = 0.05 gives the lecture's table to its printed
    precision, and the best γ is near 8 (:func:`inference_conformance.properties.speculative.claims_cases.check_sd6`)."""
    check_sd6(ref.speedup, ref.best_gamma)


def test_formula_errors():
    with pytest.raises(ValueError, match="alpha"):
        ref.tokens_per_call(1.5, 3)
    with pytest.raises(ValueError, match="gamma"):
        ref.tokens_per_call(0.5, -1)
    with pytest.raises(ValueError, match="c"):
        ref.speedup(0.5, 3, -0.1)

