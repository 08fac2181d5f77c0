"""The float64 reference of the ``mla_decode`` contract (claim KV-12): MLA decode by materialising
every head's keys from the latent cache, as KV-7's ``mla_materialized`` does
(:mod:`inference_conformance.reference.kv_cache`), never by absorbing.

For each sequence b, token by token: look the token up (its slot through the block table, or its
row of a contiguous cache), split it into the latent c_t (C values) and the RoPE key k_rope_t (R
values); head h's key is [c_t W_uk[h], k_rope_t] (D + R values), its value c_t (the output stays
in the latent space, before W_uv); the query is [q_nope[b, h], rot(q_rope[b, h], seq_lens[b] − 1)].
Attention goes through the one core, :func:`inference_conformance.reference.attention.masked_attention`.

:func:`absorbed_rounded` is the naive computation of the 16-bit rule (``mla-decode-16bit``): the
same call computed in float64 through the absorbed query, with that query rounded to the
inputs' dtype, and the output rounded once.
"""
from __future__ import annotations

import torch

from inference_conformance.conformance.contracts.mla_decode import validate
from inference_conformance.reference.attention import masked_attention
from inference_conformance.reference.transformer import apply_rope, rope_tables


def gather_tokens(cache: torch.Tensor, block_table: torch.Tensor | None, b: int, seq_len: int) -> torch.Tensor:
    """Sequence b's cached tokens in logical order, (seq_len, C + R) in float64: token t from
    slot t % block_size of block block_table[b, t // block_size] (paged) or cache[b, t]."""
    rows = []
    for t in range(seq_len):
        if block_table is None:
            rows.append(cache[b, t])
        else:
            bs = cache.shape[1]
            rows.append(cache[int(block_table[b, t // bs]), t % bs])
    return torch.stack(rows).to(torch.float64)


def rotate_query(q_rope: torch.Tensor, position: int, rope_theta: float) -> torch.Tensor:
    """q_rope (Hq, R) rotated at ``position`` (rotate-half RoPE of base ``rope_theta``), float64."""
    R = q_rope.shape[-1]
    cos, sin = rope_tables(R, torch.tensor([position], device=q_rope.device), rope_theta, torch.float64)
    return apply_rope(q_rope.to(torch.float64)[None, :, None], cos, sin)[0, :, 0]   # (Hq, R)


def mla_decode(q_nope: torch.Tensor, q_rope: torch.Tensor, w_uk: torch.Tensor, cache: torch.Tensor,
               block_table: torch.Tensor | None, seq_lens: torch.Tensor, *, scale: float,
               rope_theta: float) -> torch.Tensor:
    """MLA decode over the materialised keys: q_nope (B, Hq, D), q_rope (B, Hq, R), w_uk (Hq, C,
    D), cache (B, T_max, C + R) or (num_blocks, block_size, C + R) with block_table (B,
    max_blocks), seq_lens (B,) -> (B, Hq, C) in q_nope's dtype, computed in float64. Raises as
    :func:`inference_conformance.conformance.contracts.mla_decode.validate`."""
    shape = validate(q_nope, q_rope, w_uk, cache, block_table, seq_lens, scale, rope_theta)
    w = w_uk.to(torch.float64)
    out = torch.empty(shape.B, shape.Hq, shape.C, dtype=torch.float64, device=q_nope.device)
    for b in range(shape.B):
        n = int(seq_lens[b])
        tokens = gather_tokens(cache, block_table, b, n)                     # (n, C + R)
        c, k_rope = tokens[:, :shape.C], tokens[:, shape.C:]
        k_nope = torch.einsum("tc,hcd->htd", c, w)                           # (Hq, n, D): materialised
        k = torch.cat([k_nope, k_rope.expand(shape.Hq, n, shape.R)], -1)     # (Hq, n, D + R)
        q = torch.cat([q_nope[b].to(torch.float64), rotate_query(q_rope[b], n - 1, rope_theta)], -1)
        v = c.expand(shape.Hq, n, shape.C)                                   # (Hq, n, C)
        out[b] = masked_attention(q[:, None], k, v, scale=float(scale))[:, 0]
    return out.to(q_nope.dtype)


def absorbed_rounded(q_nope: torch.Tensor, q_rope: torch.Tensor, w_uk: torch.Tensor, cache: torch.Tensor,
                     block_table: torch.Tensor | None, seq_lens: torch.Tensor, *, scale: float,
                     rope_theta: float) -> torch.Tensor:
    """``out_pt`` of the 16-bit rule: the absorbed query q_nope[b, h] W_uk[h]ᵀ and the rotated
    RoPE query, each computed in float64 and rounded to q_nope's dtype, attend in float64 over
    the latent cache (one KV head); the output is rounded to q_nope's dtype. Same shapes as
    :func:`mla_decode`."""
    shape = validate(q_nope, q_rope, w_uk, cache, block_table, seq_lens, scale, rope_theta)
    dt = q_nope.dtype
    q_lat = torch.einsum("bhd,hcd->bhc", q_nope.to(torch.float64), w_uk.to(torch.float64))   # (B, Hq, C)
    out = torch.empty(shape.B, shape.Hq, shape.C, dtype=torch.float64, device=q_nope.device)
    for b in range(shape.B):
        n = int(seq_lens[b])
        tokens = gather_tokens(cache, block_table, b, n)                     # (n, C + R)
        q = torch.cat([q_lat[b], rotate_query(q_rope[b], n - 1, rope_theta)], -1).to(dt).to(torch.float64)
        out[b] = masked_attention(q[:, None], tokens[None], tokens[None, :, :shape.C], scale=float(scale))[:, 0]
    return out.to(dt)


def implementations():
    """The float64 reference of the mla_decode contract (materialised keys)."""
    from inference_conformance.conformance.registry import builtin

    return (builtin("mla_decode", "reference", mla_decode, batch_invariant=True),)
