"""Batched speculative verification on the device, in vectorized PyTorch (lecture 002 §2;
Leviathan et al. 2023, Algorithm 1).

The whole batch is verified by a fixed sequence of tensor operations, whatever B and γ: one draw
of (B, γ) uniforms, the acceptance test u · q(x) < p(x) for every position at once, the first
rejection from a cumulative product, one gather of the residual (or bonus) row per sequence, one
``torch.multinomial``. No host round trip per token and no loop over positions; the host reads
the inputs only in :func:`inference_conformance.conformance.contracts.speculative.validate` (skipped with
``check=False`` by an engine that built the inputs itself). Acceptance and residual are computed in
float64, so that q(x) = 1e-12 against p(x) ≈ 1, or p(x) = 0 against q(x) > 0, are exact.
"""
from __future__ import annotations

import torch

from inference_conformance.conformance.contracts.speculative import PAD, validate


def _accept_mask(u, q_x, p_x):
    """(B, γ) bool: draft token accepted at each position (probability min(1, p/q))."""
    return u * q_x < p_x


def verify(draft_tokens, draft_probs, target_probs, *, generator, check: bool = True):
    """The ``speculative`` contract (``conformance/contracts/speculative.py``), batched.

    Returns (tokens (B, γ+1) int64, num_accepted (B,) int64) on the inputs' device. ``check``
    runs the contract's host-side validation first (default).
    """
    if check:
        validate(draft_tokens, draft_probs, target_probs, generator)
    B, gamma = draft_tokens.shape
    dev = draft_tokens.device
    q = draft_probs.to(torch.float64)
    p = target_probs.to(torch.float64)
    x = draft_tokens[..., None]
    q_x = q.gather(-1, x)[..., 0]                                             # (B, γ)
    p_x = p[:, :gamma].gather(-1, x)[..., 0]
    u = torch.rand((B, gamma), generator=generator, dtype=torch.float64, device=dev)
    ok = _accept_mask(u, q_x, p_x)
    num_accepted = ok.to(torch.int64).cumprod(-1).sum(-1)                     # first rejection index
    # the row the last token comes from: residual max(0, p - q) at the first rejection, p at γ
    q_pad = torch.cat([q, q.new_zeros(B, 1, q.shape[-1])], dim=1)            # (B, γ+1, V), zero row at γ
    idx = num_accepted.view(B, 1, 1).expand(B, 1, q.shape[-1])
    p_n = p.gather(1, idx)[:, 0]                                              # (B, V)
    resid = (p_n - q_pad.gather(1, idx)[:, 0]).clamp_min(0.0)
    empty = resid.sum(-1, keepdim=True) <= 0                                  # p = q: no residual mass
    resid = torch.where(empty, p_n, resid)
    last = torch.multinomial(resid, 1, generator=generator)[:, 0]             # (B,)
    pos = torch.arange(gamma + 1, device=dev)
    draft_pad = torch.cat([draft_tokens, draft_tokens.new_full((B, 1), PAD)], dim=1)
    tokens = torch.where(pos < num_accepted[:, None], draft_pad, torch.full_like(draft_pad, PAD))
    tokens = torch.where(pos == num_accepted[:, None], last[:, None], tokens)
    return tokens, num_accepted


def implementations():
    """The batched PyTorch verifier; transformers' assisted-generation verifier and vLLM's
    rejection sampler (adapters: :mod:`inference_conformance.optimized.speculative.outside_transformers`,
    :mod:`inference_conformance.optimized.speculative.outside_vllm`,
    unavailable where their package is missing)."""
    from inference_conformance.conformance.registry import builtin
    from inference_conformance.optimized.speculative import outside_transformers
    from inference_conformance.optimized.speculative import outside_vllm as outside_vllm_speculative

    return (builtin("speculative", "torch", verify),
            builtin("speculative", "hf_assisted", outside_transformers.assisted_verify, needs="transformers",
                    adapter=True, peer="hf"),
            *outside_vllm_speculative.speculative_registrations())
