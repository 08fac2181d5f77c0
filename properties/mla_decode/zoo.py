"""Known-bad MLA decode implementations (the bug zoo): each one is a bug of the field's MLA kernels
and their host code, and KV-12's law (``properties/mla_decode/cases.py``) must reject every one
(``test_mla_decode_rejections.py``).

All follow the mla_decode contract's signature and compute in float64 for float64 inputs and in
float32 otherwise, through the pieces of the torch built-in (absorption, gathering), so that only
the bug makes them wrong.
"""
from __future__ import annotations

import torch

from inference_conformance.conformance.contracts.mla_decode import validate
from inference_conformance.optimized.mla_decode.vectorized import absorb, accumulator, gather
from inference_conformance.reference.transformer import rope_tables


def _rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """x (..., T, R) rotated (rotate-half) at positions (T,) or broadcastable."""
    cos, sin = rope_tables(x.shape[-1], positions, float(theta), x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _decode(args, *, scale, rope_theta, q_lat=None, q_rot=None, tokens=None, num_splits=None):
    """MLA decode of the contract's ``args`` with any of its pieces replaced: the absorbed query
    (B, Hq, C), the rotated RoPE query (B, Hq, R), the gathered tokens (B, T, C + R); with
    ``num_splits``, the split merge without rescale (see :func:`split_merge_without_rescale`)."""
    q_nope, q_rope, w_uk, cache, block_table, seq_lens = args
    shape = validate(q_nope, q_rope, w_uk, cache, block_table, seq_lens, scale, rope_theta)
    acc = accumulator(q_nope.dtype)
    good_lat, good_rot = absorb(q_nope, q_rope, w_uk, seq_lens, rope_theta)
    q_lat = good_lat if q_lat is None else q_lat
    q_rot = good_rot if q_rot is None else q_rot
    good_tokens, valid = gather(cache, block_table, seq_lens, acc)
    tokens = good_tokens if tokens is None else tokens
    q = torch.cat([q_lat, q_rot], dim=-1)                                       # (B, Hq, C + R)
    s = torch.einsum("bhk,btk->bht", q, tokens) * float(scale)
    s = s.masked_fill(~valid[:, None, :], float("-inf"))                       # (B, Hq, T)
    c = tokens[..., :shape.C]
    if num_splits is None:
        return torch.einsum("bht,btc->bhc", torch.softmax(s, dim=-1), c).to(q_nope.dtype)
    num = torch.zeros(shape.B, shape.Hq, shape.C, dtype=acc, device=q.device)
    den = torch.zeros(shape.B, shape.Hq, 1, dtype=acc, device=q.device)
    for b, n in enumerate(seq_lens.tolist()):
        for i in range(num_splits):
            lo, hi = i * n // num_splits, (i + 1) * n // num_splits
            if hi <= lo:
                continue
            part = s[b, :, lo:hi]                                              # (Hq, hi - lo)
            p = torch.exp(part - part.max(dim=-1, keepdim=True).values)        # each split's own max
            num[b] += p @ c[b, lo:hi]
            den[b] += p.sum(dim=-1, keepdim=True)                               # never rescaled to a common max
    return (num / den).to(q_nope.dtype)


def query_rope_position_off_by_one(q_nope, q_rope, w_uk, cache, block_table, seq_lens, *, scale, rope_theta):
    """The query's RoPE part rotated at position seq_lens[b] (the length after the append) instead
    of seq_lens[b] − 1, the new token's own position."""
    acc = accumulator(q_nope.dtype)
    q_rot = _rotate(q_rope.to(acc), seq_lens.to(torch.int64)[:, None], rope_theta)
    return _decode((q_nope, q_rope, w_uk, cache, block_table, seq_lens), scale=scale, rope_theta=rope_theta,
                   q_rot=q_rot)


def cached_rope_rotated_again(q_nope, q_rope, w_uk, cache, block_table, seq_lens, *, scale, rope_theta):
    """The cached RoPE keys rotated at their positions once more (a kernel written for a cache of
    unrotated keys, fed the rotated ones the cache holds)."""
    acc = accumulator(q_nope.dtype)
    validate(q_nope, q_rope, w_uk, cache, block_table, seq_lens, scale, rope_theta)
    tokens, _ = gather(cache, block_table, seq_lens, acc)
    C = w_uk.shape[1]
    positions = torch.arange(tokens.shape[1], device=tokens.device)
    tokens = torch.cat([tokens[..., :C], _rotate(tokens[..., C:], positions, rope_theta)], dim=-1)
    return _decode((q_nope, q_rope, w_uk, cache, block_table, seq_lens), scale=scale, rope_theta=rope_theta,
                   tokens=tokens)


def nope_not_absorbed(q_nope, q_rope, w_uk, cache, block_table, seq_lens, *, scale, rope_theta):
    """The no-RoPE query handed to the latent kernel without the W_uk absorption (zero-padded or
    cut to C values): scored against the latent as if it were a key."""
    acc = accumulator(q_nope.dtype)
    B, Hq, D = q_nope.shape
    C = w_uk.shape[1]
    q_lat = torch.zeros(B, Hq, C, dtype=acc, device=q_nope.device)
    q_lat[..., :min(C, D)] = q_nope.to(acc)[..., :min(C, D)]
    return _decode((q_nope, q_rope, w_uk, cache, block_table, seq_lens), scale=scale, rope_theta=rope_theta,
                   q_lat=q_lat)


def absorbed_with_head0_projection(q_nope, q_rope, w_uk, cache, block_table, seq_lens, *, scale, rope_theta):
    """Every head absorbed through head 0's up-projection W_uk[0] (the head index of the batched
    matmul dropped, its weight broadcast)."""
    acc = accumulator(q_nope.dtype)
    q_lat = torch.einsum("bhd,cd->bhc", q_nope.to(acc), w_uk[0].to(acc))
    return _decode((q_nope, q_rope, w_uk, cache, block_table, seq_lens), scale=scale, rope_theta=rope_theta,
                   q_lat=q_lat)


def split_merge_without_rescale(q_nope, q_rope, w_uk, cache, block_table, seq_lens, *, scale, rope_theta,
                                num_splits: int | None = None):
    """Split-KV decode whose merge adds each split's exp(s − m_s)-weighted latents and sums l_s
    but never rescales them to a common maximum (exp(m_s − m)): wrong whenever the splits'
    maxima differ (default 4 splits)."""
    return _decode((q_nope, q_rope, w_uk, cache, block_table, seq_lens), scale=scale, rope_theta=rope_theta,
                   num_splits=num_splits or 4)


def block_table_ignored(q_nope, q_rope, w_uk, cache, block_table, seq_lens, *, scale, rope_theta):
    """A paged cache read as if sequence b's blocks were consecutive from block b·max_blocks (the
    block table never consulted); NaN-free but the wrong tokens."""
    if block_table is None:
        return _decode((q_nope, q_rope, w_uk, cache, block_table, seq_lens), scale=scale, rope_theta=rope_theta)
    B, width = block_table.shape
    ident = (torch.arange(B * width, device=block_table.device).reshape(B, width) % cache.shape[0]).to(block_table.dtype)
    tokens, _ = gather(cache, ident, seq_lens, accumulator(q_nope.dtype))
    tokens = torch.nan_to_num(tokens, nan=0.0)
    return _decode((q_nope, q_rope, w_uk, cache, block_table, seq_lens), scale=scale, rope_theta=rope_theta,
                   tokens=tokens)


def head_tile_wraps_at_16(q_nope, q_rope, w_uk, cache, block_table, seq_lens, *, scale, rope_theta):
    """A kernel tiling the query heads by 16 whose tile offset is dropped: head h reads the
    absorbed and rotated query of head h % 16 (right up to 16 heads)."""
    q_lat, q_rot = absorb(q_nope, q_rope, w_uk, seq_lens, rope_theta)
    wrap = torch.arange(q_lat.shape[1], device=q_lat.device) % 16
    return _decode((q_nope, q_rope, w_uk, cache, block_table, seq_lens), scale=scale, rope_theta=rope_theta,
                   q_lat=q_lat[:, wrap], q_rot=q_rot[:, wrap])


def block_table_row_of_sequence_0(q_nope, q_rope, w_uk, cache, block_table, seq_lens, *, scale, rope_theta):
    """A paged kernel without the table's batch stride: every sequence looks its blocks up in
    sequence 0's row (entries past that row's blocks clamped into the pool, NaN slots read as 0)."""
    if block_table is None:
        return _decode((q_nope, q_rope, w_uk, cache, block_table, seq_lens), scale=scale, rope_theta=rope_theta)
    row0 = block_table[:1].expand_as(block_table).clamp(0, cache.shape[0] - 1)
    tokens, _ = gather(cache, row0, seq_lens, accumulator(q_nope.dtype))
    return _decode((q_nope, q_rope, w_uk, cache, block_table, seq_lens), scale=scale, rope_theta=rope_theta,
                   tokens=torch.nan_to_num(tokens, nan=0.0))


def implementations():
    """The known-bad MLA decode implementations: KV-12's law names each in its ``kills``."""
    from inference_conformance.conformance.registry import known_bad

    return (
        known_bad("mla_decode", "query_rope_position_off_by_one", query_rope_position_off_by_one),
        known_bad("mla_decode", "cached_rope_rotated_again", cached_rope_rotated_again),
        known_bad("mla_decode", "nope_not_absorbed", nope_not_absorbed),
        known_bad("mla_decode", "absorbed_with_head0_projection", absorbed_with_head0_projection),
        known_bad("mla_decode", "split_merge_without_rescale", split_merge_without_rescale),
        known_bad("mla_decode", "block_table_ignored", block_table_ignored),
        known_bad("mla_decode", "head_tile_wraps_at_16", head_tile_wraps_at_16),
        known_bad("mla_decode", "block_table_row_of_sequence_0", block_table_row_of_sequence_0),
    )
