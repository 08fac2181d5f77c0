"""A worked outside implementation of the ``attention`` contract, in plain PyTorch.

Check it against the suite with no change to the suite:

    CI=true PYTHONPATH=examples pytest -n 1 properties --impl attention=my_attention:attention

``attention`` streams the keys in chunks with an online softmax (FlashAttention's recurrence,
without a kernel); ``wrong_attention`` is the same call with a classic bug (PyTorch's top-left
``is_causal`` mask used for Tq < Tk), which the suite rejects:

    CI=true PYTHONPATH=examples pytest -n 1 properties --impl attention=my_attention:wrong_attention
"""
import math

import torch
import torch.nn.functional as F

from inference_conformance.conformance.contracts.attention import validate

CHUNK = 64


def attention(q, k, v, *, causal, scale):
    """q (B, Hq, Tq, D); k, v (B, Hkv, Tk, D) -> (B, Hq, Tq, D) in q's dtype; causal masks are
    bottom-right aligned (query i sees keys j <= i + Tk - Tq)."""
    validate(q, k, v, causal, scale)   # the contract's argument checks: TypeError / ValueError naming the argument
    B, Hq, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    group = Hq // Hkv
    qf = q.to(acc_dtype)
    kf = k.to(acc_dtype).repeat_interleave(group, dim=1)
    vf = v.to(acc_dtype).repeat_interleave(group, dim=1)
    m = torch.full((B, Hq, Tq), -math.inf, dtype=acc_dtype, device=q.device)
    l = torch.zeros_like(m)
    acc = torch.zeros(B, Hq, Tq, D, dtype=acc_dtype, device=q.device)
    rows = torch.arange(Tq, device=q.device)[:, None] + (Tk - Tq)
    for j0 in range(0, Tk, CHUNK):
        s = (qf @ kf[:, :, j0:j0 + CHUNK].transpose(-1, -2)) * scale
        if causal:
            cols = torch.arange(j0, min(j0 + CHUNK, Tk), device=q.device)[None, :]
            s = s.masked_fill(cols > rows, -math.inf)
        m_new = torch.maximum(m, s.max(dim=-1).values)
        m_safe = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
        alpha = torch.exp(m - m_safe)
        p = torch.exp(s - m_safe[..., None])
        acc = acc * alpha[..., None] + p @ vf[:, :, j0:j0 + CHUNK]
        l = l * alpha + p.sum(dim=-1)
        m = m_new
    return (acc / l[..., None]).to(q.dtype)


def wrong_attention(q, k, v, *, causal, scale):
    """A known-bad adapter: torch's is_causal aligns the mask top-left, wrong when Tq < Tk."""
    validate(q, k, v, causal, scale)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
