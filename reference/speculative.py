"""Speculative decoding, the naive float64 reference (lecture 002 §2; Leviathan et al. 2023).

- :func:`verify`: the ``speculative`` contract's accept/reject rule, one row and one position at a
  time: accept draft token x with probability min(1, p(x)/q(x)); at the first rejection emit a
  token from the residual norm(max(0, p − q)); when all γ are accepted emit the bonus token from
  the last p. All arithmetic in float64 on the host, all randomness from ``generator``.
- :func:`verify_greedy`: the greedy variant (accept while the draft token is the target's argmax).
- :func:`round_outcomes`: the exact enumerator: every accept/reject path of one round, summed in
  float64, giving the probability of every emitted sequence (small V and γ only).
- :func:`prefix_distribution`: the exact distribution of the first ``n`` emitted tokens when
  rounds repeat (SD-1: it equals the product of the target's distributions).
- :func:`tokens_per_call`, :func:`speedup`, :func:`best_gamma`: the formulas of SD-4/SD-6.
"""
from __future__ import annotations

import bisect
import itertools
import math
from typing import Callable

import numpy as np
import torch

from inference_conformance.conformance.contracts.speculative import PAD, validate


def _sample(weights: list[float], u: float) -> int:
    """Inverse-CDF sample of ``weights`` (normalised here) with a uniform ``u`` in [0, 1)."""
    cum = list(itertools.accumulate(weights))
    total = cum[-1]
    i = bisect.bisect_right(cum, u * total)
    if i >= len(cum):                       # u * total rounded up to total: the last positive weight
        i = max(j for j, w in enumerate(weights) if w > 0)
    return i


def verify(draft_tokens, draft_probs, target_probs, *, generator):
    """The ``speculative`` contract (``conformance/contracts/speculative.py``), naively.

    Per row b and position i in order: draw u ~ U[0, 1) and accept x = draft_tokens[b, i] iff
    u · q_i(x) < p_i(x) (that is, with probability min(1, p/q), no division); at the first
    rejection sample the correction from max(0, p_i − q_i) (normalised); after γ acceptances
    sample the bonus from p_γ. Uniforms come from ``generator``: (B, γ) acceptance draws, then
    (B,) draws for the last token. Returns (tokens (B, γ+1) int64, num_accepted (B,) int64).
    """
    shape = validate(draft_tokens, draft_probs, target_probs, generator)
    B, gamma = shape.B, shape.gamma
    dev = draft_tokens.device
    u_accept = torch.rand((B, gamma), generator=generator, dtype=torch.float64, device=dev).cpu().tolist()
    u_last = torch.rand((B,), generator=generator, dtype=torch.float64, device=dev).cpu().tolist()
    q_all = draft_probs.detach().to("cpu", torch.float64).tolist()
    p_all = target_probs.detach().to("cpu", torch.float64).tolist()
    x_all = draft_tokens.detach().cpu().tolist()
    tokens = [[PAD] * (gamma + 1) for _ in range(B)]
    accepted = [0] * B
    for b in range(B):
        for i in range(gamma):
            x = x_all[b][i]
            q, p = q_all[b][i], p_all[b][i]
            if u_accept[b][i] * q[x] < p[x]:
                tokens[b][i] = x
                accepted[b] += 1
                continue
            residual = [max(0.0, pv - qv) for pv, qv in zip(p, q)]
            tokens[b][i] = _sample(residual if sum(residual) > 0 else p, u_last[b])
            break
        else:
            tokens[b][gamma] = _sample(p_all[b][gamma], u_last[b])
    return (torch.tensor(tokens, dtype=torch.int64, device=dev),
            torch.tensor(accepted, dtype=torch.int64, device=dev))


def verify_greedy(draft_tokens, target_probs):
    """Greedy verification (temperature 0): accept draft tokens while each equals the target's
    argmax at its position, then emit the target's argmax at the first mismatch (or at the
    bonus position). Returns (tokens (B, γ+1) int64 with −1 padding, num_accepted (B,) int64).
    Ties are broken towards the lowest token id (``torch.argmax``)."""
    best = target_probs.argmax(-1)                                   # (B, γ+1)
    B, gamma = draft_tokens.shape
    tokens = torch.full((B, gamma + 1), PAD, dtype=torch.int64, device=draft_tokens.device)
    accepted = torch.zeros(B, dtype=torch.int64, device=draft_tokens.device)
    for b in range(B):
        n = 0
        while n < gamma and int(draft_tokens[b, n]) == int(best[b, n]):
            tokens[b, n] = draft_tokens[b, n]
            n += 1
        tokens[b, n] = best[b, n]
        accepted[b] = n
    return tokens, accepted


# ------------------------------------------------------------------ exact enumeration (float64)
def accept_min_p_over_q(p: float, q: float) -> float:
    """The speculative-sampling acceptance probability min(1, p/q) (q > 0)."""
    return min(1.0, p / q)


def round_outcomes(q_rows, p_rows, accept: Callable[[float, float], float] = accept_min_p_over_q
                   ) -> dict[tuple[int, ...], float]:
    """Exact distribution of what one verification round emits, for small V and γ.

    ``q_rows`` (γ, V), ``p_rows`` (γ+1, V): the draft's and the target's distributions at each
    position (array-likes of probabilities, converted to float64). Sums over every draft token
    x_i ~ q_i and every accept/reject path: position i accepts x with probability
    ``accept(p_i(x), q_i(x))``; a rejection (total probability Σ_x q_i(x)(1 − accept)) emits y
    with probability norm(max(0, p_i − q_i))(y); after γ acceptances the bonus y ~ p_γ.
    Returns {emitted tuple (length 1..γ+1): probability}; the number accepted is its length − 1.
    """
    q = np.asarray(q_rows, dtype=np.float64)
    p = np.asarray(p_rows, dtype=np.float64)
    gamma, V = q.shape
    out: dict[tuple[int, ...], float] = {}

    def walk(i: int, prefix: tuple[int, ...], prob: float) -> None:
        if prob == 0.0:
            return
        if i == gamma:
            for y in range(V):
                if p[gamma, y] > 0:
                    out[prefix + (y,)] = out.get(prefix + (y,), 0.0) + prob * p[gamma, y]
            return
        reject = 0.0
        for x in range(V):
            if q[i, x] > 0:
                a = accept(p[i, x], q[i, x])
                walk(i + 1, prefix + (x,), prob * q[i, x] * a)
                reject += q[i, x] * (1.0 - a)
        residual = np.maximum(p[i] - q[i], 0.0)
        if reject > 0 and residual.sum() > 0:
            residual = residual / residual.sum()
            for y in range(V):
                if residual[y] > 0:
                    key = prefix + (y,)
                    out[key] = out.get(key, 0.0) + prob * reject * residual[y]

    walk(0, (), 1.0)
    return out


def prefix_distribution(q_rows, p_rows, gamma: int, n: int,
                        accept: Callable[[float, float], float] = accept_min_p_over_q) -> np.ndarray:
    """Exact distribution of the first ``n`` tokens emitted by repeated rounds, (V,)*n float64.

    Position-indexed distributions (each independent of the tokens before it): ``q_rows``
    (P, V), ``p_rows`` (P+1, V) with P >= n - 1 + γ. A round that starts at position s drafts
    from q_rows[s:s+γ] and verifies against p_rows[s:s+γ+1]; the next round starts after the
    tokens it emitted. SD-1 says the result is p_rows[0] ⊗ ... ⊗ p_rows[n-1].
    """
    q = np.asarray(q_rows, dtype=np.float64)
    p = np.asarray(p_rows, dtype=np.float64)
    V = q.shape[1]
    if q.shape[0] < n - 1 + gamma or p.shape[0] < q.shape[0] + 1:
        raise ValueError(f"q_rows needs >= n - 1 + gamma = {n - 1 + gamma} rows and p_rows one more, "
                         f"got {q.shape[0]} and {p.shape[0]}")

    def dist(s: int, m: int) -> np.ndarray:
        res = np.zeros((V,) * m)
        for seq, prob in round_outcomes(q[s:s + gamma], p[s:s + gamma + 1], accept).items():
            if len(seq) >= m:
                res[seq[:m]] += prob
            else:
                res[seq] += prob * dist(s + len(seq), m - len(seq))
        return res

    return dist(0, n)


def outcome_probabilities(q_rows, p_rows) -> dict[str, np.ndarray]:
    """The exact distributions the statistical laws compare with, for one round:

    - ``first`` (V,): the first emitted token;
    - ``first_two`` (V + V²,): category t0 for "t0 then the round ends", V + t0·V + t1 for
      "t0 then t1";
    - ``num_accepted`` (γ+1,);
    - ``accepted_last`` ((γ+1)·V,): category n·V + y for "n accepted, then y emitted".
    """
    q = np.asarray(q_rows, dtype=np.float64)
    gamma, V = q.shape
    first = np.zeros(V)
    two = np.zeros(V + V * V)
    acc = np.zeros(gamma + 1)
    last = np.zeros((gamma + 1) * V)
    for seq, prob in round_outcomes(q_rows, p_rows).items():
        first[seq[0]] += prob
        two[seq[0] if len(seq) == 1 else V + seq[0] * V + seq[1]] += prob
        acc[len(seq) - 1] += prob
        last[(len(seq) - 1) * V + seq[-1]] += prob
    return {"first": first, "first_two": two, "num_accepted": acc, "accepted_last": last}


def expected_acceptance(q_row, p_row) -> float:
    """α of one position: P(accept) = Σ_x min(p(x), q(x)) = 1 − TV(p, q) (Leviathan et al., §3.1)."""
    return float(np.minimum(np.asarray(q_row, np.float64), np.asarray(p_row, np.float64)).sum())


# ---------------------------------------------------------------------- SD-4 / SD-6 formulas
def tokens_per_call(alpha: float, gamma: int) -> float:
    """SD-4: expected tokens emitted per target call, (1 − α^(γ+1)) / (1 − α), for an i.i.d.
    acceptance rate α in [0, 1] (γ + 1 at α = 1). Raises ValueError outside [0, 1] or γ < 0."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    if alpha == 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def speedup(alpha: float, gamma: int, c: float) -> float:
    """SD-4: estimated wall-clock speedup over target-only decoding, tokens_per_call / (1 + γc),
    where c is the cost of one draft step relative to one target step (c >= 0)."""
    if c < 0 or not math.isfinite(c):
        raise ValueError(f"c (draft cost / target cost) must be finite and >= 0, got {c}")
    return tokens_per_call(alpha, gamma) / (1.0 + gamma * c)


def best_gamma(alpha: float, c: float, max_gamma: int = 64) -> int:
    """The γ in 1..max_gamma that maximises :func:`speedup` (SD-6; the smallest on ties)."""
    return max(range(1, max_gamma + 1), key=lambda g: (speedup(alpha, g, c), -g))


# ------------------------------------------------- speculative generation without a cache
@torch.no_grad()
def speculative_generate(target, draft, prompt: torch.Tensor, max_new_tokens: int, gamma: int, *,
                         greedy: bool = False, generator: torch.Generator | None = None, verify_fn=None):
    """Speculative decoding by recomputation (no KV cache): the oracle of the engines.

    ``target``, ``draft``: :class:`inference_conformance.reference.transformer.Transformer` over one vocabulary;
    ``prompt`` (B, S) int64 (one length for every row). Each round the draft proposes γ tokens
    (sampled from its softmax, or its argmax when ``greedy``), the target scores the γ + 1
    positions in one forward, and ``verify_fn(draft_tokens, draft_probs, target_probs, *,
    generator)`` (default :func:`verify`; :func:`verify_greedy` when ``greedy``; a given one is
    called in greedy mode too, on the argmax drafts, with a fresh generator when none is given)
    keeps a prefix; rows advance by num_accepted + 1. Sequences are kept
    right-padded in one buffer: with causal attention the padding never reaches a real position.
    Stops when every row has ``max_new_tokens`` new tokens; a finished row stops advancing
    (S + max_new_tokens + 2γ + 1 must fit the models' max_seq_len).

    Returns (tokens (B, S + max_new_tokens) int64, stats) where stats has ``rounds`` (target
    calls per row), ``accepted`` and ``drafted`` (draft tokens accepted / proposed) and
    ``emitted`` (tokens emitted), ``rejections`` (rounds that stopped before γ), each counted
    over the rounds a row was still generating, and ``overlap_sum`` / ``overlap_count``: the
    sum and number of Σ_x min(p(x), q(x)) over the positions verified (:func:`overlap_alpha`).
    """
    if gamma < 1:
        raise ValueError(f"gamma must be >= 1, got {gamma}")
    B, S = prompt.shape
    total = S + max_new_tokens + 2 * gamma + 1
    limit = min(target.cfg.max_seq_len, draft.cfg.max_seq_len)
    if total > limit:
        raise ValueError(f"prompt length + max_new_tokens + 2 gamma + 1 = {total} exceeds max_seq_len {limit}")
    dev = prompt.device
    buf = torch.zeros(B, total, dtype=torch.int64, device=dev)
    buf[:, :S] = prompt
    lengths = torch.full((B,), S, dtype=torch.int64, device=dev)
    rows = torch.arange(B, device=dev)
    stats = {"rounds": 0, "accepted": 0, "drafted": 0, "emitted": 0, "rejections": 0,
             "overlap_sum": 0.0, "overlap_count": 0}
    verify_fn = verify_fn or (None if greedy else verify)
    while bool((lengths < S + max_new_tokens).any()):
        active = lengths < S + max_new_tokens
        q_rows = []
        for i in range(gamma):
            span = int(lengths.max()) + i
            logits = draft(buf[:, :span])[rows, lengths + i - 1].double()            # (B, V)
            q = torch.softmax(logits, -1)
            x = logits.argmax(-1) if greedy else torch.multinomial(q, 1, generator=generator)[:, 0]
            buf[rows, lengths + i] = x
            q_rows.append(q)
        span = int(lengths.max()) + gamma
        logits = target(buf[:, :span]).double()                                      # (B, span, V)
        pos = lengths[:, None] - 1 + torch.arange(gamma + 1, device=dev)             # (B, γ+1)
        p = torch.softmax(logits[rows[:, None], pos], -1)                            # (B, γ+1, V)
        draft_tokens = buf[rows[:, None], pos[:, 1:]]                                # (B, γ)
        if greedy and verify_fn is None:
            tokens, n = verify_greedy(draft_tokens, p)
        elif greedy:                   # the contract takes a generator; greedy verification draws nothing
            tokens, n = verify_fn(draft_tokens, torch.stack(q_rows, 1), p,
                                  generator=generator if generator is not None else torch.Generator(device=dev))
        else:
            tokens, n = verify_fn(draft_tokens, torch.stack(q_rows, 1), p, generator=generator)
        for b in range(B):
            if not bool(active[b]):
                continue
            k = int(n[b]) + 1
            buf[b, int(lengths[b]):int(lengths[b]) + k] = tokens[b, :k]
            buf[b, int(lengths[b]) + k:] = 0
        a = active.to(torch.int64)
        q_all = torch.stack(q_rows, 1)                                               # (B, γ, V)
        overlap = torch.minimum(p[:, :gamma], q_all).sum(-1)                         # (B, γ): Σ min(p, q)
        verified = (torch.arange(gamma, device=dev)[None] <= n[:, None]) & active[:, None]
        stats["overlap_sum"] += float(overlap[verified].sum())
        stats["overlap_count"] += int(verified.sum())
        stats["rounds"] += int(a.sum())
        stats["accepted"] += int((n * a).sum())
        stats["rejections"] += int(((n < gamma).to(torch.int64) * a).sum())
        stats["drafted"] += gamma * int(a.sum())
        stats["emitted"] += int(((n + 1) * a).sum())
        lengths = lengths + (n + 1) * a
    return buf[:, :S + max_new_tokens], stats


def overlap_alpha(stats: dict) -> float:
    """α as Leviathan et al. define it, E[Σ_x min(p(x), q(x))], averaged over the positions
    the rounds of :func:`speculative_generate` verified."""
    return stats["overlap_sum"] / max(1, stats["overlap_count"])


def measured_alpha(stats: dict) -> float:
    """α estimated from rounds (maximum likelihood for i.i.d. acceptances): accepted draft tokens
    / (accepted + rejections), a rejection being a round that stopped before γ."""
    return stats["accepted"] / max(1, stats["accepted"] + stats["rejections"])


# ------------------------------------------------ sampling settings (target and draft alike)
def process_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
                   ) -> torch.Tensor:
    """The sampling distribution of ``logits`` (..., V) under temperature, top-k and top-p, in
    the logits' dtype: softmax(logits / temperature), then only the ``top_k`` most probable
    tokens kept (0: all; ties with the k-th are kept), then only the smallest set of most
    probable tokens whose mass reaches ``top_p`` (a token is kept when the mass of the tokens
    before it, in decreasing order, is below ``top_p``; 1: all), renormalised.

    Speculative decoding applies the same processing to the target (p) and the draft (q) before
    verification, so the emitted tokens follow the processed target distribution. Raises
    ValueError for temperature <= 0 (greedy is argmax, not a distribution), top_k < 0, or top_p
    outside (0, 1].
    """
    if not temperature > 0 or not math.isfinite(temperature):
        raise ValueError(f"temperature must be finite and > 0 for a sampling distribution, got {temperature}")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0: no truncation), got {top_k!r}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must lie in (0, 1], got {top_p}")
    probs = torch.softmax(logits / temperature, dim=-1)
    if 0 < top_k < probs.shape[-1]:
        kth = probs.topk(top_k, dim=-1).values[..., -1:]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(-1, keepdim=True)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
        cum = sorted_p.cumsum(-1)
        before = torch.cat([torch.zeros_like(cum[..., :1]), cum[..., :-1]], -1)  # mass of the tokens ahead
        keep_sorted = before < top_p
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = torch.where(keep, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def implementations():
    """The speculative verifier reference (one sequence at a time, the paper's loop)."""
    from inference_conformance.conformance.registry import builtin

    return (builtin("speculative", "reference", verify),)
