"""Paged-attention calls for the laws: drawn and pinned cases, inputs from a seed (blocks placed
by a random permutation over a pool larger than needed, unused table entries out of range,
unused slots NaN), the call (refusals become "unsupported", never passes), the check against
dense float64 attention over the contiguous K/V, and the boundary classes of the contract's
coverage table a case reaches (:func:`boundary_classes`).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from inference_conformance.conformance.contracts.paged_attention import COVERAGE
from inference_conformance.conformance.coverage import class_names, classes_reached
from inference_conformance.conformance.laws import Run, refusal
from inference_conformance.conformance.tolerance import assert_close
from inference_conformance.properties import strategies
from inference_conformance.reference import attention as ref

#: Block sizes drawn: 1, odd ones, powers of two, 256 (a block longer than most sequences) and
#: 144 and 200 (above 128, not multiples of 128).
BLOCK_SIZES = (1, 2, 3, 5, 7, 16, 17, 32, 144, 200, 256)
#: Head configurations beyond the small drawn ratios: production GQA and groups above 16 that
#: are not multiples of 16.
HEAD_CONFIGS = ((8, 8), (8, 2), (12, 4), (24, 1), (40, 2))
HEAD_DIMS = (1, 8, 16, 59, 64, 72, 80, 96, 111, 128, 160, 192, 256)


@dataclass(frozen=True)
class PagedCase:
    """One paged decode call: per-sequence lengths, heads, head dim, block size, scale, how many
    spare blocks the pool holds and how many spare table columns, and how inputs are drawn
    (``magnitude`` as in :class:`inference_conformance.properties.attention.cases.Case`)."""

    lens: tuple
    Hq: int
    Hkv: int
    D: int
    block_size: int
    scale: float
    spare_blocks: int = 3
    spare_cols: int = 1
    magnitude: str = "normal"
    amp: float = 1.0
    #: Place the live blocks past element 2^31 of the caches (see :func:`make_inputs`).
    far_blocks: bool = False

    @property
    def B(self) -> int:
        return len(self.lens)

    @property
    def group(self) -> int:
        return self.Hq // self.Hkv

    def blocks(self) -> list[int]:
        return [-(-n // self.block_size) for n in self.lens]


def boundary_classes(case: PagedCase) -> set[str]:
    """The contract's boundary classes this case reaches (the coverage table of the PA-1 law,
    ``inference_conformance.conformance.contracts.paged_attention.COVERAGE``)."""
    return classes_reached(COVERAGE, "law_paged_equals_contiguous", case)


#: Every class the ``ci`` profile must reach for each registered implementation.
REQUIRED_CLASSES = class_names(COVERAGE, "law_paged_equals_contiguous")


def interpreter_cost(case: PagedCase) -> int:
    """Programs of the Triton paged kernel under the interpreter, weighted by their tiles."""
    return sum(case.Hkv * (1 + -(-n // 64)) for n in case.lens)


#: Largest interpreter_cost drawn for interpreted kernels.
COST_BUDGET = 24


def fit_budget(case: PagedCase, budget: int = COST_BUDGET) -> PagedCase:
    """``case`` shrunk (batch, then KV heads, then lengths) until the interpreter cost is within
    ``budget``; the block size, the group and the head dim are kept."""
    lens, hkv = list(case.lens), case.Hkv
    while interpreter_cost(dataclasses.replace(case, lens=tuple(lens), Hkv=hkv, Hq=hkv * case.group)) > budget:
        if len(lens) > 2:
            lens.pop()
        elif hkv > 1:
            hkv -= 1
        elif max(lens) > 1:
            i = lens.index(max(lens))
            lens[i] = max(1, lens[i] // 2)
        else:
            break
    return dataclasses.replace(case, lens=tuple(lens), Hkv=hkv, Hq=hkv * case.group)


@st.composite
def lengths_for(draw, block_size: int, max_len: int):
    """One sequence length: 1, a block multiple or one off it, long enough to span more than
    64 (or 128) blocks at small block sizes, or any length."""
    kind = draw(st.sampled_from(["any", "any", "multiple", "one", "long"]))
    if kind == "one":
        return 1
    if kind == "multiple":
        k = draw(st.integers(1, max(1, min(4, max_len // block_size))))
        return max(1, min(max_len, k * block_size + draw(st.sampled_from([-1, 0, 1]))))
    if kind == "long" and block_size <= 3:
        return block_size * draw(st.sampled_from([65, 129])) - draw(st.integers(0, block_size - 1))
    return draw(st.integers(1, max_len))


@st.composite
def paged_cases(draw, max_len: int = 300):
    """Paged decode calls: B 1..4 with different lengths, the block sizes of BLOCK_SIZES, small
    GQA ratios (not only powers of two) and HEAD_CONFIGS, head dims 1..256, normal and large
    logits."""
    hq, hkv = draw(st.one_of(strategies.gqa_heads(max_kv=3, max_group=3), st.sampled_from(HEAD_CONFIGS)))
    bs = draw(st.sampled_from(BLOCK_SIZES))
    B = draw(st.integers(1, 4))
    lens = tuple(draw(lengths_for(bs, max_len)) for _ in range(B))
    D = draw(st.sampled_from(HEAD_DIMS))
    magnitude = draw(st.sampled_from(["normal", "normal", "large"]))
    if magnitude == "large":
        scale = draw(st.sampled_from([1.0, 0.25, 0.0625, -0.25]))
        amp = draw(st.sampled_from([3.0, 12.0, 40.0]))
    else:
        scale = draw(st.sampled_from([1.0, 0.3, 1.7, -1.0, 0.0])) / math.sqrt(D)
        amp = 1.0
    return PagedCase(lens, hq, hkv, D, bs, scale, spare_blocks=draw(st.integers(0, 5)),
                     spare_cols=draw(st.integers(0, 3)), magnitude=magnitude, amp=amp)


@dataclass
class PagedInputs:
    """A call's tensors and the contiguous K/V (each (1, Hkv, n, D), in the call's dtype) the
    pages were cut from."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    k: list
    v: list

    def args(self):
        return self.q, self.k_cache, self.v_cache, self.block_table, self.seq_lens


def make_inputs(case: PagedCase, seed: int, dtype: torch.dtype, device: str) -> PagedInputs:
    """Inputs for ``case`` from ``seed``: contiguous K/V per sequence (drawn in float64, cast to
    ``dtype``), cut into blocks placed by a random permutation of a pool with
    ``case.spare_blocks`` spare blocks; table entries past a sequence's blocks hold values out
    of range (num_blocks + 7, -1, 2**31 - 1 in turn) and slots past its length hold NaN.

    ``case.far_blocks``: the caches are k = kv[:, 0], v = kv[:, 1] of one lazily allocated
    (num_blocks, 2, block_size, Hkv, D) tensor of more than 2^31 elements (``torch.empty``: only
    the pages of the blocks written are ever backed, about 4 GB of address space in 16 bits), the
    pool's blocks (NaN-filled) being its last ones: every block id x block stride passes 2^31."""
    bs, need = case.block_size, case.blocks()
    pool = sum(need) + case.spare_blocks
    first = -(-(2**31) // (2 * bs * case.Hkv * case.D)) if case.far_blocks else 0   # the pool's first id
    num_blocks = first + pool
    max_blocks = max(need) + case.spare_cols
    g = torch.Generator().manual_seed(seed)
    perm = [first + i for i in torch.randperm(pool, generator=g).tolist()]
    junk = [num_blocks + 7, -1, 2**31 - 1]
    table = torch.tensor([[junk[(b + i) % 3] for i in range(max_blocks)] for b in range(case.B)], dtype=torch.int32)
    if case.far_blocks:
        kv = torch.empty((num_blocks, 2, bs, case.Hkv, case.D), dtype=dtype, device=device)
        kv[first:] = float("nan")
        k_cache, v_cache = kv[:, 0], kv[:, 1]
    else:
        k_cache = torch.full((num_blocks, bs, case.Hkv, case.D), float("nan"), dtype=dtype)
        v_cache = torch.full_like(k_cache, float("nan"))
    ks, vs, used = [], [], 0
    for b, n in enumerate(case.lens):
        if case.magnitude == "large":
            k = strategies.randn((case.Hkv, n, case.D), seed + 1 + 3 * b, scale=case.amp).round().clamp(-64, 64)
        else:
            k = strategies.randn((case.Hkv, n, case.D), seed + 1 + 3 * b)
        v = strategies.randn((case.Hkv, n, case.D), seed + 2 + 3 * b)
        k, v = k.to(dtype), v.to(dtype)
        for i in range(need[b]):
            blk = perm[used]
            used += 1
            table[b, i] = blk
            t0, t1 = i * bs, min(n, (i + 1) * bs)
            k_cache[blk, : t1 - t0] = k[:, t0:t1].permute(1, 0, 2)
            v_cache[blk, : t1 - t0] = v[:, t0:t1].permute(1, 0, 2)
        ks.append(k[None].to(device))
        vs.append(v[None].to(device))
    if case.magnitude == "large":
        q = strategies.randn((case.B, case.Hq, case.D), seed, scale=case.amp).round().clamp(-64, 64)
    else:
        q = strategies.randn((case.B, case.Hq, case.D), seed)
    return PagedInputs(q.to(device=device, dtype=dtype), k_cache.to(device), v_cache.to(device), table.to(device),
                       torch.tensor(case.lens, dtype=torch.int32, device=device), ks, vs)


def call(impl, inp: PagedInputs, case: PagedCase, *, run: Run | None = None, **kw):
    """Call the implementation. Inside a law's example (``run`` given) the case is observed (for
    the contract's coverage table) and a NotImplementedError discards the example; outside a law
    it skips the test as "unsupported". Never a pass."""
    if run is not None:
        run.observe(case)
    with refusal(run, f"{getattr(impl, 'name', impl)} refuses {inp.q.dtype}, D={case.D}, block_size={case.block_size}"):
        return impl(*inp.args(), scale=case.scale, **kw)


def dense(inp: PagedInputs, case: PagedCase, dtype: torch.dtype | None) -> torch.Tensor:
    """Dense attention of each sequence's query over its contiguous K/V (no pages), computed in
    ``dtype`` (None: the inputs' dtype), (B, Hq, D)."""
    outs = [ref.attention_naive(inp.q[b][None, :, None, :], inp.k[b], inp.v[b], causal=False,
                                scale=case.scale, dtype=dtype)[0, :, 0] for b in range(case.B)]
    return torch.stack(outs)


def check_against_contiguous(out, inp: PagedInputs, case: PagedCase, what: str = "paged attention output"):
    """The tolerance policy: ``out`` vs dense float64 attention over the contiguous K/V
    (``out_ref``) and, for 16-bit outputs, the same in the inputs' dtype (``out_pt``)."""
    q = inp.q
    assert isinstance(out, torch.Tensor), f"output is a {type(out).__name__}, not a tensor"
    assert out.shape == q.shape, f"output shape {tuple(out.shape)} != q's {tuple(q.shape)}"
    assert out.dtype == q.dtype, f"output dtype {out.dtype} != q's {q.dtype}"
    assert out.device == q.device, f"output on {out.device}, inputs on {q.device}"
    out_ref = dense(inp, case, torch.float64)
    out_pt = dense(inp, case, None) if q.dtype in (torch.float16, torch.bfloat16) else None
    return assert_close(out, out_ref, out_pt=out_pt, what=what)


# ------------------------------------------------------------ the mixed batch (PA-8, paged_prefill)
@dataclass(frozen=True)
class PrefillCase:
    """One mixed-batch call: per-sequence lengths (``lens``, the chunk included) and query tokens
    (``qlens``, 1: a decode token; q_len = len: a whole prompt; between: a chunk after a cached
    prefix), heads, head dim, block size, scale, spare blocks and table columns."""

    lens: tuple
    qlens: tuple
    Hq: int
    Hkv: int
    D: int
    block_size: int
    scale: float
    spare_blocks: int = 2
    spare_cols: int = 1
    magnitude: str = "normal"
    #: Run at its full size under the interpreter too (a pinned case whose cost was measured).
    pinned: bool = False

    @property
    def B(self) -> int:
        return len(self.lens)

    @property
    def group(self) -> int:
        return self.Hq // self.Hkv

    def paged(self) -> PagedCase:
        """The paged decode case of the same caches (its inputs are made by :func:`make_inputs`)."""
        return PagedCase(self.lens, self.Hq, self.Hkv, self.D, self.block_size, self.scale,
                         spare_blocks=self.spare_blocks, spare_cols=self.spare_cols)


def prefill_classes(case: PrefillCase) -> set[str]:
    """The contract's boundary classes of the PA-8 law this case reaches."""
    return classes_reached(COVERAGE, "law_prefill_equals_causal", case)


def prefill_cost(case: PrefillCase) -> int:
    """Programs of the Triton mixed-batch kernel under the interpreter, weighted by key tiles of 64."""
    bq = max(1, 16 // (1 << (case.group - 1).bit_length()))
    return sum(case.Hkv * -(-m // bq) * (1 + -(-n // 64)) for n, m in zip(case.lens, case.qlens))


#: Largest prefill_cost drawn for interpreted kernels.
PREFILL_BUDGET = 24


def fit_prefill_budget(case: PrefillCase, budget: int = PREFILL_BUDGET) -> PrefillCase:
    """``case`` shrunk (batch, then KV heads, then the longest chunk and its prefix) until the
    interpreter cost is within ``budget``; block size, group and head dim kept. A ``pinned`` case
    is returned whole."""
    if case.pinned:
        return case
    lens, qlens, hkv = list(case.lens), list(case.qlens), case.Hkv
    while prefill_cost(dataclasses.replace(case, lens=tuple(lens), qlens=tuple(qlens), Hkv=hkv,
                                           Hq=hkv * case.group)) > budget:
        if len(lens) > 2:
            lens.pop()
            qlens.pop()
        elif hkv > 1:
            hkv -= 1
        elif max(lens) > 1:
            i = lens.index(max(lens))
            prefix = lens[i] - qlens[i]
            qlens[i] = max(1, qlens[i] // 2)
            lens[i] = max(qlens[i], prefix // 2 + qlens[i])
        else:
            break
    return dataclasses.replace(case, lens=tuple(lens), qlens=tuple(qlens), Hkv=hkv, Hq=hkv * case.group)


@st.composite
def prefill_cases(draw, max_prefix: int = 80, max_chunk: int = 40):
    """Mixed batches: B 1..4 sequences, or 5..20 (past a search over 4 and a tile of 16), each a
    decode token, a chunk of 2..max_chunk tokens after a cached prefix (or at its start), or a
    whole prompt, in any order; block sizes 1, 2, 3, 5, 16, 17; small
    GQA ratios and (8, 2), (12, 4); head dims 8..128."""
    hq, hkv = draw(st.one_of(strategies.gqa_heads(max_kv=2, max_group=3), st.sampled_from([(8, 2), (12, 4)])))
    bs = draw(st.sampled_from((1, 2, 3, 5, 16, 17)))
    lens, qlens = [], []
    for _ in range(draw(st.one_of(st.integers(1, 4), st.integers(5, 20)))):
        kind = draw(st.sampled_from(["decode", "chunk", "chunk", "prompt"]))
        if kind == "decode":
            n, m = draw(st.integers(1, max_prefix)), 1
        elif kind == "chunk":
            m = draw(st.integers(2, max_chunk))
            n = m + draw(st.integers(0, max_prefix))
        else:
            m = n = draw(st.integers(2, max_chunk))
        lens.append(n)
        qlens.append(m)
    D = draw(st.sampled_from((8, 16, 59, 64, 128)))
    scale = draw(st.sampled_from([1.0, 0.3, 1.7, -1.0])) / math.sqrt(D)
    return PrefillCase(tuple(lens), tuple(qlens), hq, hkv, D, bs, scale, spare_blocks=draw(st.integers(0, 3)),
                       spare_cols=draw(st.integers(0, 2)))


@dataclass
class PrefillInputs:
    """A mixed-batch call's tensors (q (N, Hq, D), the caches, block table, seq_lens,
    query_start_loc) and the contiguous K/V of each sequence (each (1, Hkv, n, D))."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    k: list
    v: list

    def args(self):
        return self.q, self.k_cache, self.v_cache, self.block_table, self.seq_lens, self.query_start_loc


def make_prefill_inputs(case: PrefillCase, seed: int, dtype: torch.dtype, device: str) -> PrefillInputs:
    """The caches of :func:`make_inputs` for ``case.paged()`` (blocks placed at random, unused
    entries out of range, unused slots NaN), and N = sum(qlens) queries drawn from ``seed``."""
    inp = make_inputs(case.paged(), seed, dtype, device)
    N = sum(case.qlens)
    q = strategies.randn((N, case.Hq, case.D), seed + 1000).to(device=device, dtype=dtype)
    loc = torch.tensor([0, *itertools.accumulate(case.qlens)], dtype=torch.int32, device=device)
    return PrefillInputs(q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens, loc, inp.k, inp.v)


def call_prefill(impl, inp: PrefillInputs, case: PrefillCase, *, run: Run | None = None, **kw):
    """Call the implementation's ``paged_prefill`` (refusals as :func:`call`)."""
    if run is not None:
        run.observe(case)
    with refusal(run, f"{getattr(impl, 'name', impl)} refuses paged_prefill for {inp.q.dtype}, D={case.D}, "
                      f"block_size={case.block_size}"):
        return impl.paged_prefill(*inp.args(), scale=case.scale, **kw)


def paged_case(lens, Hq, Hkv, D, bs, c=0.7, **kw) -> PagedCase:
    """A :class:`PagedCase` of ``lens`` with the scale ``c / sqrt(D)``."""
    return PagedCase(tuple(lens), Hq, Hkv, D, bs, c / math.sqrt(D), **kw)
