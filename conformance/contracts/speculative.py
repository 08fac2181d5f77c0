"""The ``speculative`` contract: the verification step of speculative decoding.

    verify(draft_tokens, draft_probs, target_probs, *, generator) -> (tokens, num_accepted)

One round of speculative sampling (Leviathan et al. 2023, Chen et al. 2023; lecture 002 §2, the
modified rejection sampling): a draft model has proposed γ tokens, the target model has scored
them in one forward, and ``verify`` decides which to keep.

Arguments (B sequences, γ draft tokens per round, V vocabulary):

- ``draft_tokens`` (B, γ) int64, γ >= 1: token ``i`` of row ``b`` was sampled from
  ``draft_probs[b, i]``; each lies in [0, V) and has q > 0 there.
- ``draft_probs`` (B, γ, V) float: the draft's distribution q at each draft position.
- ``target_probs`` (B, γ+1, V) float: the target's distribution p at each draft position and at
  the bonus position after the last draft token. Both probability tensors are non-negative,
  finite, of one floating dtype (float64, float32, float16, bfloat16), on one device, and each
  row sums to 1 (within 1e-9 in float64, 1e-5 in float32, 1e-2 in 16-bit); any strides.
- ``generator``: a ``torch.Generator`` on the tensors' device, the only source of randomness: two
  calls with identically seeded generators return identical results, whatever the global RNG.

Returns ``tokens`` (B, γ+1) int64 on the inputs' device: the accepted draft tokens
``draft_tokens[b, :n]`` (n = ``num_accepted[b]``), then one more token at index n: at the first
rejection the correction sampled from norm(max(0, p − q)) at that position, or, when all γ are
accepted, the bonus token sampled from ``target_probs[b, γ]``; then −1 padding. And
``num_accepted`` (B,) int64 in [0, γ]. Draft token x at position i is accepted with probability
min(1, p_i(x) / q_i(x)), positions in order, stopping at the first rejection.

The law this buys (SD-1): every emitted token follows the target's distribution p exactly, for any
draft q. Unspecified: the order in which the generator's numbers are drawn (implementations need
not agree bit for bit), and the correction's distribution where max(0, p − q) is zero everywhere
(p = q; a rejection then has probability 0 and any fallback is allowed).

Errors (:func:`validate`, before anything is computed): TypeError for a non-tensor, draft_tokens
not int64, probabilities not floating or of two dtypes, a generator that is not a
``torch.Generator``; ValueError for wrong ranks or sizes (γ >= 1, V >= 1, target_probs one
position longer than draft_probs), mixed devices or a generator on another device, a token
outside [0, V), a draft token whose q is 0, negative or non-finite probabilities, or a row whose
sum is not 1. Each message names the argument. An implementation may raise
``NotImplementedError`` for a dtype or size it does not support ("unsupported", never a pass).

Sources: Leviathan, Kalman, Matias 2023 (Fast inference from transformers via speculative
decoding, Algorithm 1 and Theorem 1); Chen et al. 2023 (Accelerating LLM decoding with
speculative sampling); lecture 002 §2 (second lecture), CS336 lecture 10. Claims: SD-1, SD-2,
SD-4..SD-6 (CLAIMS.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from inference_conformance.conformance.registry import Contract, InvalidCall

#: Dtypes of the probability tensors.
DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
#: Dtype of draft_tokens and of the outputs.
TOKEN_DTYPE = torch.int64
#: Padding of ``tokens`` after the last emitted token.
PAD = -1
#: How far a probability row's sum may be from 1, per dtype.
SUM_TOL = {torch.float64: 1e-9, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


@dataclass(frozen=True)
class VerifyShape:
    """The sizes of one call: batch B, draft tokens per round γ (``gamma``), vocabulary V."""

    B: int
    gamma: int
    V: int


def check_types(draft_tokens, draft_probs, target_probs, generator, *, contract: str = "speculative",
                tokens_shape: str = "(B, gamma)") -> None:
    """TypeError naming the argument unless the three are tensors, ``draft_tokens`` int64, the
    probabilities of one dtype of DTYPES, and ``generator`` a torch.Generator. Shared by this
    contract and the token-tree one (``contract``, ``tokens_shape``: their words in the message)."""
    for name, t in (("draft_tokens", draft_tokens), ("draft_probs", draft_probs),
                    ("target_probs", target_probs)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if draft_tokens.dtype != TOKEN_DTYPE:
        raise TypeError(f"draft_tokens must be int64 {tokens_shape}, got {draft_tokens.dtype}")
    for name, t in (("draft_probs", draft_probs), ("target_probs", target_probs)):
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; the {contract} contract takes "
                            f"{[str(d).replace('torch.', '') for d in DTYPES]}")
    if draft_probs.dtype != target_probs.dtype:
        raise TypeError(f"draft_probs and target_probs must share one dtype, got {draft_probs.dtype} "
                        f"and {target_probs.dtype}")
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator (the only source of randomness), "
                        f"got {type(generator).__name__}")


def check_tokens_and_probs(draft_tokens, draft_probs, target_probs, V: int) -> torch.Tensor:
    """ValueError unless every draft token lies in [0, V) and every row of ``draft_probs`` /
    ``target_probs`` is a finite, non-negative distribution summing to 1 (within SUM_TOL of its
    dtype); the message names the argument and the first offending index. Returns the draft
    tokens on the CPU. Shared by this contract and the token-tree one."""
    tok = draft_tokens.detach().to("cpu")
    bad = ((tok < 0) | (tok >= V)).nonzero()
    if bad.numel():
        b, i = (int(x) for x in bad[0])
        raise ValueError(f"draft_tokens[{b}, {i}] = {int(tok[b, i])} lies outside the vocabulary [0, V) = [0, {V})")
    tol = SUM_TOL[draft_probs.dtype]
    for name, t in (("draft_probs", draft_probs), ("target_probs", target_probs)):
        x = t.detach().to("cpu", torch.float64)
        if not torch.isfinite(x).all():
            raise ValueError(f"{name} must be finite (probabilities), found NaN or inf")
        if (x < 0).any():
            idx = tuple(int(i) for i in (x < 0).nonzero()[0])
            raise ValueError(f"{name} must be non-negative (probabilities); {name}{list(idx)} = {float(x[idx]):.3g}")
        err = (x.sum(-1) - 1.0).abs()
        if (err > tol).any():
            b, i = (int(v) for v in (err > tol).nonzero()[0])
            raise ValueError(f"{name}[{b}, {i}] sums to {float(x[b, i].sum()):.12g}; each row must be a "
                             f"distribution summing to 1 (within {tol:g} in {str(t.dtype).replace('torch.', '')})")
    return tok


def validate(draft_tokens, draft_probs, target_probs, generator) -> VerifyShape:
    """Check one ``verify`` call against the contract; return its sizes.

    Raises TypeError or ValueError naming the argument (see the module docstring). Reads the
    tensors on the host (one synchronisation on CUDA).
    """
    check_types(draft_tokens, draft_probs, target_probs, generator)
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must have 2 dimensions (B, gamma), got shape {tuple(draft_tokens.shape)}")
    if draft_probs.dim() != 3:
        raise ValueError(f"draft_probs must have 3 dimensions (B, gamma, V), got shape {tuple(draft_probs.shape)}")
    if target_probs.dim() != 3:
        raise ValueError(f"target_probs must have 3 dimensions (B, gamma+1, V), got shape "
                         f"{tuple(target_probs.shape)}")
    B, gamma = draft_tokens.shape
    if B < 1 or gamma < 1:
        raise ValueError(f"draft_tokens must hold B >= 1 rows of gamma >= 1 tokens, got shape "
                         f"{tuple(draft_tokens.shape)}")
    V = draft_probs.shape[-1]
    if V < 1:
        raise ValueError(f"draft_probs must have a vocabulary V >= 1, got shape {tuple(draft_probs.shape)}")
    if tuple(draft_probs.shape) != (B, gamma, V):
        raise ValueError(f"draft_probs must have shape (B, gamma, V) = ({B}, {gamma}, V), got "
                         f"{tuple(draft_probs.shape)}")
    if tuple(target_probs.shape) != (B, gamma + 1, V):
        raise ValueError(f"target_probs must have shape (B, gamma+1, V) = ({B}, {gamma + 1}, {V}), got "
                         f"{tuple(target_probs.shape)}")
    dev = draft_tokens.device
    for name, t in (("draft_probs", draft_probs), ("target_probs", target_probs)):
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device}, draft_tokens on {dev}: all tensors must be on one device")
    if generator.device.type != dev.type:
        raise ValueError(f"generator is on {generator.device}, the tensors on {dev}: pass a torch.Generator "
                         f"on the tensors' device")
    tok = check_tokens_and_probs(draft_tokens, draft_probs, target_probs, V)
    q_x = draft_probs.detach().to("cpu").gather(-1, tok[..., None])[..., 0]
    zero = (q_x == 0).nonzero()
    if zero.numel():
        b, i = (int(x) for x in zero[0])
        raise ValueError(f"draft_tokens[{b}, {i}] = {int(tok[b, i])} has draft probability "
                         f"draft_probs[{b}, {i}, {int(tok[b, i])}] = 0: a draft token is sampled from q, so q > 0")
    return VerifyShape(B, gamma, V)


def random_distributions(shape, generator: torch.Generator, *, sharp: float = 1.0) -> torch.Tensor:
    """Random float64 distributions of ``shape`` (..., V) on the CPU: softmax of Gaussian logits
    scaled by ``sharp`` (larger is peakier)."""
    logits = torch.randn(shape, generator=generator, dtype=torch.float64) * sharp
    return torch.softmax(logits, dim=-1)


def cases(seed: int, device: str) -> list[tuple[tuple, dict]]:
    """Small valid calls for the checks every contract gets (no input mutation, outputs
    written, identical repeats with identically seeded generators): float64 with a real
    vocabulary size, float32 with γ = 1, float16 and bfloat16, a batch whose drafts equal the
    target in one row and are disjoint from it in another."""
    out = []
    for i, (B, gamma, V, dt) in enumerate([(3, 4, 257, torch.float64), (5, 1, 8, torch.float32),
                                           (2, 3, 50, torch.float16), (4, 2, 16, torch.bfloat16)]):
        g = torch.Generator().manual_seed(1000 * seed + i)
        q = random_distributions((B, gamma, V), g, sharp=2.0)
        p = random_distributions((B, gamma + 1, V), g, sharp=2.0)
        if B >= 2:
            p[0, :gamma] = q[0]                                    # p = q: every token accepted
            half = V // 2
            q[1, :, half:] = 0                                     # disjoint supports
            q[1] /= q[1].sum(-1, keepdim=True)
            p[1, :, :half] = 0
            p[1] /= p[1].sum(-1, keepdim=True)
        q, p = q.to(dt), p.to(dt)
        q = q / q.double().sum(-1, keepdim=True).to(dt)            # renormalise after rounding
        p = p / p.double().sum(-1, keepdim=True).to(dt)
        tokens = torch.multinomial(q.double().reshape(-1, V), 1, generator=g).reshape(B, gamma)
        gen = torch.Generator(device=device).manual_seed(seed + i)
        out.append(((tokens.to(device), q.to(device), p.to(device)), {"generator": gen}))
    return out


def invalid(device: str) -> list[InvalidCall]:
    """The calls this contract documents as invalid, with the argument each message must name:
    B = 2, γ = 3, V = 5, float32, draft tokens drawn from q, a seeded generator."""
    g = torch.Generator().manual_seed(0)
    q = random_distributions((2, 3, 5), g)
    p = random_distributions((2, 4, 5), g)
    tok = torch.multinomial(q.reshape(-1, 5), 1, generator=g).reshape(2, 3).to(device)
    q, p = q.float().to(device), p.float().to(device)

    def edit(t, idx, value):
        t = t.clone()
        t[idx] = value
        return t

    q_zero = edit(edit(q, (0, 1), 0.0), (0, 1, (int(tok[0, 1]) + 1) % 5), 1.0)   # q = 0 at draft_tokens[0, 1]
    q_neg = edit(edit(q, (0, 0, 0), -0.1), (0, 0, 1), float(q[0, 0, 1]) + 0.1)    # still sums to 1
    calls = [  # (what, (draft_tokens, draft_probs, target_probs), raises, argument)
        ("draft-tokens-not-a-tensor", (tok.tolist(), q, p), TypeError, "draft_tokens"),
        ("int32-draft-tokens", (tok.int(), q, p), TypeError, "draft_tokens"),
        ("integer-draft-probs", (tok, q.long(), p), TypeError, "draft_probs"),
        ("mixed-dtypes", (tok, q.double(), p), TypeError, ("draft_probs", "target_probs")),
        ("draft-tokens-1-d", (tok[0], q, p), ValueError, "draft_tokens"),
        ("target-one-position-short", (tok, q, p[:, :3]), ValueError, "target_probs"),
        ("draft-gamma-differs", (tok, q[:, :2], p), ValueError, "draft_probs"),
        ("vocab-differs", (tok, q, p[..., :4]), ValueError, "target_probs"),
        ("gamma-0", (tok[:, :0], q[:, :0], p[:, :1]), ValueError, ("draft_tokens", "gamma")),
        ("token-out-of-range", (torch.full_like(tok, 5), q, p), ValueError, "draft_tokens"),
        ("negative-token", (torch.full_like(tok, -1), q, p), ValueError, "draft_tokens"),
        ("q-0-at-a-draft-token", (tok, q_zero, p), ValueError, ("draft_probs", "draft_tokens")),
        ("row-not-summing-to-1", (tok, q, p * 1.5), ValueError, "target_probs"),
        ("negative-probability", (tok, q_neg, p), ValueError, "draft_probs"),
        ("nan-probability", (tok, q, torch.full_like(p, float("nan"))), ValueError, "target_probs"),
    ]
    out = [InvalidCall(what, args, {"generator": torch.Generator(device=device).manual_seed(0)}, (exc,), argument)
           for what, args, exc, argument in calls]
    out.append(InvalidCall("generator-not-a-generator", (tok, q, p), {"generator": 0}, (TypeError,), "generator"))
    return out


CONTRACT = Contract(
    technique="speculative",
    functions=("verify",),
    doc=__doc__,
    cases=cases,
    returns={"verify": tuple},
    invalid=invalid,
)
