"""Reference attention: softmax (textbook and max-subtracted), online softmax, naive attention,
FlashAttention's blocked algorithm in plain PyTorch, split-KV merging, and the HBM-traffic model.

Everything here is written to be read: loops where the algorithm has loops, float64-capable.
Sources: lecture 001 §3 (online softmax, tiled attention, the traffic model, exercises 3 and 4);
Milakov & Gimelshein 2018 (online softmax); Dao et al. 2022 and Dao 2023 (FlashAttention 1/2);
Dao et al. 2023 (Flash-Decoding). Claims FA-1 .. FA-7 of CLAIMS.md.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from inference_conformance.conformance.contracts.attention import validate, window_mask

# ----------------------------------------------------------------------------------------------
# softmax and online softmax (FA-1, FA-2)
# ----------------------------------------------------------------------------------------------


def softmax_textbook(x: torch.Tensor) -> torch.Tensor:
    """exp(x_i) / sum_j exp(x_j) over the last dim, as printed in textbooks: overflows to
    inf/inf = nan once an entry passes ~88 (float32) or ~709 (float64). FA-1."""
    e = torch.exp(x)
    return e / e.sum(dim=-1, keepdim=True)


def _safe_max(m: torch.Tensor) -> torch.Tensor:
    """m with -inf replaced by 0, so that exp(x - m) is 0 (not nan) for rows that are all -inf so far."""
    return torch.where(torch.isneginf(m), torch.zeros_like(m), m)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Numerically stable softmax over the last dim: exp(x_i - m) / sum_j exp(x_j - m), m = max x.
    Entries of -inf get probability 0; a row of only -inf gives nan (0/0). FA-1."""
    m = _safe_max(x.max(dim=-1, keepdim=True).values)  # (..., 1)
    e = torch.exp(x - m)
    return e / e.sum(dim=-1, keepdim=True)


def softmax_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One-pass (two-sweep) statistics of the last dim: m = max x, l = sum exp(x - m)."""
    m = x.max(dim=-1).values
    l = torch.exp(x - _safe_max(m)[..., None]).sum(dim=-1)
    return m, l


def _chunk_sizes(n: int, chunks: int | Sequence[int]) -> list[int]:
    if isinstance(chunks, int):
        if chunks < 1:
            raise ValueError(f"chunk size must be >= 1, got {chunks}")
        return [min(chunks, n - s) for s in range(0, n, chunks)]
    sizes = [int(c) for c in chunks]
    if any(c < 1 for c in sizes) or sum(sizes) != n:
        raise ValueError(f"chunks must be positive sizes summing to {n}, got {sizes}")
    return sizes


def online_softmax(x: torch.Tensor, chunks: int | Sequence[int], *, trace: list | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Softmax over the last dim, reading x one chunk at a time (Milakov & Gimelshein 2018).

    Keeps the running maximum m and the running sum l = sum exp(x - m); when a chunk raises the
    maximum, the sum so far is rescaled by exp(m - m'):

        m' = max(m, max(chunk)),   l' = l * exp(m - m') + sum_{x in chunk} exp(x - m')

    ``chunks``: a chunk size, or the list of chunk sizes (summing to x.shape[-1]).
    Returns (p, m, l): p the softmax (x's shape), m and l of shape x.shape[:-1]. With ``trace``
    (a list), appends (m, l) after each chunk. Raises ValueError for bad chunks. FA-2 (lecture 001 §3.2, exercise 3).
    """
    n = x.shape[-1]
    m = torch.full(x.shape[:-1], -math.inf, dtype=x.dtype, device=x.device)
    l = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    start = 0
    for size in _chunk_sizes(n, chunks):
        c = x[..., start:start + size]                          # (..., size)
        m_new = torch.maximum(m, c.max(dim=-1).values)
        m_safe = _safe_max(m_new)
        l = l * torch.exp(m - m_safe) + torch.exp(c - m_safe[..., None]).sum(dim=-1)
        m = m_new
        start += size
        if trace is not None:
            trace.append((m.clone(), l.clone()))
    p = torch.exp(x - _safe_max(m)[..., None]) / l[..., None]
    return p, m, l


def online_softmax_trace(x: Sequence[float], chunks: Sequence[int]) -> list[tuple[float, float]]:
    """(m, l) after each chunk of a 1-D list, in float64, for hand-worked examples (exercise 3)."""
    trace: list = []
    online_softmax(torch.tensor(list(x), dtype=torch.float64), chunks, trace=trace)
    return [(float(m), float(l)) for m, l in trace]


# ----------------------------------------------------------------------------------------------
# attention
# ----------------------------------------------------------------------------------------------


def _expand_kv(k: torch.Tensor, Hq: int) -> torch.Tensor:
    """(B, Hkv, T, D) -> (B, Hq, T, D): query head h reads KV head h // (Hq // Hkv)."""
    group = Hq // k.shape[1]
    return k.repeat_interleave(group, dim=1) if group > 1 else k


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
                     mask: torch.Tensor | None = None, softmax_dtype: torch.dtype | None = None,
                     softmax_fn=None, softcap: float | None = None,
                     sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The one attention core of every reference in the suite: softmax(scale · q kᵀ, masked) · v.

    Shapes (glossary: ``conformance/contracts/glossary.py``): ``q`` (..., Hq, Tq, D); ``k``
    (..., Hkv, Tk, D); ``v`` (..., Hkv, Tk, Dv), with Hq a multiple of Hkv: query head h reads
    KV head h // (Hq // Hkv) (GQA; K and V are not repeated). ``mask``: bool, broadcastable to
    (..., Hq, Tq, Tk), True where the query may attend the key (None: every key). Returns
    (..., Hq, Tq, Dv) in v's dtype.

    The scores are computed in q's dtype (no upcast: pass float64 tensors for the oracle, 16-bit
    ones for the naive same-dtype ``out_pt``); the softmax runs in ``softmax_dtype`` (default:
    q's dtype) with ``softmax_fn`` (default: the stable :func:`softmax`, FA-1), and the
    probabilities are cast to v's dtype before P·V. A row with no visible key gives NaN (0/0).
    ``softcap`` c: the scores become c·tanh(s / c) before the mask; ``sinks`` (Hq,): one logit
    per query head joins each row's softmax as one more column (in the scores' dtype, neither
    scaled nor capped) whose probability is dropped: it weighs no value (claim FA-8).

    Used by the attention reference (``attention_naive``), the reference transformer, the engines'
    torch attention, the KV-cache variants (sliding window, CLA, MLA) and the bug zoo. Raises
    ValueError when the head counts or head dims do not fit together.
    """
    Hq, Hkv = q.shape[-3], k.shape[-3]
    if Hkv < 1 or Hq % Hkv or v.shape[-3] != Hkv:
        raise ValueError(f"q heads ({Hq}) must be a multiple of k/v heads (k {Hkv}, v {v.shape[-3]})")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: q and k must share D, "
                         "k and v must share Tk")
    group = Hq // Hkv
    if mask is not None:
        while mask.dim() < q.dim():
            mask = mask[None]
    if group > 1:                                    # (..., Hkv, G, T, ·): GQA without copies
        q = q.unflatten(-3, (Hkv, group))
        k, v = k.unsqueeze(-3), v.unsqueeze(-3)
        if mask is not None:
            mask = mask.unflatten(-3, (Hkv, group)) if mask.shape[-3] == Hq else mask.unsqueeze(-3)
    s = (q @ k.transpose(-1, -2)) * scale                        # (..., Tq, Tk)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf)
    s = s.to(softmax_dtype or s.dtype)
    if sinks is not None:                                         # (Hq,) -> one more column
        sink = sinks.to(s.dtype).reshape((Hkv, group, 1, 1) if group > 1 else (Hq, 1, 1))
        s = torch.cat([s, sink.expand(*s.shape[:-1], 1)], dim=-1)  # (..., Tq, Tk + 1)
    p = (softmax_fn or softmax)(s)                                # (..., Tq, Tk[+1])
    if sinks is not None:
        p = p[..., :-1]
    out = p.to(v.dtype) @ v                                       # (..., Tq, Dv)
    return out.flatten(-4, -3) if group > 1 else out


def attention_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                    scale: float, dtype: torch.dtype | None = None, window: int | None = None,
                    softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Standard attention, materialising the (Tq, Tk) score matrix S and probabilities P.

    Computed in ``dtype`` (default: q's dtype; 16-bit inputs give the naive same-dtype result
    ``out_pt`` of the tolerance policy); returns (B, Hq, Tq, D) in that dtype. The options
    ``window``, ``softcap``, ``sinks`` as the contract defines them (FA-8). Shapes and errors
    as in the attention contract.
    """
    shape = validate(q, k, v, causal, scale, window, softcap, sinks)
    dt = dtype or q.dtype
    mask = window_mask(shape.Tq, shape.Tk, window, q.device) if causal else None
    return masked_attention(q.to(dt), k.to(dt), v.to(dt), scale=scale, mask=mask, softcap=softcap,
                            sinks=sinks)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
              scale: float, window: int | None = None, softcap: float | None = None,
              sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The "reference" implementation of the contract: naive attention computed in float64,
    returned in q's dtype, every option included. (B, Hq, Tq, D)."""
    return attention_naive(q, k, v, causal=causal, scale=scale, dtype=torch.float64, window=window,
                           softcap=softcap, sinks=sinks).to(q.dtype)


def blocked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                      scale: float, block_q: int | None = None, block_k: int = 64,
                      return_lse: bool = False):
    """FlashAttention's forward pass, step by step, in plain PyTorch (lecture 001 §3.2).

    For each block of ``block_q`` queries (None: all queries at once) keep (m, l, acc); for each
    block of ``block_k`` keys:

        s = q K_blockᵀ · scale,  m' = max(m, rowmax s),  p = exp(s - m'),
        acc = acc · exp(m - m') + p V_block,  l = l · exp(m - m') + rowsum p

    and write acc / l. Key blocks entirely above the causal diagonal are skipped. Computes in
    float64 for float64 inputs, else float32; returns (B, Hq, Tq, D) in q's dtype, and with
    ``return_lse`` also the log-sum-exp of each row's scores, (B, Hq, Tq) float. Raises as the
    contract does, and ValueError for block sizes < 1.
    """
    shape = validate(q, k, v, causal, scale)
    if block_q is None:
        block_q = shape.Tq
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be >= 1, got block_q={block_q}, block_k={block_k}")
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    qf = q.to(acc_dtype)
    kf = _expand_kv(k.to(acc_dtype), shape.Hq)                  # (B, Hq, Tk, D)
    vf = _expand_kv(v.to(acc_dtype), shape.Hq)
    offset = shape.Tk - shape.Tq
    out = torch.empty(shape.B, shape.Hq, shape.Tq, shape.D, dtype=acc_dtype, device=q.device)
    lse = torch.empty(shape.B, shape.Hq, shape.Tq, dtype=acc_dtype, device=q.device)
    for i0 in range(0, shape.Tq, block_q):
        i1 = min(i0 + block_q, shape.Tq)
        qi = qf[:, :, i0:i1]                                      # (B, Hq, bq, D)
        m = torch.full(qi.shape[:-1], -math.inf, dtype=acc_dtype, device=q.device)  # (B, Hq, bq)
        l = torch.zeros_like(m)
        acc = torch.zeros_like(qi)                                # (B, Hq, bq, D)
        j_end = min(shape.Tk, i1 + offset) if causal else shape.Tk
        for j0 in range(0, j_end, block_k):
            j1 = min(j0 + block_k, shape.Tk)
            s = (qi @ kf[:, :, j0:j1].transpose(-1, -2)) * scale  # (B, Hq, bq, bk)
            if causal:
                allowed = (torch.arange(j0, j1, device=q.device)[None, :]
                           <= torch.arange(i0, i1, device=q.device)[:, None] + offset)
                s = s.masked_fill(~allowed, -math.inf)
            m_new = torch.maximum(m, s.max(dim=-1).values)
            m_safe = _safe_max(m_new)
            alpha = torch.exp(m - m_safe)                          # (B, Hq, bq)
            p = torch.exp(s - m_safe[..., None])                   # (B, Hq, bq, bk)
            acc = acc * alpha[..., None] + p @ vf[:, :, j0:j1]
            l = l * alpha + p.sum(dim=-1)
            m = m_new
        out[:, :, i0:i1] = acc / l[..., None]
        lse[:, :, i0:i1] = m + torch.log(l)
    out = out.to(q.dtype)
    return (out, lse) if return_lse else out


def merge_partials(o: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Merge split-KV partial results exactly (Flash-Decoding).

    ``o``: (S, ...rows, D) partial outputs, each normalised over its own keys; ``lse``: (S,
    ...rows) their log-sum-exps (-inf for a split with no visible key). Returns (...rows, D):
    sum_s w_s o_s with w_s = exp(lse_s - max lse) / sum_s exp(lse_s - max lse). FA-7.
    """
    m = _safe_max(lse.max(dim=0).values)                       # (...rows)
    w = torch.exp(lse - m)                                      # (S, ...rows)
    w = w / w.sum(dim=0)
    return (w[..., None] * torch.nan_to_num(o)).sum(dim=0)


def split_kv_attention(q, k, v, *, causal: bool, scale: float, num_splits: int = 4):
    """Split-KV attention in plain PyTorch: the keys are cut into ``num_splits`` contiguous
    ranges, each range's (o, lse) computed by :func:`blocked_attention`, and the partials
    merged with :func:`merge_partials`. Same result as unsplit attention. (B, Hq, Tq, D)."""
    shape = validate(q, k, v, causal, scale)
    if not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"num_splits must be an int >= 1, got {num_splits!r}")
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    bounds = torch.linspace(0, shape.Tk, min(num_splits, shape.Tk) + 1).round().long().tolist()
    offset = shape.Tk - shape.Tq
    os, lses = [], []
    for j0, j1 in zip(bounds[:-1], bounds[1:]):
        # a split is plain (non-causal) attention over its keys, with the causal mask applied
        # by position; computed from the scores so that rows with no visible key give lse=-inf.
        kf = _expand_kv(k[:, :, j0:j1].to(acc_dtype), shape.Hq)
        vf = _expand_kv(v[:, :, j0:j1].to(acc_dtype), shape.Hq)
        s = (q.to(acc_dtype) @ kf.transpose(-1, -2)) * scale    # (B, Hq, Tq, j1-j0)
        if causal:
            allowed = (torch.arange(j0, j1, device=q.device)[None, :]
                       <= torch.arange(shape.Tq, device=q.device)[:, None] + offset)
            s = s.masked_fill(~allowed, -math.inf)
        lse = torch.logsumexp(s, dim=-1)                         # (B, Hq, Tq)
        os.append(torch.exp(s - _safe_max(lse)[..., None]) @ vf)
        lses.append(lse)
    return merge_partials(torch.stack(os), torch.stack(lses)).to(q.dtype)


# ----------------------------------------------------------------------------------------------
# HBM traffic and intermediate-memory model (FA-4, FA-5; lecture 001 §3.4, exercise 4)
# ----------------------------------------------------------------------------------------------


def standard_attention_traffic(T: int, d: int) -> dict[str, int]:
    """Elements read from / written to HBM by standard attention, one head, T queries and keys,
    head dim d: Q, K read; S written, read by softmax; P written, read with V; O written.
    Sum ≈ 4Td + 4T² (lecture 001 §3.4). FA-4."""
    return {"read Q": T * d, "read K": T * d, "write S": T * T, "read S": T * T,
            "write P": T * T, "read P": T * T, "read V": T * d, "write O": T * d}


def flash_attention_traffic(T: int, d: int, block: int) -> dict[str, int]:
    """Elements moved by FlashAttention-2's loop order, one head: each block of ``block``
    query rows is read once and stays on chip while every K and V block streams past; its output
    is written once. Counted by walking the loops; sum ≈ 2Td·(T/B) + 2Td. FA-4."""
    counts = {"read Q": 0, "read K": 0, "read V": 0, "write O": 0}
    for i0 in range(0, T, block):
        rows = min(block, T - i0)
        counts["read Q"] += rows * d
        for j0 in range(0, T, block):
            cols = min(block, T - j0)
            counts["read K"] += cols * d
            counts["read V"] += cols * d
        counts["write O"] += rows * d
    return counts


def score_matrix_bytes(T: int, bytes_per_value: int) -> int:
    """Bytes of the (T, T) score matrix S that standard attention stores for one head. FA-5."""
    return T * T * bytes_per_value


def flash_score_bytes(T: int, block: int, bytes_per_value: int) -> int:
    """Bytes of scores FlashAttention holds at any time for one head (T x block, on chip in
    practice, never written to HBM): linear in T. FA-5 (exercise 4b)."""
    return T * block * bytes_per_value


def implementations():
    """The attention reference (float64-capable naive softmax attention), for the registry."""
    from inference_conformance.conformance.registry import builtin

    return (builtin("attention", "reference", attention, batch_invariant=True),)
