"""The ``mla_decode`` contract: one decode step of multi-head latent attention (MLA) over the
latent cache, the up-projections absorbed (DeepSeek-V2 §2.1; FlashMLA, FlashInfer's and vLLM's
MLA decode).

    mla_decode(q_nope, q_rope, w_uk, cache, block_table, seq_lens, *, scale: float,
               rope_theta: float) -> Tensor

MLA caches per token one latent ``c_t`` of C values and one RoPE key ``k_rope_t`` of R values,
shared by every query head (C + R values per token per layer: 512 + 64 = 576 in DeepSeek-V2/V3,
claim KV-7). Head ``h``'s key and value are up-projections of the latent: its key is the
concatenation [c_t W_uk[h], k_rope_t] (D + R values), its value c_t W_uv[h]. A decode kernel
never materialises them: it absorbs W_uk[h] into the query's no-RoPE part (q_nope[h] W_uk[h]ᵀ,
C values, in the latent space), rotates the query's RoPE part, attends over the latent cache as
multi-query attention with one KV head, and returns the output in the latent space; the caller
applies W_uv (and the output projection) after it.

Shapes (sizes as in :mod:`inference_conformance.conformance.contracts.glossary`; here C is the
latent dim, R the RoPE dim):

- ``q_nope`` (B, Hq, D): the no-RoPE part of each sequence's one new query, per head, *before*
  absorption (D: the no-RoPE head dim of q and of the materialised keys; DeepSeek-V2: 128).
- ``q_rope`` (B, Hq, R): the RoPE part of the query, *not yet rotated*: the implementation
  rotates it at the decode position p_b = seq_lens[b] − 1 (the new token is the last cached one)
  by the rotate-half RoPE of base ``rope_theta`` (pairs (x[i], x[i + R/2]) turned by the angle
  p_b · rope_theta^(−2i/R), :func:`inference_conformance.reference.transformer.apply_rope`). R is even.
- ``w_uk`` (Hq, C, D): the key up-projection: head h's no-RoPE key of token t is c_t @ w_uk[h].
- ``cache``: the latent cache, C + R values per token, [..., :C] the latent c_t, [..., C:] the
  RoPE key k_rope_t as stored (rotated at its own position when it was written; the call rotates
  no key). Contiguous (``block_table`` None): (B, T_max, C + R), token t of sequence b at
  ``cache[b, t]``. Paged (``block_table`` an int32 tensor (B, max_blocks)): (num_blocks,
  block_size, C + R), token t of sequence b in slot t % block_size of physical block
  block_table[b, t // block_size] (as in the ``paged_attention`` contract).
- ``seq_lens`` (B,) int32: tokens cached per sequence, the new one included, each in
  1..T_max (contiguous) or 1..max_blocks · block_size (paged).

Returns (B, Hq, C) in ``q_nope``'s dtype on its device, the attention output in the latent space:

    s_t = scale · (q_nope[b, h] · (c_t W_uk[h]) + rot(q_rope[b, h], p_b) · k_rope_t)
    out[b, h] = sum_{t < seq_lens[b]} softmax_t(s_t) · c_t

which is attention over the materialised keys [c_t W_uk[h], k_rope_t] with values c_t (claim
KV-12; applying W_uv[h] to it gives attention over the materialised values, KV-7).

What an implementation must not read: cache slots at or past seq_lens[b] (the suite fills them
with NaN) and block-table entries past ceil(seq_lens[b] / block_size) (any value, out of range
included); neither may affect the result.

Supported inputs: D in 1..256, C in 1..1024, R even in 2..128, Hq >= 1, block_size >= 1 (any),
dtypes float64 / float32 / float16 / bfloat16 (q_nope, q_rope, w_uk and cache of one dtype, all
tensors on one device; any strides). An implementation may raise ``NotImplementedError`` for an
input it does not support (a dtype, a size, the contiguous or the paged layout): the suite
reports "unsupported", never a pass. Invalid arguments raise ``TypeError`` (wrong type or dtype)
or ``ValueError`` (wrong rank, size, device or value: a live table entry out of range, a length
outside its range, an odd R, a scale or rope_theta that is not finite or not positive) naming
the argument, before any kernel launch (:func:`validate`).

Tolerance: float64 and float32 outputs by the suite's dtype rules (1e-12 and 1e-5 of the
output's scale). 16-bit outputs by the rule ``mla-decode-16bit``: production kernels take the
absorbed query in the input's 16-bit dtype (FlashMLA: a bfloat16 q of C + R values), so the
naive computation ``out_pt`` is the float64 result of the same call with the absorbed and
rotated query rounded to that dtype, rounded once at the end; an output may be off by twice
that error plus 4 ulps of the output's scale (:data:`MLA_16BIT_RULE`).

Oracle: the float64 reference (``inference_conformance.reference.mla_decode``) gathers each
sequence's tokens, materialises every head's keys [c_t W_uk[h], k_rope_t] and attends with the
one attention core (KV-7's materialised K/V); it never absorbs.

Claims checked against this contract: KV-12 (an MLA decode kernel over the latent cache with the
up-projections absorbed equals attention over the materialised K and V, contiguous and paged).
Sources: DeepSeek-AI 2024 (DeepSeek-V2 §2.1, MLA and its decoupled RoPE); CS336 lecture 10 part 3
("reducing the KV cache"); Kwon et al. 2023 (paged blocks).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from inference_conformance.conformance import tolerance
from inference_conformance.conformance.contracts.checks import (check_block_table, check_devices, check_index,
                                                                 check_live_blocks, check_scale, check_seq_lens,
                                                                 check_tensor)
from inference_conformance.conformance.coverage import CoverageClass
from inference_conformance.conformance.registry import Contract, InvalidCall

#: Dtypes of the contract (an implementation may still refuse one with NotImplementedError).
DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
#: Largest no-RoPE head dim D, latent dim C and RoPE dim R of the contract.
MAX_HEAD_DIM = 256
MAX_LATENT_DIM = 1024
MAX_ROPE_DIM = 128
#: The integer dtype of block_table and seq_lens.
INDEX_DTYPE = torch.int32


@dataclass(frozen=True)
class MLAShape:
    """The sizes of one call: batch, query heads, no-RoPE head dim, latent dim, RoPE dim, whether
    the cache is paged, its first two dims (B and T_max, or num_blocks and block_size) and the
    table width (max_blocks; T_max's blocks of one token for a contiguous cache)."""

    B: int
    Hq: int
    D: int
    C: int
    R: int
    paged: bool
    num_blocks: int
    block_size: int
    max_blocks: int


def _check_rope_theta(rope_theta) -> None:
    if isinstance(rope_theta, bool) or not isinstance(rope_theta, numbers.Real):
        raise TypeError(f"rope_theta must be a real number (e.g. 10000.0), got {type(rope_theta).__name__}")
    if not math.isfinite(float(rope_theta)) or float(rope_theta) <= 0:
        raise ValueError(f"rope_theta must be finite and > 0, got {rope_theta}")


def validate(q_nope, q_rope, w_uk, cache, block_table, seq_lens, scale, rope_theta) -> MLAShape:
    """Check one call against the contract; return its sizes.

    Raises TypeError (not a tensor, unsupported or mixed dtypes, block_table / seq_lens not
    int32, ``scale`` or ``rope_theta`` not a real number) or ValueError (wrong rank, sizes that
    disagree, D / C / R outside their ranges or R odd, mixed devices, ``seq_lens`` outside
    1..capacity, a live block-table entry outside [0, num_blocks), a non-finite scale, a
    rope_theta not finite and > 0), each naming the argument. Reads ``block_table`` and
    ``seq_lens`` on the host (one synchronisation on CUDA)."""
    for name, t, dims in (("q_nope", q_nope, "(B, Hq, D)"), ("q_rope", q_rope, "(B, Hq, R)"),
                          ("w_uk", w_uk, "(Hq, C, D)"),
                          ("cache", cache, "(B, T_max, C + R) or (num_blocks, block_size, C + R)")):
        check_tensor(name, t, 3, dims, DTYPES, "mla_decode")
    for name, t in (("q_rope", q_rope), ("w_uk", w_uk), ("cache", cache)):
        if t.dtype != q_nope.dtype:
            raise TypeError(f"{name} has dtype {t.dtype}, q_nope {q_nope.dtype}: q_nope, q_rope, w_uk and cache "
                            "must share one dtype")
    check_index("seq_lens", seq_lens, "(B,)", (INDEX_DTYPE,))
    if block_table is not None:
        check_index("block_table", block_table, "(B, max_blocks)", (INDEX_DTYPE,))
    check_devices("q_nope", q_nope, (("q_rope", q_rope), ("w_uk", w_uk), ("cache", cache), ("seq_lens", seq_lens),
                                     ("block_table", block_table)))
    B, Hq, D = q_nope.shape
    if B < 1 or Hq < 1:
        raise ValueError(f"q_nope must hold at least one sequence and one head, got shape {tuple(q_nope.shape)}")
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"q_nope's head dim D must be in 1..{MAX_HEAD_DIM}, got {D}")
    if tuple(q_rope.shape[:2]) != (B, Hq):
        raise ValueError(f"q_rope must have shape (B, Hq, R) = ({B}, {Hq}, R), got {tuple(q_rope.shape)}")
    R = q_rope.shape[2]
    if not 2 <= R <= MAX_ROPE_DIM or R % 2:
        raise ValueError(f"q_rope's RoPE dim R must be even and in 2..{MAX_ROPE_DIM}, got {R}")
    Hw, C, Dw = w_uk.shape
    if Hw != Hq or Dw != D:
        raise ValueError(f"w_uk must have shape (Hq, C, D) = ({Hq}, C, {D}), got {tuple(w_uk.shape)}")
    if not 1 <= C <= MAX_LATENT_DIM:
        raise ValueError(f"w_uk's latent dim C must be in 1..{MAX_LATENT_DIM}, got {C}")
    if cache.shape[2] != C + R:
        raise ValueError(f"cache must hold C + R = {C} + {R} = {C + R} values per token, got {tuple(cache.shape)}")
    n0, n1 = cache.shape[0], cache.shape[1]
    if n0 < 1 or n1 < 1:
        raise ValueError(f"cache must have at least one block (or sequence) and one slot, got {tuple(cache.shape)}")
    check_scale(scale, q_nope.dtype)
    _check_rope_theta(rope_theta)
    if block_table is None:
        if n0 != B:
            raise ValueError(f"a contiguous cache (block_table None) must have shape (B, T_max, C + R) with B = {B}, "
                             f"got {tuple(cache.shape)}")
        max_blocks = n1
        check_seq_lens(seq_lens, B, n1, "T_max")
    else:
        max_blocks = check_block_table(block_table, B)
        lens = check_seq_lens(seq_lens, B, max_blocks * n1, "max_blocks * block_size")
        check_live_blocks(block_table, lens, n1, n0)
    return MLAShape(B, Hq, D, C, R, block_table is not None, n0, n1, max_blocks)


def flops(B: int, Hq: int, C: int, R: int, seq_len: int, D: int) -> float:
    """Matmul FLOPs of one call at one length for every sequence: the absorption 2·B·Hq·D·C,
    scores 2·B·Hq·seq_len·(C + R), the latent output 2·B·Hq·seq_len·C."""
    return 2.0 * B * Hq * (D * C + seq_len * (2 * C + R))


def cache_bytes(B: int, seq_len: int, C: int, R: int, bytes_per_value: int) -> int:
    """Bytes of the latent cache a call reads: B·seq_len·(C + R) values (one KV head, shared)."""
    return B * seq_len * (C + R) * bytes_per_value


#: The rule for 16-bit outputs (see the module's docstring).
MLA_16BIT_RULE = tolerance.NaiveMultipleRule(
    "mla-decode-16bit", factor=2.0, floor_ulps=4.0,
    sees="errors above twice those of the absorbed query rounded to the 16-bit dtype plus 4 ulps of the "
         "output's scale (bfloat16: 3% of it): a wrong RoPE position, an unabsorbed query, a split merge "
         "without rescale (each shown rejected in bfloat16); all-zero or unchanged outputs",
    blind_to="errors below the absorbed query's own 16-bit rounding plus 4 ulps of the output's scale (one "
             "dropped token among hundreds, a 2% scaling): a float32 or a 16-bit absorbed query are both correct")


def cases(seed: int, device: str) -> list[tuple[tuple, dict]]:
    """Small valid calls for the generic checks (no input mutation, identical repeats): a
    contiguous and a paged float32 batch, a float64 one, a bfloat16 paged one with a block of 5,
    and one over several tiles of keys (a nondeterministic split order shows there). Unused
    cache slots are NaN, unused table entries out of range."""
    out = []
    for i, (lens, Hq, D, C, R, bs, dt) in enumerate([
            ((5, 1), 4, 8, 12, 4, None, torch.float32),
            ((9, 17), 3, 16, 32, 8, 4, torch.float32),
            ((3,), 2, 5, 7, 2, None, torch.float64),
            ((11, 6), 8, 16, 24, 8, 5, torch.bfloat16),
            ((130, 70), 16, 32, 64, 16, 16, torch.float32)]):
        g = torch.Generator().manual_seed(1000 * seed + i)
        args = _inputs(g, lens, Hq, D, C, R, bs)
        out.append((tuple(None if a is None else a.to(device=device, dtype=dt if a.is_floating_point() else a.dtype)
                          for a in args), {"scale": (D + R) ** -0.5, "rope_theta": 10000.0}))
    return out


def _inputs(g, lens, Hq, D, C, R, block_size):
    """(q_nope, q_rope, w_uk, cache, block_table, seq_lens) in float64, blocks in reverse order."""
    B, T = len(lens), max(lens)
    q_nope = torch.randn(B, Hq, D, generator=g, dtype=torch.float64)
    q_rope = torch.randn(B, Hq, R, generator=g, dtype=torch.float64)
    w_uk = torch.randn(Hq, C, D, generator=g, dtype=torch.float64) / math.sqrt(C)
    tokens = torch.randn(B, T, C + R, generator=g, dtype=torch.float64)
    for b, n in enumerate(lens):
        tokens[b, n:] = float("nan")
    seq_lens = torch.tensor(lens, dtype=INDEX_DTYPE)
    if block_size is None:
        return q_nope, q_rope, w_uk, tokens, None, seq_lens
    nb = -(-T // block_size)
    cache = torch.full((B * nb + 1, block_size, C + R), float("nan"), dtype=torch.float64)
    table = torch.full((B, nb + 1), B * nb + 9, dtype=INDEX_DTYPE)
    for b, n in enumerate(lens):
        for i in range(-(-n // block_size)):
            blk = B * nb - (b * nb + i)
            table[b, i] = blk
            part = tokens[b, i * block_size:min(n, (i + 1) * block_size)]
            cache[blk, :len(part)] = part
    return q_nope, q_rope, w_uk, cache, table, seq_lens


def invalid(device: str) -> list[InvalidCall]:
    """The calls this contract documents as invalid (tiny float32 tensors, a paged cache of
    blocks of 4 unless the call is about the contiguous one; scale 0.3 and rope_theta 10000
    unless the call is about them), with the argument each message must name."""
    g = torch.Generator().manual_seed(0)
    q, qr, w, cache, table, lens = (None if a is None else a.to(device=device, dtype=torch.float32)
                                    if a.is_floating_point() else a.to(device)
                                    for a in _inputs(g, (5, 3), 4, 8, 12, 4, 4))
    cq, cqr, cw, ccache, _, clens = (None if a is None else a.to(device=device, dtype=torch.float32)
                                     if a.is_floating_point() else a.to(device)
                                     for a in _inputs(g, (5, 3), 4, 8, 12, 4, None))
    meta = torch.device("meta")
    bad_table = table.clone()
    bad_table[1, 0] = cache.shape[0]
    calls = [  # (what, args, kwargs, raises, argument)
        ("q_nope-not-a-tensor", (q.tolist(), qr, w, cache, table, lens), {}, TypeError, "q_nope"),
        ("integer-q_nope", (q.long(), qr, w, cache, table, lens), {}, TypeError, "q_nope"),
        ("q_rope-with-2-dims", (q, qr[0], w, cache, table, lens), {}, ValueError, "q_rope"),
        ("mixed-dtypes", (q, qr, w, cache.double(), table, lens), {}, TypeError, "cache"),
        ("odd-rope-dim", (q, qr[..., :3], w, cache[..., :15], table, lens), {}, ValueError, ("q_rope", "R")),
        ("q_rope-heads-differ", (q, qr[:, :3], w, cache, table, lens), {}, ValueError, "q_rope"),
        ("w_uk-head-dim-differs", (q, qr, w[..., :7], cache, table, lens), {}, ValueError, "w_uk"),
        ("w_uk-heads-differ", (q, qr, w[:3], cache, table, lens), {}, ValueError, "w_uk"),
        ("cache-width-not-c-plus-r", (q, qr, w, cache[..., :15], table, lens), {}, ValueError, "cache"),
        ("seq_lens-int64", (q, qr, w, cache, table, lens.long()), {}, TypeError, "seq_lens"),
        ("block_table-int64", (q, qr, w, cache, table.long(), lens), {}, TypeError, "block_table"),
        ("seq_len-0", (q, qr, w, cache, table, lens * 0), {}, ValueError, "seq_lens"),
        ("seq_len-past-capacity", (q, qr, w, cache, table[:, :1], lens), {}, ValueError, "seq_lens"),
        ("live-block-out-of-range", (q, qr, w, cache, bad_table, lens), {}, ValueError, "block_table"),
        ("contiguous-batch-differs", (cq, cqr, cw, ccache[:1], None, clens), {}, ValueError, "cache"),
        ("contiguous-seq_len-past-t_max", (cq, cqr, cw, ccache[:, :4], None, clens), {}, ValueError, "seq_lens"),
        ("scale-nan", (q, qr, w, cache, table, lens), {"scale": math.nan}, ValueError, "scale"),
        ("scale-a-string", (q, qr, w, cache, table, lens), {"scale": "0.3"}, TypeError, "scale"),
        ("rope_theta-zero", (q, qr, w, cache, table, lens), {"rope_theta": 0.0}, ValueError, "rope_theta"),
        ("rope_theta-a-bool", (q, qr, w, cache, table, lens), {"rope_theta": True}, TypeError, "rope_theta"),
        ("cache-on-another-device", (q, qr, w, cache.to(meta), table, lens), {}, ValueError, "cache"),
    ]
    return [InvalidCall(what, args, {"scale": 0.3, "rope_theta": 10000.0, **kw}, (exc,), argument)
            for what, args, kw, exc, argument in calls]


CONTRACT = Contract(
    technique="mla_decode",
    functions=("mla_decode",),
    doc=__doc__,
    cases=cases,
    rules={"mla-decode-16bit": MLA_16BIT_RULE},
    returns={"mla_decode": torch.Tensor},
    invalid=invalid,
)


# ----------------------------------------------------------------------------------------------
# coverage table: observations are the law's cases (properties/mla_decode/cases.py MLACase:
# lens, Hq, D, C, R, block_size (None: contiguous), scale, magnitude, num_splits)
# ----------------------------------------------------------------------------------------------

#: The law that judges one call's values (KV-12's).
_KV12 = ("law_matches_materialised",)


def _coverage() -> tuple:
    out = [
        CoverageClass("contiguous cache", _KV12, lambda c: c.block_size is None),
        CoverageClass("paged, block size 1", _KV12, lambda c: c.block_size == 1),
        CoverageClass("paged, block size not a power of two", _KV12,
                      lambda c: c.block_size is not None and c.block_size > 2 and c.block_size & (c.block_size - 1)),
        CoverageClass("paged, block size >= 16", _KV12, lambda c: c.block_size is not None and c.block_size >= 16),
        CoverageClass("a sequence of one token (seq_len 1)", _KV12, lambda c: min(c.lens) == 1),
        CoverageClass("B > 1 with different lengths", _KV12, lambda c: len(set(c.lens)) > 1),
        CoverageClass("more than one split of the keys", _KV12, lambda c: (c.num_splits or 1) > 1),
        CoverageClass("a split with no keys (seq_len < num_splits)", _KV12,
                      lambda c: (c.num_splits or 1) > min(c.lens)),
        CoverageClass("more than 16 query heads (two head tiles), not a multiple of 16", _KV12,
                      lambda c: c.Hq > 16 and c.Hq % 16),
        CoverageClass("one query head", _KV12, lambda c: c.Hq == 1),
        CoverageClass("latent dim C not a power of two", _KV12, lambda c: c.C & (c.C - 1)),
        CoverageClass("decode position past 256 (RoPE angles of many turns)", _KV12, lambda c: max(c.lens) > 256),
        CoverageClass("large logits (integer inputs, |logit| ~ 1e2..1e3)", _KV12, lambda c: c.magnitude == "large"),
        CoverageClass("negative scale", _KV12, lambda c: c.scale < 0),
    ]
    for t in (16, 32):
        for r, what in ((0, "a multiple of"), (1, "one past a multiple of"), (t - 1, "one short of a multiple of")):
            out.append(CoverageClass(f"seq_len {what} {t}", _KV12,
                                     lambda c, t=t, r=r: any(n >= t - 1 and n % t == r for n in c.lens)))
    return tuple(out)


#: The mla_decode contract's coverage table (see :class:`CoverageClass`).
COVERAGE = _coverage()
