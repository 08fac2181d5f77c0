"""The PA-8 law's comparison and its scale classes (``properties/paged_attention/laws/prefill.py``):
the oracle of the mixed batch computed apart from the reference core (:func:`causal_oracle`), the
check against it (:func:`check_against_causal`), the boundary classes of batches of many
sequences, prompts before decode rows and chunks past production chunk sizes (:data:`SCALE_COVERAGE`,
beside the contract's table), and the long-chunk cases (:data:`LONG_CHUNKS`).
"""
from __future__ import annotations

import math

import torch

from inference_conformance.conformance.contracts.paged_attention import QUERY_TILE
from inference_conformance.conformance.coverage import CoverageClass
from inference_conformance.conformance.tolerance import assert_close
from inference_conformance.properties.paged_attention.cases import PrefillCase, PrefillInputs
from inference_conformance.reference import attention as ref


def dense_causal(inp: PrefillInputs, case: PrefillCase, dtype: torch.dtype | None) -> torch.Tensor:
    """Dense causal attention of each chunk's queries over its sequence's contiguous K/V
    (bottom-right aligned: the chunk's queries are the sequence's last q_len tokens), (N, Hq, D),
    in ``dtype`` (None: the inputs'), by the reference core (the same-dtype naive ``out_pt``)."""
    outs, loc = [], inp.query_start_loc.tolist()
    for b in range(case.B):
        qb = inp.q[loc[b]:loc[b + 1]].transpose(0, 1)[None]                  # (1, Hq, q_len, D)
        outs.append(ref.attention_naive(qb, inp.k[b], inp.v[b], causal=True, scale=case.scale,
                                        dtype=dtype)[0].transpose(0, 1))
    return torch.cat(outs)


#: Query rows per block of :func:`causal_oracle` (its score tile is ROWS x seq_len float64).
ORACLE_ROWS = 512


def causal_oracle(inp: PrefillInputs, case: PrefillCase) -> torch.Tensor:
    """The PA-8 oracle, computed independently of the reference core (``masked_attention``, which
    the reference ``paged_prefill`` calls): float64, per sequence and per block of ORACLE_ROWS
    query rows, query i of a chunk of m over n keys (position p = n - m + i) weighs key t <= p by
    exp(s_t - max_t' s_t') and divides by the sum; (N, Hq, D) float64."""
    outs, loc = [], inp.query_start_loc.tolist()
    for b in range(case.B):
        k = inp.k[b][0].to(torch.float64).repeat_interleave(case.group, 0)   # (Hq, n, D)
        v = inp.v[b][0].to(torch.float64).repeat_interleave(case.group, 0)
        n, m = k.shape[1], loc[b + 1] - loc[b]
        for r0 in range(0, m, ORACLE_ROWS):
            r1 = min(m, r0 + ORACLE_ROWS)
            keys = n - m + r1                                                 # keys the block's last row sees
            q = inp.q[loc[b] + r0:loc[b] + r1].to(torch.float64)             # (rows, Hq, D)
            s = torch.einsum("ihd,htd->hit", q, k[:, :keys]) * case.scale    # (Hq, rows, keys)
            seen = torch.arange(keys)[None, :] <= (n - m + torch.arange(r0, r1))[:, None]
            s = torch.where(seen.to(s.device), s, -math.inf)
            w = torch.exp(s - s.amax(-1, keepdim=True))
            outs.append((torch.einsum("hit,htd->ihd", w, v[:, :keys]) / w.sum(-1).transpose(0, 1)[..., None]))
    return torch.cat(outs)


def check_against_causal(out, inp: PrefillInputs, case: PrefillCase, what: str = "mixed-batch output"):
    """The tolerance policy: ``out`` vs dense causal float64 attention over the contiguous K/V
    computed apart from the reference core (:func:`causal_oracle`, ``out_ref``) and, for 16-bit outputs, the same in the
    inputs' dtype (``out_pt``)."""
    q = inp.q
    assert isinstance(out, torch.Tensor), f"output is a {type(out).__name__}, not a tensor"
    assert out.shape == q.shape, f"output shape {tuple(out.shape)} != q's {tuple(q.shape)}"
    assert out.dtype == q.dtype, f"output dtype {out.dtype} != q's {q.dtype}"
    out_ref = causal_oracle(inp, case)
    out_pt = dense_causal(inp, case, None) if q.dtype in (torch.float16, torch.bfloat16) else None
    return assert_close(out, out_ref, out_pt=out_pt, what=what)


# ------------------------------------------------------------------ scale: many sequences, long chunks
#: The PA-8 law's name and the long-chunk law's, as the coverage classes name them.
_PA8, _LONG = ("law_prefill_equals_causal",), ("law_long_chunks",)
#: Chunk sizes of production servers (tokens per step): a chunk past each must be reached.
PRODUCTION_CHUNKS = (512, 2048, 8192)


def _prompt_before_decode(c) -> bool:
    first = next((i for i, m in enumerate(c.qlens) if m > 1), None)
    return first is not None and 1 in c.qlens[first + 1:]


#: Boundary classes of PA-8 beyond the contract's table (their laws' coverage is the contract's
#: ``COVERAGE`` plus these): more sequences than a search over 4 or a tile of QUERY_TILE holds,
#: a prompt (or chunk) ahead of a decode row, and chunks past each production chunk size.
SCALE_COVERAGE = (
    CoverageClass("more than 4 sequences", _PA8, lambda c: len(c.lens) > 4),
    # a path chosen for large batches that aligns a chunk's mask top-left is wrong only here
    CoverageClass("a chunk after a cached prefix in a batch of 5 or more", _PA8,
                  lambda c: len(c.lens) >= 5 and any(1 < m < n for n, m in zip(c.lens, c.qlens))),
    CoverageClass(f"more than {QUERY_TILE} sequences", _PA8, lambda c: len(c.lens) > QUERY_TILE),
    CoverageClass("a prompt or chunk before a decode row", _PA8, _prompt_before_decode),
    *(CoverageClass(f"chunk longer than {n} tokens", _LONG, lambda c, n=n: max(c.qlens) > n)
      for n in PRODUCTION_CHUNKS),
)


def _long(lens, qlens, D: int = 2, bs: int = 16, **kw) -> PrefillCase:
    return PrefillCase(tuple(lens), tuple(qlens), 1, 1, D, bs, 0.7 / math.sqrt(D), **kw)


#: Chunks past the production chunk sizes, one head of dim 2 (the cost is the chunk's): 513
#: tokens after a 40-token prefix beside a decode row, and 8,193 tokens (past 512, 2,048 and
#: 8,192) with a decode row ahead of it and one after. Measured under the interpreter (the Triton
#: kernel, one core): the 8,192-token chunk takes 270 s, 2,048 tokens 51 s, so an interpreted
#: kernel runs the 513-token case only (:func:`long_chunks_for`); every other implementation, and
#: the kernel compiled, runs both.
LONG_CHUNKS = (_long((553, 30), (513, 1), bs=16), _long((70, 8193, 9), (1, 8193, 1), bs=32))
#: Longest chunk an interpreted kernel is given in the long-chunk law.
INTERPRETED_CHUNK = 513


def long_chunks_for(interpreted: bool) -> tuple:
    """The long-chunk cases an implementation runs (see :data:`LONG_CHUNKS`)."""
    return tuple(c for c in LONG_CHUNKS if not interpreted or max(c.qlens) <= INTERPRETED_CHUNK)


def prefill_case(lens, qlens, Hq, Hkv, D, bs, c=0.7, **kw) -> PrefillCase:
    """A :class:`PrefillCase` of ``lens`` and ``qlens`` with the scale ``c / sqrt(D)``."""
    return PrefillCase(tuple(lens), tuple(qlens), Hq, Hkv, D, bs, c / math.sqrt(D), **kw)
