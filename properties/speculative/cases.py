"""Inputs and checks shared by the speculative-decoding laws (``properties/speculative/test_speculative.py``).

- :func:`pq_pairs`: the Hypothesis strategy of (q, p) pairs for the exact SD-1 law, with the
  boundary classes the issue names pinned (:data:`PINNED`): disjoint supports, q = 0 where p > 0,
  p = q, one-hot p or q, tiny probabilities.
- :data:`STAT_CONFIGS`: the fixed (q, p) of the statistical law: two dense pairs of
  :data:`STAT_TRIALS` rounds each, sized so that the 0.97-acceptance verifier is rejected, and
  three pinned boundary pairs of :data:`BOUNDARY_TRIALS` (disjoint supports, q = 0 where p > 0,
  tiny probabilities); :data:`STAT_SIZES` maps each to its rounds. Power and false-alarm rate
  are measured by ``benchmarks/speculative/bench_speculative.py::test_sd1_law_calibration``.
- :func:`certain_cases`: inputs whose every accept decision and emitted token is certain.
- :func:`run_trials` / :func:`outcome_counts` / :func:`check_statistically`: one large batch of
  independent rounds through ``verify``, counted into the categories of
  :func:`inference_conformance.reference.speculative.outcome_probabilities`, each compared with a G-test;
  :func:`sd1_law_verdicts`: every pair, the whole law's tests sharing the family-wise
  false-alarm rate :data:`ALPHA` (Bonferroni: α / (4 tests × pairs) each).
- The law's calibration (false-alarm rate and power on exact draws) is in
  ``properties/speculative/calibration_cases.py``; the token trees' cases in
  ``properties/speculative_tree/cases.py``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st

from inference_conformance.conformance.contracts.speculative import PAD
from inference_conformance.conformance.stats import check_counts
from inference_conformance.reference.speculative import outcome_probabilities

#: The exact rule of SD-1: the enumerated distribution equals the target's to this bound (float64).
EXACT_BOUND = 1e-12
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


def normalized(a) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    return a / a.sum(-1, keepdims=True)


def _pq(q_rows, p_rows, label) -> PQ:
    return PQ(normalized(q_rows), normalized(p_rows), label)


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

