"""MLA decode calls for the law of KV-12: the drawn and pinned cases, inputs from a seed (contiguous
caches, and paged ones whose blocks are placed by a random permutation), the call (refusals become
"unsupported", never passes), the comparison with the float64 reference over the materialised
keys; the law is in ``laws.py``.

Inputs are drawn to find the field's bugs: batches of different lengths (one token included),
lengths one off the kernel's tiles, block sizes 1, odd and 16..64, more than 16 query heads,
latent dims that are not powers of two, decode positions past 256 (the RoPE angles of a wrong
position are far from the right ones), large logits and negative scales, and split counts above
a sequence's length (an empty split). Slots past a sequence's length are NaN and table entries
past its blocks out of range: an implementation that reads them fails. Only Triton kernels under
the interpreter get their sizes bounded (:func:`fit_budget`).
"""
from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from inference_conformance.conformance.contracts.mla_decode import INDEX_DTYPE, MLA_16BIT_RULE
from inference_conformance.conformance.laws import Run, refusal
from inference_conformance.conformance.tolerance import HALF_DTYPES, assert_close
from inference_conformance.properties import strategies
from inference_conformance.reference import mla_decode as ref


@dataclass(frozen=True)
class MLACase:
    """One mla_decode call: ``lens`` (seq_lens, one per sequence), Hq, D (no-RoPE head dim), C
    (latent dim), R (RoPE dim), ``block_size`` (None: a contiguous cache), ``scale``,
    ``magnitude`` ("normal": N(0, 1) inputs; "large": integer q_nope and latents in [-8, 8] drawn
    with std ``amp``, an integer W_uk in [-2, 2], RoPE keys 0 and a power-of-two scale: logits of
    ~1e2..1e3 that every correct float32 or float64 implementation computes exactly, so that only
    the softmax and the merge are judged), ``num_splits`` (handed to implementations that take
    it; None: their choice)."""

    lens: tuple
    Hq: int
    D: int
    C: int
    R: int
    block_size: int | None
    scale: float
    magnitude: str = "normal"
    amp: float = 1.0
    num_splits: int | None = None
    rope_theta: float = 10000.0

    @property
    def B(self) -> int:
        return len(self.lens)


def case(lens, Hq, D, C, R, block_size, c=1.0, **kw) -> MLACase:
    """An MLACase with scale c / sqrt(D + R)."""
    return MLACase(tuple(lens), Hq, D, C, R, block_size, c / math.sqrt(D + R), **kw)


def interpreter_cost(c: MLACase) -> int:
    """Rough cost of the Triton kernel under the interpreter, in programs and key tiles (each
    ~0.4 ms there, more with a wide latent): head tiles x splits x (2 + tiles of 16 per split)."""
    heads = -(-c.Hq // 16)
    splits = max(1, min(c.num_splits or 2, max(c.lens)))
    width = 1 + c.C // 256
    return sum(heads * splits * (2 + width * -(-n // (16 * splits))) for n in c.lens)


#: Largest interpreter_cost of a drawn case under the interpreter.
COST_BUDGET = 60


def fit_budget(c: MLACase, budget: int = COST_BUDGET) -> MLACase:
    """``c`` shrunk (sequences dropped, then lengths halved) until its interpreter cost is within
    ``budget``."""
    while interpreter_cost(c) > budget and c.B > 1:
        c = dataclasses.replace(c, lens=c.lens[:-1])
    while interpreter_cost(c) > budget and max(c.lens) > 1:
        c = dataclasses.replace(c, lens=tuple(max(1, n // 2) for n in c.lens))
    return c


@st.composite
def mla_cases(draw, max_len: int = 300):
    """MLA decode calls: 1..3 sequences of 1..max_len tokens, Hq in 1..20, D, C, R from small
    to DeepSeek's (128, 512, 64), contiguous or paged with block sizes 1..64, normal or large
    inputs, scales of either sign, 1..5 splits or the implementation's choice."""
    B = draw(st.integers(1, 3))
    lens = tuple(draw(st.lists(strategies.lengths(max_len), min_size=B, max_size=B)))
    Hq = draw(st.sampled_from([1, 2, 3, 4, 8, 16, 20]))
    D = draw(st.sampled_from([1, 8, 16, 24, 64, 128]))
    C = draw(st.sampled_from([4, 12, 16, 48, 64, 96, 128, 512]))
    R = draw(st.sampled_from([2, 4, 8, 16, 64]))
    bs = draw(st.sampled_from([None, None, 1, 2, 3, 5, 7, 16, 17, 32, 64]))
    c = draw(st.sampled_from([1.0, 0.5, 2.0, -1.0]))
    large = draw(st.booleans())
    splits = draw(st.sampled_from([None, 1, 2, 3, 5]))
    if large:
        return MLACase(lens, Hq, D, C, R, bs, draw(st.sampled_from([1 / 16, 1 / 64, -1 / 16])), "large", 6.0,
                       num_splits=splits)
    return case(lens, Hq, D, C, R, bs, c, num_splits=splits)


@dataclass
class MLAInputs:
    """The tensors of one call (``args()`` in the contract's order) and each sequence's tokens."""

    q_nope: torch.Tensor
    q_rope: torch.Tensor
    w_uk: torch.Tensor
    cache: torch.Tensor
    block_table: torch.Tensor | None
    seq_lens: torch.Tensor

    def args(self) -> tuple:
        return self.q_nope, self.q_rope, self.w_uk, self.cache, self.block_table, self.seq_lens


def paged(tokens: torch.Tensor, lens, block_size: int, seed: int, spare_blocks: int = 2):
    """(cache (num_blocks, block_size, C + R), block_table (B, max_blocks + 1) int32) holding each
    sequence's ``tokens[b, :lens[b]]`` (tokens (B, T, C + R)) in blocks placed by a random
    permutation of a pool with ``spare_blocks`` spare blocks; unused slots NaN, unused table
    entries out of range (num_blocks + 7, -1, 2**31 - 1 in turn)."""
    need = [-(-n // block_size) for n in lens]
    num_blocks = sum(need) + spare_blocks
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
    junk = [num_blocks + 7, -1, 2**31 - 1]
    width = max(need) + 1
    table = torch.tensor([[junk[(b + i) % 3] for i in range(width)] for b in range(len(lens))], dtype=INDEX_DTYPE)
    cache = torch.full((num_blocks, block_size, tokens.shape[-1]), float("nan"), dtype=tokens.dtype)
    used = 0
    for b, n in enumerate(lens):
        for i in range(need[b]):
            blk, used = perm[used], used + 1
            table[b, i] = blk
            part = tokens[b, i * block_size:min(n, (i + 1) * block_size)]
            cache[blk, :len(part)] = part
    return cache, table


def make_inputs(c: MLACase, seed: int, dtype: torch.dtype, device: str) -> MLAInputs:
    """Inputs for ``c`` from ``seed`` (drawn in float64, then cast): q_nope, q_rope and the cache
    N(0, 1), w_uk N(0, 1/C) ("large": see :class:`MLACase`); a contiguous cache has one spare slot
    per sequence, every slot past a sequence's length NaN."""
    B, T = c.B, max(c.lens)
    q_rope = strategies.randn((B, c.Hq, c.R), seed + 1)
    if c.magnitude == "large":       # integers: absorption and scores exact in float32 (|s| < 2^24)
        q_nope = strategies.randn((B, c.Hq, c.D), seed, scale=c.amp).round().clamp(-8, 8)
        w_uk = strategies.randn((c.Hq, c.C, c.D), seed + 2).round().clamp(-2, 2)
        tokens = strategies.randn((B, T + 1, c.C + c.R), seed + 3, scale=c.amp).round().clamp(-8, 8)
        tokens[..., c.C:] = 0.0
    else:
        q_nope = strategies.randn((B, c.Hq, c.D), seed)
        w_uk = strategies.randn((c.Hq, c.C, c.D), seed + 2, scale=1 / math.sqrt(c.C))
        tokens = strategies.randn((B, T + 1, c.C + c.R), seed + 3)
    for b, n in enumerate(c.lens):
        tokens[b, n:] = float("nan")
    table = None
    if c.block_size is not None:
        tokens, table = paged(tokens, c.lens, c.block_size, seed + 4)
        table = table.to(device)
    cast = [t.to(device=device, dtype=dtype) for t in (q_nope, q_rope, w_uk, tokens)]
    return MLAInputs(*cast, table, torch.tensor(c.lens, dtype=INDEX_DTYPE, device=device))


def accepts_num_splits(impl) -> bool:
    """True when the implementation's mla_decode takes a ``num_splits`` keyword (split-KV)."""
    fn = getattr(impl, "mla_decode", impl)
    try:
        return "num_splits" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def call(impl, inp: MLAInputs, c: MLACase, *, run: Run | None = None):
    """Call the implementation (with ``num_splits`` where it takes it). Inside a law's example
    (``run`` given) the case is observed as the implementation gets it (for the contract's
    coverage table) and a NotImplementedError discards the example; outside a law it ends the
    test as "unsupported". Never a pass."""
    kw = {"num_splits": c.num_splits} if c.num_splits is not None and accepts_num_splits(impl) else {}
    if run is not None:
        run.observe(c if kw else dataclasses.replace(c, num_splits=None))
    what = f"{getattr(impl, 'name', impl)} refuses {inp.q_nope.dtype}, C={c.C}, R={c.R}, block_size={c.block_size}"
    with refusal(run, what):
        return impl(*inp.args(), scale=c.scale, rope_theta=c.rope_theta, **kw)


def check_against_materialised(out, inp: MLAInputs, c: MLACase, what: str = "MLA decode output"):
    """The tolerance policy: ``out`` against the float64 reference over the materialised keys of
    the same inputs (16-bit: the contract's ``mla-decode-16bit`` rule, whose naive computation is
    the absorbed query rounded to the inputs' dtype)."""
    B, Hq = inp.q_nope.shape[:2]
    assert tuple(out.shape) == (B, Hq, c.C), f"output shape {tuple(out.shape)} != (B, Hq, C) = {(B, Hq, c.C)}"
    assert out.dtype == inp.q_nope.dtype, f"output dtype {out.dtype} != q_nope's {inp.q_nope.dtype}"
    assert out.device == inp.q_nope.device, f"output on {out.device}, inputs on {inp.q_nope.device}"
    kw = {"scale": c.scale, "rope_theta": c.rope_theta}
    wide = [a if a is None or not a.is_floating_point() else a.to(torch.float64) for a in inp.args()]
    out_ref = ref.mla_decode(*wide, **kw)
    if out.dtype in HALF_DTYPES:
        return assert_close(out, out_ref, out_pt=ref.absorbed_rounded(*inp.args(), **kw), what=what,
                            rule=MLA_16BIT_RULE)
    return assert_close(out, out_ref, what=what)


#: The pinned examples: together they reject every zoo entry and reach every boundary class of
#: the contract in every profile (``test_kv12_coverage_table``).
EXAMPLES = (
    # paged, odd blocks, a one-token sequence beside longer ones, 3 splits (one empty), C = 24
    case((37, 1, 16), 4, 16, 24, 8, 5, num_splits=3),
    # contiguous, 20 query heads (two head tiles), lengths one past and one short of 32
    case((33, 31), 20, 8, 16, 4, None, num_splits=2),
    # blocks of 16, one head, decode position 299, large logits, 4 splits
    MLACase((300,), 1, 32, 64, 16, 16, 1 / 16, "large", 6.0, num_splits=4),
    # blocks of one token, negative scale, a length a multiple of 32
    case((17, 64), 3, 8, 12, 2, 1, c=-1.0, num_splits=2),
)
