"""Tree-attention calls for the attention-level law of SD-10: the drawn and pinned cases, their
inputs, the call (refusals become "unsupported", never passes), the comparison with the float64
reference of each root-to-node path alone; the law is in ``laws.py``.

Trees are drawn to find the field's bugs: the flattened order differs from the ancestor relation
(a later sibling after an earlier sibling's subtree, cousins), chains, wide roots, deep branches,
one node and more than one tile of 16; prefixes of length 0 and one off the kernel's key tiles,
batches of different prefix lengths, GQA with several KV heads, negative scales. Slots past a
sequence's prefix and tree are NaN: an implementation that reads them fails. Only Triton kernels
under the interpreter get fewer drawn examples and smaller sizes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from inference_conformance.conformance.contracts.tree_attention import make_inputs
from inference_conformance.conformance.laws import Run, refusal
from inference_conformance.conformance.tolerance import assert_close
from inference_conformance.properties import strategies
from inference_conformance.reference import tree_attention as ref


@dataclass(frozen=True)
class TreeCase:
    """One tree_attention call: ``parents`` (the tree), ``lens`` (prefix_lens, one per sequence),
    Hq, Hkv, D, ``scale``."""

    parents: tuple
    lens: tuple
    Hq: int
    Hkv: int
    D: int
    scale: float

    @property
    def B(self) -> int:
        return len(self.lens)


def case(parents, lens, Hq, Hkv, D, c=1.0) -> TreeCase:
    """A TreeCase with scale c / sqrt(D)."""
    return TreeCase(tuple(parents), tuple(lens), Hq, Hkv, D, c / math.sqrt(D))


@st.composite
def trees(draw, max_nodes: int = 24):
    """Parent pointers of 1..max_nodes nodes: each node's parent drawn among the root level and
    the nodes before it, biased to the last one (chains) or the root level (wide roots)."""
    n = draw(st.integers(1, max_nodes))
    out = []
    for i in range(n):
        kind = draw(st.sampled_from(["any", "any", "previous", "root"]))
        out.append(i - 1 if kind == "previous" else -1 if kind == "root" or i == 0 else draw(st.integers(-1, i - 1)))
    return tuple(out)


@st.composite
def tree_cases(draw, max_len: int = 70, max_nodes: int = 24, max_batch: int = 3):
    """Tree attention calls: a drawn tree over 1..max_batch prefixes of 0..max_len tokens, head
    layouts from MHA to GQA with several KV heads, head dims 1..64, scales of either sign."""
    parents = draw(trees(max_nodes))
    B = draw(st.integers(1, max_batch))
    lens = tuple(draw(st.lists(strategies.lengths(max_len, 0), min_size=B, max_size=B)))
    Hq, Hkv = draw(st.sampled_from([(1, 1), (2, 1), (4, 2), (4, 4), (6, 3), (8, 2)]))
    D = draw(st.sampled_from([1, 8, 16, 24, 32, 64]))
    return case(parents, lens, Hq, Hkv, D, draw(st.sampled_from([1.0, 0.5, 2.0, -1.0])))


def tree_inputs(c: TreeCase, seed: int, dtype: torch.dtype, device: str) -> tuple:
    """(q, k_cache, v_cache, parents, prefix_lens) for ``c`` from ``seed``: N(0, 1) values drawn in
    float64, then cast; every slot past a sequence's prefix and tree NaN."""
    q, k, v, par, lens = make_inputs(c.parents, c.lens, c.Hq, c.Hkv, c.D, seed)
    return tuple(t.to(device=device, dtype=dtype) for t in (q, k, v)) + (par.to(device), lens.to(device))


def call(impl, args: tuple, c: TreeCase, *, run: Run | None = None):
    """Call the implementation. Inside a law's example (``run`` given) the case is observed for
    the contract's coverage table and a NotImplementedError discards the example; outside a law
    it ends the test as "unsupported". Never a pass."""
    if run is not None:
        run.observe(c)
    what = f"{getattr(impl, 'name', impl)} refuses {args[0].dtype}, {len(c.parents)} nodes, D={c.D}"
    with refusal(run, what):
        return impl(*args, scale=c.scale)


def check_against_paths(out, args: tuple, c: TreeCase, what: str = "tree attention output"):
    """The tolerance policy: ``out`` against the float64 reference (each node over the prefix and
    its root-to-node path alone) of the same inputs, by the rule of ``out``'s dtype."""
    q = args[0]
    assert tuple(out.shape) == tuple(q.shape), f"output shape {tuple(out.shape)} != q's (B, Hq, n_nodes, D) {tuple(q.shape)}"
    assert out.dtype == q.dtype, f"output dtype {out.dtype} != q's {q.dtype}"
    assert out.device == q.device, f"output on {out.device}, inputs on {q.device}"
    wide = [t.to(torch.float64) if t.is_floating_point() else t for t in args]
    return assert_close(out, ref.tree_attention(*wide, scale=c.scale), what=what)


def fit_interpreter(c: TreeCase) -> TreeCase:
    """``c`` within the interpreter's budget: at most 2 sequences of at most 40 prefix tokens and
    8 query heads (each program costs ~0.4 ms per key tile there)."""
    lens = tuple(min(n, 40) for n in c.lens[:2])
    Hq, Hkv = (c.Hq, c.Hkv) if c.Hq <= 4 else (c.Hq // 2, max(1, c.Hkv // 2))
    return TreeCase(c.parents, lens, Hq, Hkv, c.D, c.scale)


#: A tree whose flattened order differs from its ancestor relation everywhere: node 4 is a later
#: sibling of node 2 after 2's subtree (node 3, depth 4), node 5 a root-level sibling of node 0
#: after its subtree, nodes 0, 5, 7, 8 the root level.
BRANCHY = (-1, 0, 1, 2, 1, -1, 5, -1, -1)

#: The pinned examples: together they reject every zoo entry and reach every boundary class of
#: the contract in every profile (``test_sd10_tree_attention_coverage_table``).
EXAMPLES = (
    # the branchy tree over prefixes 0, 17 and 31, GQA 4 over 2, D = 24
    case(BRANCHY, (0, 17, 31), 4, 2, 24),
    # a chain over prefixes at 16, 32 and one past 32, negative scale
    case((-1, 0, 1, 2, 3), (16, 32, 33), 2, 1, 16, c=-1.0),
    # one node after 5 tokens
    case((-1,), (5,), 1, 1, 8),
    # 20 nodes (two tiles of 16), prefixes 3 and 0
    case((-1, 0, 0, 1, -1, 4, 2, 6, 3, 3, 5, 10, -1, 12, 7, 14, 8, 0, 17, 9), (3, 0), 3, 3, 8, c=0.5),
    # a chain of 24 nodes (depth 24, crossing the node tile of 16) after 7 tokens
    case(tuple(range(-1, 23)), (7,), 2, 1, 8),
)
