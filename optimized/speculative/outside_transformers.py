"""transformers' assisted-generation verifier under the ``speculative`` contract (``hf_assisted``,
``needs="transformers"``): the verification step of assisted generation with sampling,
``transformers.generation.utils._speculative_sampling``, one row at a time.

Source: transformers ``generation/utils.py`` (5.x); lecture 001 §6; claim SD-1.
"""
from __future__ import annotations

import torch


def assisted_verify(draft_tokens, draft_probs, target_probs, *, generator):
    """The ``speculative`` contract over transformers' assisted-generation verifier
    ``_speculative_sampling`` (``generation/utils.py``), one row at a time (it takes one
    sequence). transformers draws its uniforms and its correction from the global RNG: the
    adapter seeds the global generator from ``generator`` (one draw of it) and restores the
    global state after, so equal generators give equal results. Returns (tokens (B, γ+1) int64,
    num_accepted (B,) int64); raises as :func:`inference_conformance.conformance.contracts.speculative.validate`."""
    from transformers.generation.utils import _speculative_sampling

    from inference_conformance.conformance.contracts.speculative import PAD, validate

    shape = validate(draft_tokens, draft_probs, target_probs, generator)
    B, gamma = shape.B, shape.gamma
    dev = draft_tokens.device
    out = torch.full((B, gamma + 1), PAD, dtype=torch.int64, device=dev)
    accepted = torch.zeros(B, dtype=torch.int64, device=dev)
    seed = int(torch.randint(0, 2 ** 62, (1,), generator=generator, device=generator.device))
    devices = [dev] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for b in range(B):
            # transformers takes logits and applies softmax: log-probabilities give back p and q
            # (a zero probability is -inf, whose softmax is 0 again)
            q_logits = draft_probs[b:b + 1].double().log()                    # (1, γ, V)
            p_logits = target_probs[b:b + 1].double().log()                   # (1, γ+1, V)
            candidate = torch.cat([torch.zeros(1, 1, dtype=torch.int64, device=dev), draft_tokens[b:b + 1]], dim=1)
            tokens, n = _speculative_sampling(candidate, q_logits, gamma, p_logits)
            n = int(n)
            out[b, :n + 1] = tokens[0, :n + 1]
            accepted[b] = n
    return out, accepted
