"""Batch invariance, measured for every implementation of the contracts that take a batch.

One request's output is computed alone (B = 1), then inside batches of drawn sizes with the
request at a drawn index among other drawn requests (same shapes for ``attention``; other
sequence or prefix lengths for ``paged_attention``, ``mla_decode`` and ``tree_attention``, whose
batches mix lengths, so an
implementation that picks its split-KV partition from the batch picks other splits there), and
the request's rows are compared bitwise: a request's result must not depend on what is batched
with it (vLLM's ``VLLM_BATCH_INVARIANT``, SGLang's deterministic mode). Beyond rounding, every
output of the request (alone and in each batch) is also judged against the float64 reference of
the request alone by the tolerance policy's rule for the case's dtype: a row outside that bound
is a wrong answer, whatever the implementation declares; only differences between rows within
the bound are the property "not invariant".

:func:`measure` returns a :class:`Measurement`: ``invariant`` (every batch gave the request's
rows bit for bit), ``max_diff`` (the largest absolute difference seen, 0.0 where invariant;
inf where NaN appeared on one side only), ``worst`` (the batch that showed it), ``bound`` (the
rule's bound at the request's scale) and ``wrong`` (the worst failing verdict, "" where every
output is within the bound). The pinned
cases (:data:`CASES`) are small, so ``ci`` runs them all in seconds under the interpreter.

``properties/test_batch_invariance.py`` runs it over the registry; :data:`ZOO` holds the
known-bad implementation that shows the enforcement can fail; :data:`GPU_POLICY_CASE` and
:func:`splitkv_at_gpu_policy` pin, on any device, the split count the split-KV kernel's GPU
policy picks by B, where its default mode is measured not invariant and its batch-invariant mode
(``triton_splitkv_invariant``) is.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from inference_conformance.conformance import tolerance
from inference_conformance.properties.attention.zoo import top_left_causal_in_large_batches

#: The techniques whose contracts take a batch of independent requests.
TECHNIQUES = ("attention", "paged_attention", "mla_decode", "tree_attention")
#: (batch size, seed) of the batches each request is measured in; the request's index and the
#: other requests' lengths are drawn from the seed.
BATCHES = ((2, 11), (3, 12), (5, 13), (8, 14))

_INT_VIEW = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
             torch.bfloat16: torch.int16}


@dataclass(frozen=True)
class Measurement:
    """What :func:`measure` saw for one implementation over one pinned case: ``invariant``,
    ``max_diff`` (largest absolute difference of the request's rows, in output units) and
    ``worst`` (the batch that showed it, "" where invariant), ``batches`` (batches compared),
    ``bound`` (the tolerance rule's bound against the float64 reference, output units) and
    ``wrong`` (the message of the worst output outside it: a wrong answer; "" where none)."""

    invariant: bool
    max_diff: float
    worst: str
    batches: int
    bound: float = 0.0
    wrong: str = ""


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` hold the same bits (NaN payloads and the sign of zero included).
    Raises ValueError naming ``b`` for another shape or dtype."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"b must match a: {tuple(b.shape)} {b.dtype} vs {tuple(a.shape)} {a.dtype}")
    view = _INT_VIEW.get(a.dtype)
    if view is None:
        return torch.equal(a, b)
    return torch.equal(a.contiguous().view(view), b.contiguous().view(view))


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| in float64; inf where one side is NaN and the other is not."""
    x, y = a.double(), b.double()
    nan = torch.isnan(x) != torch.isnan(y)
    if bool(nan.any()):
        return math.inf
    d = (x - y).abs().nan_to_num(nan=0.0)
    return float(d.max()) if d.numel() else 0.0


# ---------------------------------------------------------------------------------- requests
@dataclass(frozen=True)
class Case:
    """One pinned case: the technique, its sizes and dtype. ``sizes`` keys by technique:
    attention ``Hq, Hkv, Tq, Tk, D, causal``; paged_attention ``Hq, Hkv, D, block_size, L``
    (the request's length; the others draw theirs from 1..``Lmax``); mla_decode ``Hq, D, C, R,
    block_size, L, Lmax, paged``; tree_attention ``Hq, Hkv, D, parents, L, Lmax`` (L: the request's
    prefix length, the others' drawn from 1..``Lmax``; one tree for the batch)."""

    technique: str
    name: str
    sizes: dict
    dtype: torch.dtype = torch.float32


CASES = (
    Case("attention", "gqa-causal", dict(Hq=4, Hkv=2, Tq=5, Tk=37, D=16, causal=True)),
    Case("attention", "decode", dict(Hq=2, Hkv=1, Tq=1, Tk=70, D=32, causal=False)),
    Case("paged_attention", "gqa-bs4", dict(Hq=4, Hkv=2, D=16, block_size=4, L=37, Lmax=90)),
    Case("paged_attention", "mha-bs16", dict(Hq=2, Hkv=2, D=32, block_size=16, L=150, Lmax=300)),
    Case("mla_decode", "paged", dict(Hq=2, D=8, C=16, R=4, block_size=4, L=37, Lmax=90, paged=True)),
    Case("mla_decode", "contiguous", dict(Hq=3, D=8, C=16, R=4, block_size=0, L=21, Lmax=60, paged=False)),
    Case("tree_attention", "gqa-binary", dict(Hq=4, Hkv=2, D=16, parents=(-1, -1, 0, 0, 1, 1), L=19, Lmax=40)),
)


def _randn(gen, shape, dtype, device):
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device)


def _request(case: Case, gen: torch.Generator, length: int, device: str) -> dict:
    """One request's own tensors (no batch dimension)."""
    s, dt = case.sizes, case.dtype
    if case.technique == "attention":
        return dict(q=_randn(gen, (s["Hq"], s["Tq"], s["D"]), dt, device),
                    k=_randn(gen, (s["Hkv"], s["Tk"], s["D"]), dt, device),
                    v=_randn(gen, (s["Hkv"], s["Tk"], s["D"]), dt, device))
    if case.technique == "paged_attention":
        return dict(q=_randn(gen, (s["Hq"], s["D"]), dt, device),
                    k=_randn(gen, (length, s["Hkv"], s["D"]), dt, device),
                    v=_randn(gen, (length, s["Hkv"], s["D"]), dt, device))
    if case.technique == "tree_attention":
        n = len(s["parents"])
        return dict(q=_randn(gen, (s["Hq"], n, s["D"]), dt, device),
                    k=_randn(gen, (s["Hkv"], length + n, s["D"]), dt, device),
                    v=_randn(gen, (s["Hkv"], length + n, s["D"]), dt, device))
    return dict(q_nope=_randn(gen, (s["Hq"], s["D"]), dt, device),
                q_rope=_randn(gen, (s["Hq"], s["R"]), dt, device),
                cache=_randn(gen, (length, s["C"] + s["R"]), dt, device))


def _pages(tokens: list[torch.Tensor], block_size: int, seed: int):
    """Cut each sequence's tokens (L_b, ...) into blocks of ``block_size`` placed at shuffled
    physical blocks (a permutation drawn from ``seed``); slots past a sequence's length hold NaN.
    Returns (cache, block_table)."""
    counts = [-(-t.shape[0] // block_size) for t in tokens]
    order = torch.randperm(sum(counts), generator=torch.Generator().manual_seed(seed)).tolist()
    first = tokens[0]
    cache = torch.full((sum(counts), block_size, *first.shape[1:]), math.nan, dtype=first.dtype,
                       device=first.device)
    table = torch.zeros((len(tokens), max(counts)), dtype=torch.int32)
    n = 0
    for b, t in enumerate(tokens):
        for i in range(counts[b]):
            blk = order[n]
            n += 1
            part = t[i * block_size:(i + 1) * block_size]
            cache[blk, : part.shape[0]] = part
            table[b, i] = blk
    return cache, table.to(first.device)


def _call(impl, case: Case, reqs: list[dict], seed: int, shared: dict) -> torch.Tensor:
    """Call ``impl`` on the batch of ``reqs`` (in order; pages placed by ``seed``); returns its
    output (B, ...)."""
    s, dev = case.sizes, reqs[0][next(iter(reqs[0]))].device
    if case.technique == "attention":
        q, k, v = (torch.stack([r[n] for r in reqs]) for n in ("q", "k", "v"))
        return impl(q, k, v, causal=s["causal"], scale=1 / math.sqrt(s["D"]))
    if case.technique == "tree_attention":
        n, width = len(s["parents"]), max(r["k"].shape[1] for r in reqs)
        kc, vc = (torch.full((len(reqs), s["Hkv"], width + 1, s["D"]), math.nan, dtype=case.dtype, device=dev)
                  for _ in range(2))
        for b, r in enumerate(reqs):
            kc[b, :, : r["k"].shape[1]], vc[b, :, : r["v"].shape[1]] = r["k"], r["v"]
        lens = torch.tensor([r["k"].shape[1] - n for r in reqs], dtype=torch.int64, device=dev)
        q = torch.stack([r["q"] for r in reqs])
        return impl(q, kc, vc, torch.tensor(s["parents"], device=dev), lens, scale=1 / math.sqrt(s["D"]))
    lens = torch.tensor([r[next(n for n in r if n in ("k", "cache"))].shape[0] for r in reqs], dtype=torch.int32,
                        device=dev)
    if case.technique == "paged_attention":
        kc, table = _pages([r["k"] for r in reqs], s["block_size"], seed)
        vc, _ = _pages([r["v"] for r in reqs], s["block_size"], seed)
        q = torch.stack([r["q"] for r in reqs])
        return impl(q, kc, vc, table, lens, scale=1 / math.sqrt(s["D"]))
    qn, qr = torch.stack([r["q_nope"] for r in reqs]), torch.stack([r["q_rope"] for r in reqs])
    if s["paged"]:
        cache, table = _pages([r["cache"] for r in reqs], s["block_size"], seed)
    else:
        cache = torch.full((len(reqs), int(lens.max()), s["C"] + s["R"]), math.nan, dtype=case.dtype, device=dev)
        for b, r in enumerate(reqs):
            cache[b, : r["cache"].shape[0]] = r["cache"]
        table = None
    return impl(qn, qr, shared["w_uk"], cache, table, lens, scale=1 / math.sqrt(s["D"] + s["R"]), rope_theta=10000.0)


def _out_ref(case: Case, mine: dict, shared: dict) -> torch.Tensor:
    """The float64 reference (``reference/<technique>.py``) of the request alone."""
    import importlib

    fn = getattr(importlib.import_module(f"inference_conformance.reference.{case.technique}"), case.technique)
    wide = {n: t.double() for n, t in mine.items()}
    return _call(fn, dataclasses.replace(case, dtype=torch.float64), [wide], 7,
                 {n: t.double() for n, t in shared.items()})[0]


def measure(impl: Callable[..., Any], case: Case, device: str, batches=BATCHES) -> Measurement:
    """Measure whether ``impl`` (an implementation of ``case.technique``) gives the request of
    ``case`` the same bits alone and inside each of ``batches`` ((size, seed): the request at
    an index drawn from the seed, the other requests drawn, their lengths drawn in
    1..``Lmax`` for the paged contracts), and judge each of its outputs against the float64
    reference of the request alone by the tolerance rule of ``case.dtype`` (``wrong``). A
    ``NotImplementedError`` of ``impl`` propagates (the caller reports "unsupported"). Raises
    ValueError naming ``case`` for an unknown technique."""
    if case.technique not in TECHNIQUES:
        raise ValueError(f"case must be of {TECHNIQUES}, got {case.technique!r}")
    s = case.sizes
    gen = torch.Generator().manual_seed(1234)
    shared = {}
    if case.technique == "mla_decode":
        shared["w_uk"] = _randn(gen, (s["Hq"], s["C"], s["D"]), case.dtype, device) / math.sqrt(s["C"])
    mine = _request(case, gen, s.get("L", 0), device)
    alone = _call(impl, case, [mine], 7, shared)[0]
    out_ref, rule = _out_ref(case, mine, shared), tolerance.rule_for(case.dtype)
    verdicts = [rule.judge(alone, out_ref, None, f"{case.name}: the request alone")]
    worst, max_diff, invariant = "", 0.0, True
    for size, seed in batches:
        g = torch.Generator().manual_seed(seed)
        index = int(torch.randint(size, (1,), generator=g))
        lens = torch.randint(1, s.get("Lmax", 1) + 1, (size,), generator=g).tolist()
        reqs = [mine if b == index else _request(case, g, lens[b], device) for b in range(size)]
        row = _call(impl, case, reqs, seed, shared)[index]
        verdicts.append(rule.judge(row, out_ref, None, f"{case.name}: the request at index {index} of B={size}"))
        if not bitwise_equal(alone, row):
            d = max_abs_diff(alone, row)
            invariant = False
            if d >= max_diff:
                rest = [x for i, x in enumerate(lens) if i != index]
                others = "" if case.technique == "attention" else f" (other lengths {rest})"
                max_diff, worst = d, f"{case.name}: B={size} at index {index}{others}"
    bad = max(verdicts, key=lambda v: v.ratio)
    return Measurement(invariant, max_diff, worst, len(batches), verdicts[0].bound, "" if bad.ok else bad.message())


# ------------------------------------------------------------- the default against the invariant mode
#: A dense decode case long enough (Tk = 2 x MIN_KEYS_PER_SPLIT) for the GPU's split policy to
#: choose by B: on a GPU of GPU_POLICY_SMS multiprocessor (two programs wanted) it gives the
#: request 2 splits alone and 1 in any larger batch (the interpreter's own choice is 2 for every
#: batch, so CPU runs pin the GPU's; a larger GPU makes the same switch at a larger B).
GPU_POLICY_CASE = Case("attention", "gpu-policy", dict(Hq=1, Hkv=1, Tq=1, Tk=512, D=16, causal=False))
GPU_POLICY_SMS = 1


def splitkv_at_gpu_policy(q, k, v, *, causal, scale):
    """The "triton_splitkv" kernel at the split count its GPU policy picks for this batch on a GPU
    of GPU_POLICY_SMS multiprocessors (``flash_decoding.gpu_num_splits``): what the default mode
    does on such a GPU, run on any device."""
    from inference_conformance.optimized.attention import flash_decoding as fd

    B, Hq, Tq, D = q.shape
    bm = fd._blocks(q.dtype, D, Tq)[0]
    splits = fd.gpu_num_splits(B, Hq, Tq, k.shape[2], bm, GPU_POLICY_SMS)
    return fd.flash_decoding(q, k, v, causal=causal, scale=scale, num_splits=splits)


# --------------------------------------------------------------------------------------- zoo
def chunked_by_batch_size(q, k, v, *, causal, scale):
    """Declares batch invariance, but sums the keys in chunks whose length depends on the batch
    size (Tk // B): the float32 online-softmax merge rounds differently in every batch size."""
    from inference_conformance.conformance.contracts.attention import causal_mask, validate

    shape = validate(q, k, v, causal, scale)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    kf = k.to(acc).repeat_interleave(shape.group, dim=1)
    vf = v.to(acc).repeat_interleave(shape.group, dim=1)
    s_all = torch.einsum("bhid,bhjd->bhij", q.to(acc), kf) * scale
    if causal:
        s_all = s_all.masked_fill(~causal_mask(shape.Tq, shape.Tk, q.device), -math.inf)
    chunk = max(1, shape.Tk // shape.B)
    m = torch.full(s_all.shape[:-1], -math.inf, dtype=acc, device=q.device)
    den = torch.zeros_like(m)
    num = torch.zeros((*s_all.shape[:-1], shape.D), dtype=acc, device=q.device)
    for j in range(0, shape.Tk, chunk):
        s = s_all[..., j:j + chunk]
        m_new = torch.maximum(m, s.amax(-1))
        safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        alpha = torch.exp(m - safe)
        p = torch.exp(s - safe[..., None])
        den = den * alpha + p.sum(-1)
        num = num * alpha[..., None] + p @ vf[:, :, j:j + chunk]
        m = m_new
    return (num / den[..., None]).to(q.dtype)


#: Known-bad implementations (technique, name) -> (function, the pinned case it shows on, whether it
#: declares batch invariance); each must be rejected by the law's own comparison: a difference
#: for a declared one, a row outside the tolerance bound (a wrong answer) for any. The attention
#: zoo's ``top_left_causal_in_large_batches`` (a prefill's mask top-left from B = 5 on) declares nothing.
ZOO = {("attention", "chunked_by_batch_size"): (chunked_by_batch_size, "decode", True),
       ("attention", "top_left_causal_in_large_batches"): (top_left_causal_in_large_batches, "gqa-causal", False)}
