"""Paged-attention calls for the laws: drawn and pinned cases, inputs from a seed (blocks placed
by a random permutation over a pool larger than needed, unused table entries out of range,
unused slots NaN), the call (refusals become "unsupported", never passes), the check against
dense float64 attention over the contiguous K/V, and the boundary classes of the contract's
coverage table a case reaches (:func:`boundary_classes`).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from conformance.contracts.paged_attention import COVERAGE
from conformance.coverage import class_names, classes_reached
from conformance.laws import Run, refusal
from conformance.tolerance import assert_close
from properties import strategies as S
from reference import attention as ref

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
    (``magnitude`` as in :class:`properties.attention_cases.Case`)."""

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
    ``conformance.contracts.paged_attention.COVERAGE``)."""
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
    hq, hkv = draw(st.one_of(S.gqa_heads(max_kv=3, max_group=3), st.sampled_from(HEAD_CONFIGS)))
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
            k = S.randn((case.Hkv, n, case.D), seed + 1 + 3 * b, scale=case.amp).round().clamp(-64, 64)
        else:
            k = S.randn((case.Hkv, n, case.D), seed + 1 + 3 * b)
        v = S.randn((case.Hkv, n, case.D), seed + 2 + 3 * b)
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
        q = S.randn((case.B, case.Hq, case.D), seed, scale=case.amp).round().clamp(-64, 64)
    else:
        q = S.randn((case.B, case.Hq, case.D), seed)
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
