"""The ``paged_attention`` contract: decode attention over a paged KV cache (PagedAttention), and
the mixed batch of prefill chunks and decode tokens over the same cache (chunked prefill).

    paged_attention(q, k_cache, v_cache, block_table, seq_lens, *, scale: float) -> Tensor
    paged_prefill(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, *, scale: float) -> Tensor

(both with the optional keywords ``window``, ``softcap``, ``sinks`` of the attention contract)

Shapes: ``q`` (B, Hq, D), one new query per sequence; ``k_cache``, ``v_cache`` (num_blocks,
block_size, Hkv, D), the physical blocks of the cache; Hq is a multiple of Hkv and query head
``h`` reads KV head ``h // (Hq // Hkv)`` (GQA). ``block_table`` (B, max_blocks) int32: logical
block ``i`` of sequence ``b`` (its tokens ``i*block_size .. (i+1)*block_size - 1``) lives in
physical block ``block_table[b, i]``, so token ``t`` of sequence ``b`` is in slot
``t % block_size`` of physical block ``block_table[b, t // block_size]``. ``seq_lens`` (B,)
int32, each >= 1 and <= max_blocks * block_size. Returns (B, Hq, D) in ``q``'s dtype on ``q``'s
device:

    out[b, h] = sum_{t < seq_lens[b]} softmax_t(scale * q[b, h] . K_b[t, g(h)]) * V_b[t, g(h)]

where K_b, V_b are sequence b's tokens in logical order: the query attends to every one of its
``seq_lens[b]`` cached tokens (its own K/V already written), no other mask.

What an implementation must not read: table entries past ``ceil(seq_lens[b] / block_size)``
are unspecified (any value, out of range included), and slots past ``seq_lens[b]`` in the last
block hold garbage (the suite fills them with NaN); neither may affect the result.

Supported inputs: D from 1 to 256, block_size >= 1 (any, not only powers of two), dtypes
float64 / float32 / float16 / bfloat16 (q and both caches of one dtype, all tensors on one
device; any strides). An implementation may raise ``NotImplementedError`` for a (dtype, D,
block_size) it does not support: the suite reports "unsupported", never a pass. Invalid
arguments raise ``TypeError`` (wrong type or dtype) or ``ValueError`` (wrong shape, device or
value: a live table entry out of range, a length outside 1..capacity, caches whose block size
or head count disagree, Hq not a multiple of Hkv, a scale that is not finite or, for inputs
other than float64, whose magnitude float32 cannot hold (scores are computed in float32 there,
as in the attention contract)) naming the argument, before any kernel launch (``validate`` in
``conformance/contracts/paged_attention/validate.py``).

``paged_prefill`` (optional: an implementation that leaves it out refuses it with
``NotImplementedError``, reported "unsupported") is the mixed batch of one serving step, in the
shape of vLLM's unified attention and FlashInfer's batch prefill with paged KV: each of the B
sequences contributes q_len_b = query_start_loc[b+1] - query_start_loc[b] query tokens,
1 <= q_len_b <= seq_lens[b] (1: a decode token; more: a chunk of a prompt, C tokens at most
where C is the chunk size), the rows query_start_loc[b] .. query_start_loc[b+1] - 1 of ``q``
(N, Hq, D), N = query_start_loc[B]. ``query_start_loc`` (B + 1,) int32, starting at 0,
strictly increasing. The chunk's own K/V are already in the cache (written before attention):
they are the last q_len_b of the sequence's ``seq_lens[b]`` tokens, so the cached prefix holds
seq_lens[b] - q_len_b tokens and query i of the chunk is the token at position
p = seq_lens[b] - q_len_b + i. It attends causally, bottom-right aligned (the offset of the
cached prefix), to the keys t <= p:

    out[n, h] = sum_{t <= p(n)} softmax_t(scale * q[n, h] . K_b[t, g(h)]) * V_b[t, g(h)]

Returns (N, Hq, D) in ``q``'s dtype. With every q_len_b = 1 it is ``paged_attention``. What it
must not read, the supported inputs and the errors are those of ``paged_attention``; besides,
a ``query_start_loc`` that is not int32 raises TypeError, one of the wrong shape, not starting at
0, not strictly increasing, not ending at N, or with a q_len_b above seq_lens[b] raises
ValueError naming it (``paged_attention.validate.validate_prefill``).

Options (claim FA-8), as the attention contract defines them, with each query at its position
in its sequence (a decode query at seq_lens[b] - 1, a chunk's query i at p): ``window`` W (the
query sees the tokens t with p - W < t <= p), ``softcap`` c (scores c·tanh(s/c)) and ``sinks``
(Hq,) (one logit per query head in the denominator, weighing no value). Each optional: an
implementation whose function lacks the keyword, or raises ``NotImplementedError`` for a value,
is "unsupported" for it, never passed; wrong values raise as the attention contract's
``validate_options``.

Oracle: the float64 reference (``inference_conformance.reference.paged_attention.paged_attention``) gathers each sequence's
blocks into a contiguous cache and calls the reference attention (``paged_prefill``: the
masked reference attention with the chunk's causal mask); the laws compare every
implementation with dense attention over the contiguous K/V the pages were cut from.

Claims checked against this contract: PA-1 (attention through a block table over
non-contiguous blocks equals attention over the contiguous cache, for any block size and any
placement), PA-8 (the mixed batch: each chunk causal with the offset of its cached prefix, the
same as dense causal attention over the whole sequence). Source: Kwon et al. 2023 (vLLM,
PagedAttention), lecture 001 §4.2; Agrawal et al. 2024 (Sarathi-Serve, chunked prefill),
lecture 001 §4.5; FA-8 (the options, in the paged decode and mixed-batch kernels).
"""
from __future__ import annotations

import math

import torch

from inference_conformance.conformance.coverage import CoverageClass
from inference_conformance.conformance.registry import Contract, InvalidCall

#: Dtypes of the contract (an implementation may still refuse one with NotImplementedError).
DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
#: Largest head dimension of the contract.
MAX_HEAD_DIM = 256
#: Dtype of ``block_table`` and ``seq_lens``.
INDEX_DTYPE = torch.int32


def kv_bytes(seq_lens, Hkv: int, D: int, bytes_per_value: int) -> int:
    """Bytes of K and V a decode step must read: 2 · Σ seq_lens · Hkv · D · bytes per value."""
    return int(2 * int(torch.as_tensor(seq_lens).to(torch.int64).sum()) * Hkv * D * bytes_per_value)


def cases(seed: int, device: str) -> list[tuple[tuple, dict]]:
    """Small valid calls for the checks every contract gets (no input mutation, every output
    element written, identical repeats): GQA with an odd block size and a partial last block,
    block size 1, MQA over a shared block, float64 and 16-bit; blocks placed at random in a pool
    larger than needed, unused table entries out of range and unused slots NaN."""
    out = []
    for i, (lens, Hq, Hkv, D, bs, dt) in enumerate([
            ((5, 17), 4, 2, 59, 3, torch.float32),
            ((1, 9, 4), 3, 1, 16, 1, torch.float16),
            ((33,), 2, 2, 64, 16, torch.bfloat16),
            ((7, 2), 6, 2, 8, 5, torch.float64)]):
        g = torch.Generator().manual_seed(1000 * seed + i)
        B = len(lens)
        need = [-(-n // bs) for n in lens]
        max_blocks = max(need) + 1
        num_blocks = sum(need) + 3
        perm = torch.randperm(num_blocks, generator=g)
        table = torch.full((B, max_blocks), num_blocks + 7, dtype=torch.int32)     # unused: out of range
        kc = torch.full((num_blocks, bs, Hkv, D), float("nan"), dtype=torch.float64)
        vc = torch.full((num_blocks, bs, Hkv, D), float("nan"), dtype=torch.float64)
        used = 0
        for b, n in enumerate(lens):
            for j in range(need[b]):
                blk = int(perm[used])
                used += 1
                table[b, j] = blk
                m = min(bs, n - j * bs)
                kc[blk, :m] = torch.randn(m, Hkv, D, generator=g, dtype=torch.float64)
                vc[blk, :m] = torch.randn(m, Hkv, D, generator=g, dtype=torch.float64)
        q = torch.randn(B, Hq, D, generator=g, dtype=torch.float64)
        args = tuple(t.to(device=device, dtype=dt) for t in (q, kc, vc)) + (
            table.to(device), torch.tensor(lens, dtype=torch.int32, device=device))
        out.append((args, {"scale": D ** -0.5}))
    return out


# ----------------------------------------------------------------------------------------------
# coverage table: the boundary classes PA-1's law must hand every implementation in every profile
# ----------------------------------------------------------------------------------------------
#: PA-1's law (properties/paged_attention/test_paged_attention.py).
_PA1 = ("law_paged_equals_contiguous",)


def _any_length(test):
    """A class reached when some sequence length n of the call satisfies ``test(n, block_size)``."""
    return lambda c: any(test(n, c.block_size) for n in c.lens)


def _past_128(block_size: int) -> bool:
    """A block size above 128 that is not a multiple of 128 (144, 200)."""
    return block_size > 128 and block_size % 128 != 0


def _paged_coverage() -> tuple:
    out = [CoverageClass(f"block size {b}", _PA1, lambda c, b=b: c.block_size == b) for b in (1, 16, 32, 256)]
    out += [
        CoverageClass("odd block size", _PA1, lambda c: c.block_size % 2 == 1 and c.block_size > 1),
        CoverageClass("length 1", _PA1, _any_length(lambda n, bs: n == 1)),
        CoverageClass("length at a block multiple", _PA1, _any_length(lambda n, bs: bs > 1 and n % bs == 0)),
        CoverageClass("length block multiple - 1", _PA1,
                      _any_length(lambda n, bs: bs > 1 and n % bs == bs - 1 and n > bs)),
        CoverageClass("length block multiple + 1", _PA1, _any_length(lambda n, bs: bs > 1 and n % bs == 1 and n > bs)),
        CoverageClass("more than 64 blocks", _PA1, _any_length(lambda n, bs: -(-n // bs) > 64)),
        # a walk over each block in tiles of 128 slots skips the last block_size % 128 of each
        CoverageClass("block size > 128, not a multiple of 128, length at a block multiple", _PA1,
                      _any_length(lambda n, bs: _past_128(bs) and n % bs == 0 and n > bs)),
        CoverageClass("block size > 128, not a multiple of 128, length block multiple - 1", _PA1,
                      _any_length(lambda n, bs: _past_128(bs) and n % bs == bs - 1 and n > bs)),
        CoverageClass("block size > 128, not a multiple of 128, length block multiple + 1", _PA1,
                      _any_length(lambda n, bs: _past_128(bs) and n % bs == 1 and n > bs)),
        CoverageClass("more than 128 blocks", _PA1, _any_length(lambda n, bs: -(-n // bs) > 128)),
        CoverageClass("B > 1, different lengths", _PA1, lambda c: len(c.lens) > 1 and len(set(c.lens)) > 1),
        CoverageClass("group > 16, not a multiple of 16", _PA1,
                      lambda c: c.Hq // c.Hkv > 16 and (c.Hq // c.Hkv) % 16 != 0),
        CoverageClass("group not a power of two", _PA1,
                      lambda c: c.Hq // c.Hkv > 1 and (c.Hq // c.Hkv) & (c.Hq // c.Hkv - 1) != 0),
        # a scale folded into q in 16 bits moves large logits (~1e2)
        CoverageClass("large logits, scale not a power of two", _PA1,
                      lambda c: c.magnitude == "large" and c.scale != 0 and math.frexp(abs(c.scale))[0] != 0.5),
    ]
    out += [CoverageClass(f"head dim {d}", _PA1, lambda c, d=d: c.D == d) for d in (64, 72, 80, 96, 128, 192, 256)]
    return tuple(out)


#: PA-8's law of the mixed batch (properties/paged_attention/test_paged_attention.py).
_PA8 = ("law_prefill_equals_causal",)

#: Query tokens per program tile of a mixed-batch kernel that a chunk may exceed (16 is vLLM's
#: and the suite's kernel's).
QUERY_TILE = 16


def _prefill_coverage() -> tuple:
    def chunks(test):
        return lambda c: any(test(n, m, c.block_size) for n, m in zip(c.lens, c.qlens))
    return (
        CoverageClass("mixed batch: decode tokens and prefill chunks", _PA8,
                      lambda c: 1 in c.qlens and max(c.qlens) > 1),
        CoverageClass("chunk after a cached prefix", _PA8, chunks(lambda n, m, bs: 1 < m < n)),
        CoverageClass("whole prompt, no cached prefix", _PA8, chunks(lambda n, m, bs: 1 < m == n)),
        CoverageClass("chunk starting inside a block", _PA8, chunks(lambda n, m, bs: m > 1 and (n - m) % bs != 0)),
        CoverageClass("chunk crossing a block boundary", _PA8,
                      chunks(lambda n, m, bs: m > 1 and (n - m) // bs != (n - 1) // bs)),
        CoverageClass(f"chunk longer than a query tile ({QUERY_TILE})", _PA8,
                      chunks(lambda n, m, bs: m > QUERY_TILE)),
        CoverageClass("chunks of different lengths", _PA8, lambda c: len(set(m for m in c.qlens if m > 1)) > 1),
        CoverageClass("prefill block size 1", _PA8, lambda c: c.block_size == 1),
        CoverageClass("prefill odd block size", _PA8, lambda c: c.block_size % 2 == 1 and c.block_size > 1),
        CoverageClass("prefill group not a power of two", _PA8,
                      lambda c: c.Hq // c.Hkv > 1 and (c.Hq // c.Hkv) & (c.Hq // c.Hkv - 1) != 0),
    )


#: FA-8's laws of the options in the paged kernels (properties/paged_attention/laws/options.py).
_FA8_DECODE, _FA8_MIXED = ("law_paged_options_match_dense",), ("law_prefill_options_match_dense",)


def _options_coverage() -> tuple:
    """The dense table's FA-8 classes on paged calls, decode and mixed batch alike."""
    def win(test):
        return lambda c: c["window"] is not None and any(test(c["window"], n, m, c["block_size"])
                                                         for n, m in zip(c["lens"], c["qlens"]))
    classes = (
        ("window of one key (W = 1)", win(lambda w, n, m, bs: w == 1)),
        ("window crossing block edges (block size < W < n)", win(lambda w, n, m, bs: bs < w < n)),
        ("window at least a sequence's length (W >= n)", win(lambda w, n, m, bs: w >= n)),
        ("window hiding whole blocks (n - W >= block size)", win(lambda w, n, m, bs: n - w >= bs)),
        ("softcap below the largest logit", lambda c: c["softcap"] is not None and c["softcap"] < c["max_logit"]),
        ("softcap with a window", lambda c: c["softcap"] is not None and c["window"] is not None),
        ("sinks with GQA (Hq > Hkv)", lambda c: c["sinks"] is not None and c["Hq"] > c["Hkv"]),
        ("sinks above every row's largest logit (the sink dominates)", lambda c: c["sink_margin"] > 0))
    return (tuple(CoverageClass(f"FA-8 paged: {name}", _FA8_DECODE + _FA8_MIXED, pred) for name, pred in classes)
            + (CoverageClass("FA-8 paged: window on a chunk after a cached prefix", _FA8_MIXED,
                             win(lambda w, n, m, bs: 1 < m < n)),))


#: The paged_attention contract's coverage table. Observations are the calls' cases: objects with
#: ``lens`` (the sequence lengths), ``Hq``, ``Hkv``, ``D``, ``block_size``, ``scale`` and
#: ``magnitude`` ("large": integer-valued q, k of ~1e1, as inference_conformance.properties.paged_attention.cases.PagedCase);
#: PA-8's cases have ``qlens`` too (query tokens per sequence, inference_conformance.properties.paged_attention.cases.PrefillCase).
#: FA-8's laws observe dicts: ``lens``, ``qlens`` (1 per sequence in decode), ``Hq``, ``Hkv``,
#: ``block_size``, ``window``, ``softcap``, ``sinks`` (None, "mixed", "dominant"), ``max_logit``
#: (the largest uncapped |logit| a query sees) and ``sink_margin`` (the smallest, over heads, of the
#: sink minus the head's largest capped visible logit; -1 without sinks).
COVERAGE = _paged_coverage() + _prefill_coverage() + _options_coverage()


def invalid(device: str) -> list[InvalidCall]:
    """The calls this contract documents as invalid, with the argument each message must name:
    two sequences (lengths 5 and 3) in blocks of 2, Hq 4, Hkv 2, D 16, float32, scale 0.25."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 16, generator=g).to(device)
    kc, vc = (torch.randn(6, 2, 2, 16, generator=g).to(device) for _ in range(2))
    bt = torch.tensor([[0, 2, 4], [1, 3, 5]], dtype=torch.int32, device=device)
    sl = torch.tensor([5, 3], dtype=torch.int32, device=device)

    def i32(x):
        return torch.tensor(x, dtype=torch.int32, device=device)

    def table_with(idx, value):
        t = bt.clone()
        t[idx] = value
        return t

    calls = [  # (what, (q, k_cache, v_cache, block_table, seq_lens), raises, argument)
        ("q-not-a-tensor", (q.tolist(), kc, vc, bt, sl), TypeError, "q"),
        ("q-with-4-dims", (q[None], kc, vc, bt, sl), ValueError, "q"),
        ("int64-block-table", (q, kc, vc, bt.long(), sl), TypeError, "block_table"),
        ("int64-seq-lens", (q, kc, vc, bt, sl.long()), TypeError, "seq_lens"),
        ("float64-caches-float32-q", (q, kc.double(), vc.double(), bt, sl), TypeError, ("k_cache", "v_cache")),
        ("integer-caches", (q, kc.int(), vc.int(), bt, sl), TypeError, ("k_cache", "v_cache")),
        ("block-sizes-differ", (q, kc, vc[:, :1], bt, sl), ValueError, ("k_cache", "v_cache")),
        ("head-dims-differ", (q[..., :8], kc, vc, bt, sl), ValueError, ("q", "k_cache", "head dim")),
        ("hq-not-a-multiple-of-hkv", (q[:, :3], kc, vc, bt, sl), ValueError, ("q", "k_cache", "Hq", "Hkv", "heads")),
        ("seq-lens-0", (q, kc, vc, bt, i32([5, 0])), ValueError, "seq_lens"),
        ("seq-lens-above-capacity", (q, kc, vc, bt, i32([5, 7])), ValueError, "seq_lens"),
        ("seq-lens-shape", (q, kc, vc, bt, i32([5])), ValueError, "seq_lens"),
        ("block-table-rows", (q, kc, vc, bt[:1], sl), ValueError, "block_table"),
        ("live-entry-out-of-range", (q, kc, vc, table_with((1, 1), 6), sl), ValueError, "block_table"),
        ("live-entry-negative", (q, kc, vc, table_with((0, 2), -1), sl), ValueError, "block_table"),
    ]
    out = [InvalidCall(what, args, {"scale": 0.25}, (exc,), argument) for what, args, exc, argument in calls]
    out += [InvalidCall("scale-a-string", (q, kc, vc, bt, sl), {"scale": "0.25"}, (TypeError,), "scale"),
            InvalidCall("scale-inf", (q, kc, vc, bt, sl), {"scale": math.inf}, (ValueError,), "scale")]
    for what, kw, exc, argument in (("window-0", {"window": 0}, ValueError, "window"),
                                    ("softcap-negative", {"softcap": -1.0}, ValueError, "softcap"),
                                    ("sinks-per-kv-head", {"sinks": torch.zeros(1, device=device)}, ValueError, "sinks")):
        out.append(InvalidCall(what, (q, kc, vc, bt, sl), {"scale": 0.25, **kw}, (exc,), argument,
                               on=_taking(set(kw))))
    return out + _invalid_prefill(q, kc, vc, bt, sl)


def _taking(options: set):
    """``on`` of an invalid call with FA-8's ``options``: the implementation, or NotImplementedError
    ("unsupported") where its ``paged_attention`` lacks one of them."""
    def receiver(impl):
        from inference_conformance.conformance.contracts.attention import accepts_options

        lacking = sorted(options - accepts_options(getattr(impl, "paged_attention", impl)))
        if lacking:
            raise NotImplementedError(f"{getattr(impl, 'name', impl)} takes no {', '.join(lacking)} option")
        return impl
    return receiver


def _invalid_prefill(q, kc, vc, bt, sl) -> list[InvalidCall]:
    """``paged_prefill``'s bad calls over :func:`invalid`'s caches: the two sequences (lengths 5
    and 3) with chunks of 4 and 2 query tokens (query_start_loc [0, 4, 6]). An implementation that
    refuses the valid call first (it leaves ``paged_prefill`` out) is "unsupported" for them."""
    device = q.device
    qp = torch.randn(6, 4, 16, generator=torch.Generator().manual_seed(1)).to(device)

    def i32(x):
        return torch.tensor(x, dtype=torch.int32, device=device)

    loc = i32([0, 4, 6])

    def receiver(impl):
        impl.paged_prefill(qp, kc, vc, bt, sl, loc, scale=0.25)     # a refusal: NotImplementedError
        return impl

    calls = [  # (what, (q, k_cache, v_cache, block_table, seq_lens, query_start_loc), raises, argument)
        ("prefill-q-with-2-dims", (qp[:, 0], kc, vc, bt, sl, loc), ValueError, "q"),
        ("prefill-int64-query-start-loc", (qp, kc, vc, bt, sl, loc.long()), TypeError, "query_start_loc"),
        ("prefill-query-start-loc-a-list", (qp, kc, vc, bt, sl, [0, 4, 6]), TypeError, "query_start_loc"),
        ("prefill-query-start-loc-shape", (qp, kc, vc, bt, sl, i32([0, 6])), ValueError, "query_start_loc"),
        ("prefill-query-start-loc-not-from-0", (qp, kc, vc, bt, sl, i32([1, 4, 6])), ValueError, "query_start_loc"),
        ("prefill-empty-chunk", (qp, kc, vc, bt, sl, i32([0, 0, 6])), ValueError, "query_start_loc"),
        ("prefill-query-start-loc-not-ending-at-n", (qp, kc, vc, bt, sl, i32([0, 4, 5])), ValueError,
         "query_start_loc"),
        ("prefill-chunk-longer-than-seq-len", (qp, kc, vc, bt, sl, i32([0, 2, 6])), ValueError, "query_start_loc"),
        ("prefill-seq-lens-0", (qp, kc, vc, bt, i32([5, 0]), loc), ValueError, "seq_lens"),
        ("prefill-live-entry-out-of-range", (qp, kc, vc, bt.clone().index_fill_(1, torch.tensor([1], device=device), 6),
                                             sl, loc), ValueError, "block_table"),
        ("prefill-float64-caches", (qp, kc.double(), vc.double(), bt, sl, loc), TypeError, ("k_cache", "v_cache")),
    ]
    out = [InvalidCall(what, args, {"scale": 0.25}, (exc,), argument, function="paged_prefill", on=receiver)
           for what, args, exc, argument in calls]
    out.append(InvalidCall("prefill-scale-inf", (qp, kc, vc, bt, sl, loc), {"scale": math.inf}, (ValueError,),
                           "scale", function="paged_prefill", on=receiver))
    return out


CONTRACT = Contract(
    technique="paged_attention",
    functions=("paged_attention",),
    optional=("paged_prefill",),
    doc=__doc__,
    cases=cases,
    returns={"paged_attention": torch.Tensor, "paged_prefill": torch.Tensor},
    invalid=invalid,
)
