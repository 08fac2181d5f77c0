"""The laws of speculative decoding's verification (claim SD-1; lecture 002 §2, Leviathan et al.
2023); the engine's laws are in ``engine.py``.

SD-1 is checked two ways. Exactly: the float64 enumerator (``inference_conformance.reference.speculative``) sums every
accept/reject path of repeated rounds, and the distribution of the first emitted token, and of
the first two, must equal the target's to 1e-12 for drawn (p, q) pairs and the pinned boundary
classes (disjoint supports, q = 0 where p > 0, p = q, one-hot, tiny probabilities). On samples,
for every registered ``verify`` (``--impl speculative=module:fn`` ones included): one batch of
independent rounds per fixed (p, q) pair (two dense ones, three boundary classes), four G-tests
per pair (first token, first two, number accepted, (number accepted, last token)) at a stated
family-wise false-alarm rate for the whole law, after exact checks of the output's structure. The bug zoo
(``properties/speculative/zoo.py``) is each shown rejected.
The statistical law's own calibration is in ``properties/speculative/test_speculative_calibration.py``.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import note
from hypothesis import strategies as st

from inference_conformance.conformance.contracts.speculative import PAD
from inference_conformance.conformance.laws import Kills, Law
from inference_conformance.conformance.stats import check_counts
from inference_conformance.conformance.tolerance import Comparison, assert_exact, report_verdict
from inference_conformance.properties.speculative.cases import (
    ALPHA,
    EXACT_BOUND,
    PINNED,
    certain_cases,
    extend,
    pq_pairs,
    sd1_law_verdicts,
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
                      kills=(Kills(ZOO_ALL),),
    test="test_sd1_statistical",
    doc="""SD-1 for every registered verify: empirical first token, first two tokens and number
    accepted follow the exact distributions, for two dense pairs and three boundary classes
    (G-tests, family-wise false-alarm rate 1e-3 over the whole law, fixed seeds).""",
    zoo_tests=("test_sd1_zoo_rejected",))


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
                  kills=(Kills(("accept_fp16", "row0_probs", "long_gamma_bonus")),),
    test="test_sd1_certain_decisions",
    zoo_tests=("test_sd1_certain_zoo_rejected",))


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
                      kills=(Kills(("small_batch_from_p", "resample_from_p")),),
    test="test_sd1_small_batch_structure",
    zoo_tests=("test_sd1_small_batch_zoo_rejected",))


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
                  kills=(Kills(("guarded_division", "tiny_residual_unnormalised"), (torch.float64,)),),
    test="test_sd1_extreme_ratios",
    zoo_tests=("test_sd1_extreme_ratios_zoo_rejected",))
