"""The "torch" implementation of the ``mla_decode`` contract: batched PyTorch over the latent cache,
and the host-side absorption every built-in shares.

:func:`absorb` turns the call's query into the latent space: q_lat[b, h] = q_nope[b, h] W_uk[h]ᵀ
(C values) and q_rope[b, h] rotated at the decode position seq_lens[b] − 1, both in float64 for
float64 inputs and float32 otherwise (never rounded to a 16-bit input dtype). :func:`mla_decode`
gathers every sequence's tokens at once (through the block table for a paged cache; slots past a
sequence's length are never read into the scores: they are replaced by 0 and masked), computes
the scores against the C + R cached values of each token (one KV head shared by every query
head: multi-query attention) and the softmax-weighted sum of the latents. Claim KV-12.
"""
from __future__ import annotations

import torch

from inference_conformance.conformance.contracts.mla_decode import validate
from inference_conformance.reference.transformer import rope_tables


def accumulator(dtype: torch.dtype) -> torch.dtype:
    """The dtype the built-ins compute in: float64 for float64 inputs, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def absorb(q_nope: torch.Tensor, q_rope: torch.Tensor, w_uk: torch.Tensor, seq_lens: torch.Tensor,
           rope_theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_lat (B, Hq, C), q_rot (B, Hq, R)) in :func:`accumulator` of q_nope's dtype: the no-RoPE
    query absorbed through W_uk (q_nope (B, Hq, D), w_uk (Hq, C, D)) and the RoPE query (B, Hq, R)
    rotated (rotate-half, base ``rope_theta``) at position seq_lens[b] − 1 (seq_lens (B,))."""
    acc = accumulator(q_nope.dtype)
    q_lat = torch.einsum("bhd,hcd->bhc", q_nope.to(acc), w_uk.to(acc))          # (B, Hq, C)
    positions = seq_lens.to(torch.int64) - 1                                    # (B,)
    cos, sin = rope_tables(q_rope.shape[-1], positions, float(rope_theta), acc)  # (B, R/2)
    cos, sin = cos[:, None], sin[:, None]
    x1, x2 = q_rope.to(acc).chunk(2, dim=-1)
    q_rot = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)        # (B, Hq, R)
    return q_lat, q_rot


def gather(cache: torch.Tensor, block_table: torch.Tensor | None, seq_lens: torch.Tensor,
           dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens (B, T, C + R) in ``dtype``, valid (B, T) bool), T = max seq_lens: each sequence's
    tokens in logical order (paged: token t from slot t % block_size of block
    block_table[b, t // block_size]); positions at or past a sequence's length are 0 and invalid
    (dead table entries and garbage slots are never looked up)."""
    lens = seq_lens.to(torch.int64)
    T = int(lens.max())
    t = torch.arange(T, device=cache.device)
    valid = t[None, :] < lens[:, None]                                         # (B, T)
    if block_table is None:
        tokens = cache[:, :T]
    else:
        bs = cache.shape[1]
        blk = block_table.to(torch.int64)[:, t // bs]                          # (B, T)
        blk = torch.where(valid, blk, torch.zeros_like(blk))
        tokens = cache[blk, (t % bs)[None, :].expand_as(blk)]                  # (B, T, C + R)
    tokens = torch.where(valid[..., None], tokens.to(dtype), torch.zeros((), dtype=dtype, device=cache.device))
    return tokens, valid


def mla_decode(q_nope: torch.Tensor, q_rope: torch.Tensor, w_uk: torch.Tensor, cache: torch.Tensor,
               block_table: torch.Tensor | None, seq_lens: torch.Tensor, *, scale: float,
               rope_theta: float) -> torch.Tensor:
    """MLA decode over the latent cache, up-projection absorbed: q_nope (B, Hq, D), q_rope (B, Hq,
    R), w_uk (Hq, C, D), cache (B, T_max, C + R) or (num_blocks, block_size, C + R) with
    block_table (B, max_blocks), seq_lens (B,) -> (B, Hq, C) in q_nope's dtype. Raises as
    :func:`inference_conformance.conformance.contracts.mla_decode.validate`."""
    shape = validate(q_nope, q_rope, w_uk, cache, block_table, seq_lens, scale, rope_theta)
    acc = accumulator(q_nope.dtype)
    q_lat, q_rot = absorb(q_nope, q_rope, w_uk, seq_lens, rope_theta)
    tokens, valid = gather(cache, block_table, seq_lens, acc)                 # (B, T, C + R)
    q = torch.cat([q_lat, q_rot], dim=-1)                                       # (B, Hq, C + R)
    s = torch.einsum("bhk,btk->bht", q, tokens) * float(scale)                  # (B, Hq, T)
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1)
    out = torch.einsum("bht,btc->bhc", p, tokens[..., :shape.C])                # (B, Hq, C)
    return out.to(q_nope.dtype)
