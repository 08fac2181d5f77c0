"""Inputs and checks shared by the speculative-decoding laws (``properties/test_speculative.py``).

- :func:`pq_pairs`: the Hypothesis strategy of (q, p) pairs for the exact SD-1 law, with the
  boundary classes the issue names pinned (:data:`PINNED`): disjoint supports, q = 0 where p > 0,
  p = q, one-hot p or q, tiny probabilities.
- :data:`STAT_CONFIGS`: the fixed (q, p) of the statistical law: two dense pairs of
  :data:`STAT_TRIALS` rounds each, sized so that the 0.97-acceptance verifier is rejected, and
  three pinned boundary pairs of :data:`BOUNDARY_TRIALS` (disjoint supports, q = 0 where p > 0,
  tiny probabilities); :data:`STAT_SIZES` maps each to its rounds. Power and false-alarm rate
  are measured by ``benchmarks/bench_speculative.py::test_sd1_law_calibration``.
- :func:`certain_cases`: inputs whose every accept decision and emitted token is certain.
- :func:`run_trials` / :func:`outcome_counts` / :func:`check_statistically`: one large batch of
  independent rounds through ``verify``, counted into the categories of
  :func:`inference_conformance.reference.speculative.outcome_probabilities`, each compared with a G-test;
  :func:`sd1_law_verdicts`: every pair, the whole law's tests sharing the family-wise
  false-alarm rate :data:`ALPHA` (Bonferroni: α / (4 tests × pairs) each).
- :func:`verifier_outcomes` / :func:`law_rejections`: the exact round distribution of a correct
  or slightly biased verifier (:data:`SUBTLE_BIASES`), and the whole law run on exact
  multinomial draws of it: its false-alarm rate (:func:`sd1_law_false_alarms`) and its power.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st

from inference_conformance.conformance.contracts.speculative import PAD
from inference_conformance.conformance import results
from inference_conformance.conformance.stats import GTest, check_counts, multinomial_counts, upper_bound
from inference_conformance.reference.speculative import outcome_probabilities

#: Family-wise false-alarm rate of the whole statistical law on a correct verifier (every pair,
#: all four G-tests per pair).
ALPHA = 1e-3
#: Independent rounds per dense pair (the batch B of one ``verify`` call), and per boundary pair.
STAT_TRIALS, BOUNDARY_TRIALS = 20_000, 8_000
#: Outcome categories compared per check.
OUTCOMES = ("first", "first_two", "num_accepted", "accepted_last")


@dataclass(frozen=True)
class PQ:
    """One fixed pair: ``q`` (γ, V) the draft's and ``p`` (γ+1, V) the target's distributions
    (float64 numpy arrays), and a label."""

    q: np.ndarray
    p: np.ndarray
    label: str = ""

    @property
    def gamma(self) -> int:
        return self.q.shape[0]

    @property
    def V(self) -> int:
        return self.q.shape[1]

    def __repr__(self) -> str:
        return f"PQ({self.label or 'drawn'}, gamma={self.gamma}, V={self.V})"


def _norm(a) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    return a / a.sum(-1, keepdims=True)


def _pq(q_rows, p_rows, label) -> PQ:
    return PQ(_norm(q_rows), _norm(p_rows), label)


#: Rows that each reach one boundary class of SD-1 (V = 4, γ = 2; p has one more row).
PINNED = (
    _pq([[.5, .5, 0, 0], [0, 0, .5, .5]], [[0, 0, .3, .7], [.6, .4, 0, 0], [.25, .25, .25, .25]],
        "disjoint supports"),
    _pq([[.7, .3, 0, 0], [1, 0, 0, 0]], [[.1, .2, .3, .4], [.4, .3, .2, .1], [0, 0, 0, 1]],
        "q = 0 where p > 0"),
    _pq([[.1, .2, .3, .4], [.4, .3, .2, .1]], [[.1, .2, .3, .4], [.4, .3, .2, .1], [.2, .2, .3, .3]],
        "p = q"),
    _pq([[1, 0, 0, 0], [.25, .25, .25, .25]], [[0, 0, 1, 0], [0, 1, 0, 0], [1, 0, 0, 0]],
        "one-hot p and q"),
    _pq([[1 - 3e-12, 1e-12, 1e-12, 1e-12], [1e-12, 1 - 2e-12, 1e-12, 0]],
        [[1e-12, 1 - 2e-12, 1e-12, 0], [0.5, 0.5 - 1e-12, 1e-12, 0], [1e-12, 1e-12, 1 - 2e-12, 0]],
        "tiny probabilities"),
)


@st.composite
def pq_pairs(draw, max_V: int = 5, max_gamma: int = 3) -> PQ:
    """Random (q, p): V in 2..max_V, γ in 1..max_gamma, each row a Dirichlet-like draw with
    some entries zeroed (never all), some rows equal in p and q, some one-hot."""
    V = draw(st.integers(2, max_V))
    gamma = draw(st.integers(1, max_gamma))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)

    def row():
        kind = draw(st.sampled_from(["dense", "sparse", "onehot", "tiny"]))
        if kind == "onehot":
            r = np.zeros(V)
            r[rng.integers(V)] = 1.0
            return r
        r = rng.gamma(0.5, size=V) + 1e-300
        if kind == "sparse":
            r[rng.random(V) < 0.5] = 0.0
            if r.sum() == 0:
                r[rng.integers(V)] = 1.0
        if kind == "tiny":
            r[rng.integers(V)] = 1e-12 * r.sum()
        return r / r.sum()

    q = np.stack([row() for _ in range(gamma)])
    p = np.stack([row() for _ in range(gamma + 1)])
    if draw(st.booleans()):
        i = rng.integers(gamma)
        p[i] = q[i]
    return PQ(q, p, f"drawn seed {seed}")


def extend(pq: PQ, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Position-indexed rows for :func:`inference_conformance.reference.speculative.prefix_distribution` over the first
    ``n`` tokens: the pair's rows, cycled (each row still a distribution)."""
    rows = n - 1 + pq.gamma
    q = np.stack([pq.q[i % pq.gamma] for i in range(rows)])
    p = np.stack([pq.p[i % (pq.gamma + 1)] for i in range(rows + 1)])
    return q, p


#: The statistical law's fixed pairs: two dense ones with α about 0.6-0.8 (so acceptance matters
#: at every position; a zero in q where p > 0 and a zero in p where q > 0), which carry the power
#: against a slightly wrong acceptance, and three of the pinned boundary classes, where a verifier
#: that divides by q, takes a log or drops a tiny mass goes wrong.
STAT_CONFIGS = {
    "gamma3-V5": _pq([[.30, .25, .20, .15, .10], [.05, .10, .15, .30, .40], [.20, .20, .20, .20, .20]],
                     [[.15, .30, .30, .25, 0], [.10, .05, .25, .25, .35], [.40, .15, .15, .10, .20],
                      [.30, .20, .20, .20, .10]], "gamma3-V5"),
    "gamma1-V4": _pq([[.4, .4, .2, 0]], [[.2, .3, .2, .3], [.1, .2, .3, .4]], "gamma1-V4"),
    # rejected 80% of the time, the residual (0, .9375, .0625) far from q on its support
    # (uniform), the bonus row far from q: the pair that carries the power against a slightly
    # wrong residual or bonus (:data:`SUBTLE_BIASES`)
    "gamma1-V3": _pq([[.9, .05, .05]], [[.1, .8, .1], [.05, .05, .9]], "gamma1-V3"),
    **{pq.label: pq for pq in PINNED if pq.label in ("disjoint supports", "q = 0 where p > 0",
                                                     "tiny probabilities")},
}
#: Rounds per pair of :data:`STAT_CONFIGS`.
STAT_SIZES = {name: STAT_TRIALS if name.startswith("gamma") else BOUNDARY_TRIALS for name in STAT_CONFIGS}


def tensors(pq: PQ, B: int, dtype, device, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(draft_tokens (B, γ) sampled from q, draft_probs (B, γ, V), target_probs (B, γ+1, V)):
    B independent rounds of one fixed pair (the probabilities repeated, contiguous)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.tensor(pq.q, dtype=torch.float64)
    p = torch.tensor(pq.p, dtype=torch.float64)
    tok = torch.stack([torch.multinomial(q[i], B, replacement=True, generator=g) for i in range(pq.gamma)], 1)
    qb = q.to(dtype)[None].expand(B, -1, -1).contiguous()
    pb = p.to(dtype)[None].expand(B, -1, -1).contiguous()
    return tok.to(device), qb.to(device), pb.to(device)


def run_trials(impl, pq: PQ, B: int, seed: int, device: str, dtype=torch.float64):
    """One ``verify`` call over B independent rounds; returns (tokens, num_accepted) on the CPU."""
    tok, qb, pb = tensors(pq, B, dtype, device, seed)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    tokens, n = impl(tok, qb, pb, generator=gen)
    return tokens.cpu(), n.cpu()


def check_structure(tokens, num_accepted, draft_tokens, gamma: int) -> None:
    """Exact: shapes and dtypes; ``tokens[:, :n]`` are the draft tokens, index n a real token,
    then −1 padding; 0 <= n <= γ."""
    B = draft_tokens.shape[0]
    assert tuple(tokens.shape) == (B, gamma + 1) and tokens.dtype == torch.int64, \
        f"tokens must be (B, gamma+1) = {(B, gamma + 1)} int64, got {tuple(tokens.shape)} {tokens.dtype}"
    assert tuple(num_accepted.shape) == (B,) and num_accepted.dtype == torch.int64, \
        f"num_accepted must be (B,) = ({B},) int64, got {tuple(num_accepted.shape)} {num_accepted.dtype}"
    n = num_accepted.cpu()
    t = tokens.cpu()
    assert ((n >= 0) & (n <= gamma)).all(), f"num_accepted outside [0, {gamma}]: {n.unique().tolist()}"
    pos = torch.arange(gamma + 1)
    d = torch.cat([draft_tokens.cpu(), torch.full((B, 1), PAD)], 1)
    head = pos < n[:, None]
    bad_head = (head & (t != d)).any(1)
    assert not bad_head.any(), (f"{int(bad_head.sum())} rows: tokens[:, :num_accepted] differ from the draft "
                                f"tokens (row {int(bad_head.nonzero()[0, 0])})")
    last = t.gather(1, n[:, None])[:, 0]
    assert (last >= 0).all(), (f"{int((last < 0).sum())} rows emit no token at index num_accepted "
                               f"(every round emits num_accepted + 1 tokens)")
    tail = pos > n[:, None]
    assert not (tail & (t != PAD)).any(), "tokens past index num_accepted must be -1"


def outcome_counts(tokens, num_accepted, V: int, gamma: int) -> dict[str, np.ndarray]:
    """Counts in the categories of :func:`inference_conformance.reference.speculative.outcome_probabilities`."""
    t = tokens.numpy()
    n = num_accepted.numpy()
    B = t.shape[0]
    t0 = t[:, 0]
    t1 = t[:, 1] if gamma >= 1 else np.full(B, PAD)
    two = np.where(n == 0, t0, V + t0 * V + np.maximum(t1, 0))
    last = t[np.arange(B), n]
    return {
        "first": np.bincount(t0, minlength=V),
        "first_two": np.bincount(two, minlength=V + V * V),
        "num_accepted": np.bincount(n, minlength=gamma + 1),
        "accepted_last": np.bincount(n * V + last, minlength=(gamma + 1) * V),
    }


def check_statistically(impl, pq: PQ, B: int, seed: int, device: str, alpha: float = ALPHA,
                        dtype=torch.float64, what: str = ""):
    """SD-1 on samples: B rounds through ``impl``; the structure exactly, then four G-tests
    (first token, first two, number accepted, (number accepted, last token)) at α/4 each.
    Returns the verdicts (each also reported to the tolerance policy's results)."""
    tok, qb, pb = tensors(pq, B, dtype, device, seed)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    tokens, n = impl(tok, qb, pb, generator=gen)
    check_structure(tokens, n, tok, pq.gamma)
    exact = outcome_probabilities(qb[0].double().cpu().numpy(), pb[0].double().cpu().numpy())
    counts = outcome_counts(tokens.cpu(), n.cpu(), pq.V, pq.gamma)
    return [check_counts(counts[k], exact[k], alpha=alpha / len(OUTCOMES),
                         what=f"{what or pq.label}: {k} over {B} rounds") for k in OUTCOMES]


def _onehot(V, i):
    r = [0.0] * V
    r[i] = 1.0
    return r


def certain_cases():
    """(label, draft_tokens (B, γ), q (B, γ, V), p (B, γ+1, V), expected tokens, expected n):
    inputs whose every accept decision and every correction or bonus token is certain."""
    cases = []
    # p/q = 1 at magnitudes below float16's subnormals: always accepted (bonus from p[1])
    for tiny in (1e-8, 1e-30, 1e-300):
        row = [tiny, 1 - tiny]
        cases.append((f"p/q = 1 at p(x) = q(x) = {tiny:g}", [[0]], [[row]], [[row, _onehot(2, 1)]],
                      [[0, 1]], [1]))
    # row-distinct one-hot p: rows differ in which draft is accepted and which token follows
    B, V = 12, 4
    d, q, p, tok, n = [], [], [], [], []
    for b in range(B):
        x0, x1 = b % V, (b + 1) % V
        d.append([x0, x1])
        q.append([[1 / V] * V, [1 / V] * V])
        if b % 2 == 0:   # both accepted, bonus certain
            p.append([_onehot(V, x0), _onehot(V, x1), _onehot(V, (b + 3) % V)])
            tok.append([x0, x1, (b + 3) % V])
            n.append(2)
        else:            # second rejected (p(x1) = 0), the residual is one-hot on (b+2) % V
            p.append([_onehot(V, x0), _onehot(V, (b + 2) % V), _onehot(V, (b + 3) % V)])
            tok.append([x0, (b + 2) % V, PAD])
            n.append(1)
    cases.append(("row-distinct one-hot p (B = 12, γ = 2)", d, q, p, tok, n))
    # γ = 1..8, q = p one-hot per position (all accepted), p[γ] one-hot elsewhere: the bonus
    V = 10
    for gamma in range(1, 9):
        xs = [(3 * i + 1) % V for i in range(gamma)]
        bonus = (xs[-1] + 5) % V
        rows = [_onehot(V, x) for x in xs]
        cases.append((f"all accepted, bonus from p[γ] (γ = {gamma})", [xs] * 2, [rows] * 2,
                      [rows + [_onehot(V, bonus)]] * 2, [xs + [bonus]] * 2, [gamma] * 2))
    return cases


def sd1_law_verdicts(impl, seed: int, device: str, alpha: float = ALPHA, sizes: dict | None = None):
    """SD-1 on samples over every pair of :data:`STAT_CONFIGS` (rounds :data:`STAT_SIZES`, or
    ``sizes``: {pair name: rounds} for a subset of the pairs at other sizes): the verdicts of all
    the G-tests, whose family-wise false-alarm rate on a correct verifier is at most ``alpha``
    (Bonferroni over pairs and tests)."""
    sizes = STAT_SIZES if sizes is None else sizes
    return [v for i, (name, pq) in enumerate(STAT_CONFIGS.items()) if name in sizes
            for v in check_statistically(impl, pq, sizes[name], seed + 100 * i, device,
                                         alpha / len(sizes))]


def first_two_token_distribution(target, bos_id: int) -> np.ndarray:
    """The target's own distribution of the first two tokens after ``<bos>``, (V·V,) float64:
    p(t1 | bos) · p(t2 | bos, t1), from one forward over every continuation t1."""
    V = target.cfg.vocab_size
    seqs = torch.stack([torch.full((V,), bos_id), torch.arange(V)], 1)              # (V, 2)
    with torch.no_grad():
        logits = target(seqs).double()
    p1 = torch.softmax(logits[0, 0], -1)                                             # (V,)
    p2 = torch.softmax(logits[:, 1], -1)                                             # (V, V): row t1
    return (p1[:, None] * p2).reshape(-1).numpy()


# ------------------------------------------- the statistical law's error rates, exactly
#: The biases of the zoo's verifiers that only the G-tests can see (same support as a correct
#: verifier, so no outcome is impossible): their :func:`verifier_outcomes` parameters.
SUBTLE_BIASES = {"acceptance_times_097": dict(accept_scale=0.97),
                 "residual_toward_q": dict(residual_mix=0.03),
                 "bonus_from_q": dict(bonus_mix=0.03)}


def _mix_on_support(w: np.ndarray, toward: np.ndarray, m: float) -> np.ndarray:
    """(1 − m)·norm(w) + m·norm(toward restricted to w's support); w itself when that is empty."""
    w = w / w.sum()
    t = toward * (w > 0)
    return w if m == 0 or t.sum() <= 0 else (1 - m) * w + m * t / t.sum()


def verifier_outcomes(q_rows, p_rows, *, accept_scale: float = 1.0, residual_mix: float = 0.0,
                      bonus_mix: float = 0.0) -> dict[tuple[int, ...], float]:
    """Exact distribution of one round's emitted tokens for a verifier that accepts x with
    probability ``accept_scale``·min(1, p(x)/q(x)), draws a correction from the residual
    norm(max(0, p − q)) (p where that is 0) mixed a fraction ``residual_mix`` toward q on the
    residual's support, and the bonus from p[γ] mixed a fraction ``bonus_mix`` toward q[γ−1] on
    p[γ]'s support. The defaults are the correct verifier (:func:`inference_conformance.reference.speculative.round_outcomes`
    computes the same by walking every path; this is the closed form for position-independent
    rows: Π_{i<k} q_i(x_i)·a_i(x_i) times the last token's probability)."""
    q = np.asarray(q_rows, dtype=np.float64)
    p = np.asarray(p_rows, dtype=np.float64)
    gamma, V = q.shape
    with np.errstate(divide="ignore", invalid="ignore"):
        accept = np.where(q > 0, q * accept_scale * np.minimum(1.0, p[:gamma] / q), 0.0)     # (γ, V)
    last = []
    for i in range(gamma):
        resid = np.maximum(p[i] - q[i], 0.0)
        resid = _mix_on_support(resid if resid.sum() > 0 else p[i], q[i], residual_mix)
        last.append((1.0 - accept[i].sum()) * resid)
    last.append(_mix_on_support(p[gamma], q[gamma - 1], bonus_mix))
    out: dict[tuple[int, ...], float] = {}
    prefix = np.ones(())
    for k in range(gamma + 1):
        full = np.multiply.outer(prefix, last[k])
        for idx in zip(*np.nonzero(full)):
            out[tuple(int(i) for i in idx)] = float(full[idx])
        if k < gamma:
            prefix = np.multiply.outer(prefix, accept[k])
    return out


def _category_maps(outcomes: dict, V: int, gamma: int) -> dict[str, np.ndarray]:
    """For each of :data:`OUTCOMES`, the category (as :func:`outcome_counts` counts it) of each
    emitted sequence of ``outcomes`` (in its iteration order)."""
    seqs = list(outcomes)
    return {"first": np.array([s[0] for s in seqs]),
            "first_two": np.array([s[0] if len(s) == 1 else V + s[0] * V + s[1] for s in seqs]),
            "num_accepted": np.array([len(s) - 1 for s in seqs]),
            "accepted_last": np.array([(len(s) - 1) * V + s[-1] for s in seqs])}


def marginals(outcomes: dict, V: int, gamma: int) -> dict[str, np.ndarray]:
    """The four outcome distributions of :func:`inference_conformance.reference.speculative.outcome_probabilities`
    from a distribution of emitted sequences."""
    sizes = {"first": V, "first_two": V + V * V, "num_accepted": gamma + 1, "accepted_last": (gamma + 1) * V}
    w = np.array(list(outcomes.values()))
    return {k: np.bincount(c, weights=w, minlength=sizes[k]) for k, c in _category_maps(outcomes, V, gamma).items()}


def law_rejections(draws: int, seed: int, alpha: float = ALPHA, sizes: dict | None = None,
                   **bias) -> tuple[int, dict[str, int]]:
    """The statistical SD-1 law (:func:`sd1_law_verdicts`: every pair of :data:`STAT_CONFIGS` at
    its rounds, or the pairs and rounds of ``sizes``, four G-tests each at α / (4 × pairs)) run
    ``draws`` times on exact multinomial
    draws of the rounds of a verifier with ``bias`` (:func:`verifier_outcomes`; none: a correct
    one). A correct verifier's counts are exactly such draws, so this is the law's false-alarm
    rate (no bias) or its power (a bias), not an estimate from one implementation. Returns
    (draws on which the law rejected, {"pair: outcome": draws that test rejected})."""
    rng = np.random.default_rng(seed)
    any_reject = np.zeros(draws, dtype=bool)
    per_check: dict[str, int] = {}
    sizes = STAT_SIZES if sizes is None else sizes
    for name, pq in STAT_CONFIGS.items():
        if name not in sizes:
            continue
        exact = outcome_probabilities(pq.q, pq.p)
        dist = verifier_outcomes(pq.q, pq.p, **bias)
        maps = _category_maps(dist, pq.V, pq.gamma)
        seq_counts = multinomial_counts(np.array(list(dist.values())), sizes[name], draws, rng)
        for k in OUTCOMES:
            counts = np.zeros((draws, exact[k].size))
            np.add.at(counts.T, maps[k], seq_counts.T)
            test = GTest(exact[k], sizes[name], alpha / len(OUTCOMES) / len(sizes))
            rejected = test.rejects(counts)
            per_check[f"{name}: {k}"] = int(rejected.sum())
            any_reject |= rejected
    return int(any_reject.sum()), per_check


def law_limit(draws: int) -> int:
    """The most false alarms of the law in ``draws`` runs at rate ALPHA (binomial tail 1e-3)."""
    from scipy import stats as sps

    return int(sps.binom.ppf(1 - 1e-3, draws, ALPHA))


def sd1_law_false_alarms(draws: int, seed: int = 0):
    """The statistical SD-1 law's false alarms on ``draws`` exact multinomial draws of a correct
    verifier's rounds, recorded with the limit and the calibration's power against a law whose
    real rate is 1e-2; returns (false alarms, limit)."""
    from scipy import stats as sps

    k, _ = law_rejections(draws, seed)
    limit = law_limit(draws)
    power = float(sps.binom.sf(limit, draws, 1e-2))
    results.record("SD-1", measured=k / draws, bound=ALPHA,
                   unit="false-alarm rate of the statistical law (exact multinomial draws of a correct verifier)",
                   rule=f"{draws} draws of every pair's rounds {STAT_SIZES}; false alarms <= {limit} "
                        f"(binomial tail 1e-3 at rate {ALPHA:g}); power against a rate of 1e-2: {power:.3f}",
                   what=f"99.9% upper bound of the rate {upper_bound(k, draws):.2g}",
                   false_alarms=k, runs=draws, power=power)
    return k, limit


# ======================================================== token trees (SD-11, SD-13; SpecInfer)
@dataclass(frozen=True)
class TreeCase:
    """One token tree and the draft's and target's distributions after every prefix.

    ``parents``: the contract's parent pointers; ``V``: the vocabulary; ``q_table``, ``p_table``
    (P, V) float64: the draft's and the target's distribution after each prefix of length
    0..depth, prefixes numbered level by level (:meth:`prefix_id`); ``label``: the boundary class."""

    parents: tuple
    V: int
    q_table: np.ndarray
    p_table: np.ndarray
    label: str = ""

    @property
    def depth(self) -> int:
        from inference_conformance.conformance.contracts.speculative_tree import depths

        return max(depths(self.parents))

    def prefix_id(self, prefix) -> int:
        """The row of ``prefix`` (a token tuple) in the tables: levels in order, base-V within one."""
        offset = sum(self.V ** k for k in range(len(prefix)))
        code = 0
        for x in prefix:
            code = code * self.V + int(x)
        return offset + code

    def q(self, prefix) -> np.ndarray:
        return self.q_table[self.prefix_id(prefix)]

    def p(self, prefix) -> np.ndarray:
        return self.p_table[self.prefix_id(prefix)]

    def outcomes(self, rule=None) -> dict:
        """The exact distribution of one round's emitted tokens under ``rule`` (default: exact)."""
        from inference_conformance.reference.speculative_tree import EXACT, tree_outcomes

        return tree_outcomes(self.parents, self.q, self.p, self.V, rule or EXACT)

    def __repr__(self) -> str:
        return f"TreeCase({self.label or 'drawn'}, parents={list(self.parents)}, V={self.V})"


def tree_case(parents, V: int, seed: int, kind: str = "dense") -> TreeCase:
    """A :class:`TreeCase` with seeded random rows of one boundary class: ``dense`` (every token
    possible), ``sparse`` (zeros in q and p, never a whole row), ``p=q`` (the draft is the
    target), ``disjoint`` (q and p with disjoint supports at the root), ``onehot-p`` (a
    deterministic target), ``q=0<p`` (the draft never proposes a token the target likes)."""
    from inference_conformance.conformance.contracts.speculative_tree import depths

    rng = np.random.default_rng(seed)
    n_rows = sum(V ** k for k in range(max(depths(parents)) + 1))
    q = rng.gamma(0.6, size=(n_rows, V)) + 1e-3
    p = rng.gamma(0.6, size=(n_rows, V)) + 1e-3
    if kind == "sparse":
        q *= rng.random((n_rows, V)) < 0.7
        p *= rng.random((n_rows, V)) < 0.7
        q[:, 0] += 1e-2
        p[:, -1] += 1e-2
    elif kind == "p=q":
        p = q.copy()
    elif kind == "disjoint":
        half = max(1, V // 2)
        q[0, half:], p[0, :half] = 0.0, 0.0
    elif kind == "onehot-p":
        p = np.eye(V)[rng.integers(V, size=n_rows)]
    elif kind == "q=0<p":
        q[:, -1] = 0.0
    return TreeCase(tuple(parents), V, _norm(q), _norm(p), kind)


TREE_KINDS = ("dense", "sparse", "p=q", "disjoint", "onehot-p", "q=0<p")


@st.composite
def tree_cases(draw, max_nodes: int = 5, max_V: int = 3) -> TreeCase:
    """Random trees (n_nodes in 1..max_nodes, each parent drawn from the root and the earlier
    nodes) and vocabularies V in 2..max_V, with rows of a drawn boundary class."""
    n = draw(st.integers(1, max_nodes))
    parents = tuple(draw(st.integers(-1, i - 1)) for i in range(n))
    V = draw(st.integers(2, max_V))
    return tree_case(parents, V, draw(st.integers(0, 2**31 - 1)), draw(st.sampled_from(TREE_KINDS)))


#: Pinned trees of the exact law: each shape of the contract and every boundary class, plus the
#: deepest chain the enumerator is cheap on.
def _pinned_trees():
    from inference_conformance.conformance.contracts.speculative_tree import SHAPES

    out = [tree_case(shape, 3, i, kind) for i, (shape, kind) in enumerate(zip(SHAPES.values(), TREE_KINDS))]
    out += [tree_case(SHAPES["binary"], 3, 11, TREE_KINDS[4]), tree_case(SHAPES["wide-root"], 2, 12, TREE_KINDS[5]),
            tree_case((-1, 0, 1, 2), 3, 13, "dense")]
    return tuple(out)


PINNED_TREES = _pinned_trees()


def tree_tensors(case: TreeCase, B: int, seed: int, device: str, dtype=torch.float64):
    """B independent rounds of ``case``: node tokens drawn from their parents' q rows (each row
    its own draws), and each node's q and p after its path. Returns (parents (n_nodes,),
    draft_tokens (B, n_nodes), draft_probs, target_probs (B, n_nodes+1, V)) on ``device``."""
    g = torch.Generator().manual_seed(seed)
    Q, P = torch.from_numpy(case.q_table), torch.from_numpy(case.p_table)
    V = case.V
    code = [torch.zeros(B, dtype=torch.int64)]                       # row of each node's prefix; root: 0
    level = [0]
    offsets = [sum(V ** k for k in range(d)) for d in range(case.depth + 2)]
    tokens = []
    for i, par in enumerate(case.parents):
        parent_row = code[par + 1]
        x = torch.multinomial(Q[parent_row], 1, generator=g)[:, 0]
        d = level[par + 1] + 1
        within = (parent_row - offsets[d - 1]) * V + x
        code.append(offsets[d] + within)
        level.append(d)
        tokens.append(x)
    rows = torch.stack(code, 1)                                       # (B, n_nodes+1)
    par = torch.tensor(case.parents, dtype=torch.int64, device=device)
    return (par, torch.stack(tokens, 1).to(device), Q[rows].to(device, dtype), P[rows].to(device, dtype))


def check_tree_structure(parents, tokens, path, draft_tokens) -> None:
    """Exact checks of one ``verify_tree`` result: shapes and dtype, the path a chain of parent
    pointers from the root, its tokens the nodes' tokens, one emitted token after it in [0, V),
    −1 padding after that."""
    from inference_conformance.conformance.contracts.speculative_tree import depths

    par = [int(x) for x in parents.tolist()]
    depth = max(depths(par))
    B = draft_tokens.shape[0]
    assert tokens.dtype == torch.int64 and path.dtype == torch.int64, \
        f"tokens and path must be int64, got {tokens.dtype} and {path.dtype}"
    assert tuple(tokens.shape) == (B, depth + 1) and tuple(path.shape) == (B, depth), \
        f"tokens must be (B, depth+1) = ({B}, {depth + 1}) and path (B, depth), got {tuple(tokens.shape)}, " \
        f"{tuple(path.shape)}"
    pt, tt, dt = path.cpu().numpy(), tokens.cpu().numpy(), draft_tokens.cpu().numpy()
    n = (pt >= 0).sum(1)
    cols = np.arange(depth)
    assert ((pt >= 0) == (cols[None] < n[:, None])).all(), "path: accepted nodes must come first, then -1 padding"
    prev = np.full(B, -1)
    for d in range(depth):
        on = d < n
        node = pt[:, d]
        ok = ~on | (np.asarray(par)[np.clip(node, 0, None)] == prev)
        assert ok.all(), f"path row {int(np.flatnonzero(~ok)[0])}: node {int(node[~ok][0])} is not a child of the " \
                         f"node before it"
        same = ~on | (tt[:, d] == dt[np.arange(B), np.clip(node, 0, None)])
        assert same.all(), f"tokens row {int(np.flatnonzero(~same)[0])}: an accepted token is not its node's token"
        prev = np.where(on, node, prev)
    last = tt[np.arange(B), n]
    assert (last >= 0).all(), "tokens: the emitted token after the path is missing (-1)"
    pad = np.arange(depth + 1)[None] > n[:, None]
    assert (tt[pad] == PAD).all(), "tokens: -1 padding expected after the emitted token"


#: Tree configurations of the statistical SD-11 law: three shapes, dense rows where every
#: acceptance matters, and two boundary classes; rounds per configuration.
TREE_STAT_CONFIGS = {
    "binary-V3": tree_case((-1, -1, 0, 0, 1, 1), 3, 101, "dense"),
    "three-drafts-V3": tree_case((-1, 0, -1, 2, -1, 4), 3, 102, "dense"),
    "wide-root-V4": tree_case((-1, -1, -1, -1, 0, 0, 4), 4, 103, "dense"),
    "disjoint-binary": tree_case((-1, -1, 0, 0, 1, 1), 3, 104, "disjoint"),
    "q=0<p-drafts": tree_case((-1, 0, -1, 2), 3, 105, "q=0<p"),
}
TREE_STAT_TRIALS = {"binary-V3": 20_000, "three-drafts-V3": 20_000, "wide-root-V4": 20_000,
                    "disjoint-binary": 6_000, "q=0<p-drafts": 6_000}


def sequence_categories(outcomes: dict) -> tuple[dict, np.ndarray]:
    """The emitted sequences of ``outcomes`` as categories: ({sequence: index}, probabilities)."""
    keys = sorted(outcomes)
    return {k: i for i, k in enumerate(keys)}, np.array([outcomes[k] for k in keys])


def emitted_counts(tokens, index: dict) -> tuple[np.ndarray, int]:
    """Counts of each emitted sequence (a row of ``tokens`` up to its padding) over ``index``'s
    categories, and the number of rows whose sequence is not among them (impossible outcomes)."""
    counts = np.zeros(len(index))
    impossible = 0
    for row in tokens.cpu().tolist():
        key = tuple(x for x in row if x != PAD)
        i = index.get(key)
        if i is None:
            impossible += 1
        else:
            counts[i] += 1
    return counts, impossible


def tree_law_verdicts(impl, seed: int, device: str, alpha: float = ALPHA):
    """The statistical SD-11 law on ``impl``: per configuration of :data:`TREE_STAT_CONFIGS`, one
    ``verify_tree`` call over its rounds, its structure checked exactly, then one G-test of the
    emitted sequences against the enumeration at alpha / configurations (family-wise ``alpha``)."""
    out = []
    for k, (name, case) in enumerate(TREE_STAT_CONFIGS.items()):
        # the drafts' seed and the verifier's differ: one stream for both would correlate the
        # verifier's uniforms with the draws that made the tokens
        args = tree_tensors(case, TREE_STAT_TRIALS[name], 7919 * (seed + k) + 1, device)
        tokens, path = impl(*args, generator=torch.Generator(device=device).manual_seed(seed + k))
        check_tree_structure(args[0], tokens, path, args[1])
        index, probs = sequence_categories(case.outcomes())
        counts, impossible = emitted_counts(tokens, index)
        if impossible:
            counts = np.append(counts, impossible)
            probs = np.append(probs, 0.0)
        out.append(check_counts(counts, probs / probs.sum(), alpha=alpha / len(TREE_STAT_CONFIGS),
                                what=f"{name}: emitted sequences of {TREE_STAT_TRIALS[name]} rounds vs the exact "
                                     f"enumeration"))
    return out


def tree_law_power(rule, draws: int, seed: int, alpha: float = ALPHA) -> tuple[int, dict[str, int]]:
    """The statistical SD-11 law run ``draws`` times on exact multinomial draws of the rounds of a
    verifier following ``rule`` (a :class:`inference_conformance.reference.speculative_tree.Rule`; the exact one: the
    law's false-alarm rate, a biased one: its power). Returns (draws rejected, per configuration)."""
    rng = np.random.default_rng(seed)
    any_reject = np.zeros(draws, dtype=bool)
    per: dict[str, int] = {}
    for name, case in TREE_STAT_CONFIGS.items():
        index, exact = sequence_categories(case.outcomes())
        biased = case.outcomes(rule)
        keys = sorted(set(biased) | set(index))
        full_exact = np.array([exact[index[k]] if k in index else 0.0 for k in keys])
        full_biased = np.array([biased.get(k, 0.0) for k in keys])
        n = TREE_STAT_TRIALS[name]
        counts = multinomial_counts(full_biased, n, draws, rng)
        rejected = GTest(full_exact / full_exact.sum(), n, alpha / len(TREE_STAT_CONFIGS)).rejects(counts)
        per[name] = int(rejected.sum())
        any_reject |= rejected
    return int(any_reject.sum()), per
