"""The ``tree_attention`` contract: the attention of a token tree's nodes over a cached prefix, the
scorer of tree speculation (SpecInfer's topology-aware causal mask, Miao et al. 2024; lecture 002
§6.6; claim SD-10).

    tree_attention(q, k_cache, v_cache, parents, prefix_lens, *, scale: float) -> Tensor

A draft proposes a token tree; the target scores every node in one forward. The nodes' keys and
values are written to each sequence's cache right after its cached prefix, and each node attends
to the prefix, to its own ancestors and to itself, nothing else: its output is that of its
root-to-node path run alone after the prefix. (RoPE is the caller's: node i's query and key are
rotated at its depth position, prefix_len − 1 + depth(i), before the call.)

Shapes (sizes as in :mod:`inference_conformance.conformance.contracts.glossary`; n_nodes is the
tree's node count, S_max the cache's slots per sequence):

- ``q`` (B, Hq, n_nodes, D): node i's query of head h of sequence b at ``q[b, h, i]``.
- ``k_cache``, ``v_cache`` (B, Hkv, S_max, D), one dtype with ``q``: sequence b's cached prefix
  at slots [0, prefix_lens[b]), then the tree's keys and values, node i at slot
  prefix_lens[b] + i. Hq is a multiple of Hkv (GQA): query head h reads KV head h // (Hq / Hkv).
- ``parents`` (n_nodes,) int32 or int64: the parent of node i, ``-1`` for a node whose parent is
  the last cached token (the tree's root level), else an earlier node: ``-1 <= parents[i] < i``
  (topological order, as the ``speculative_tree`` contract's). One tree for the whole batch. The
  depth of a node is 1 at the root level, its parent's + 1 below it.
- ``prefix_lens`` (B,) int32 or int64: cached tokens per sequence, 0 included, with
  prefix_lens[b] + n_nodes <= S_max.
- ``scale``: a finite real (usually D^-0.5; any sign).

Returns (B, Hq, n_nodes, D) in ``q``'s dtype on its device:

    visible(b, i) = {t < prefix_lens[b]} ∪ {prefix_lens[b] + j : j = i or j an ancestor of i}
    out[b, h, i] = sum_{t in visible(b, i)} softmax_t(scale · q[b, h, i] · k_cache[b, h // G, t])
                   · v_cache[b, h // G, t]

Every node sees at least itself, so no row is empty. What an implementation must not read:
cache slots at or past prefix_lens[b] + n_nodes (the suite fills them with NaN); they, and the
keys of nodes that are not an ancestor (siblings, cousins, later nodes in the flattened order),
must not affect the result.

Supported inputs: n_nodes >= 1, D in 1..256, Hq, Hkv >= 1, dtypes float64 / float32 / float16 /
bfloat16 (q, k_cache, v_cache of one dtype, every tensor on one device; any strides). An
implementation may raise ``NotImplementedError`` for an input it does not support (a dtype, more
nodes than one tile of its kernel holds): the suite reports "unsupported", never a pass. Invalid
arguments raise ``TypeError`` (a non-tensor, a floating dtype outside the four or mixed, integer
arguments of another dtype, a scale that is not a real number) or ``ValueError`` (wrong rank or
sizes, Hq not a multiple of Hkv, a parent outside [-1, i), a prefix length below 0 or one whose
tree does not fit S_max, a non-finite scale, mixed devices), naming the argument, before any
kernel launch: ``validate(q, k_cache, v_cache, parents, prefix_lens, scale)`` of
``inference_conformance.conformance.contracts.tree_attention`` raises them, and an
implementation may call it.

Tolerance: the suite's dtype rules (float64 1e-12 and float32 1e-5 of the output's scale; 16-bit
outputs against the float64 result rounded to their dtype, 1 ulp of each element plus half an
ulp of the scale); the contract declares no rule of its own.

Oracle: the float64 reference (``inference_conformance.reference.tree_attention``) attends each
node's query over the prefix followed by its root-to-node path alone, gathered key by key
through the one attention core; it never builds a tree mask.

Claims checked against this contract: SD-10 (a tree scored in one forward gives every node the
output of its root-to-node path alone, at the attention level, and through the model: every
node's logits). Sources: Miao et al. 2024 (SpecInfer, §4.2 tree-based parallel decoding); Cai et
al. 2024 (Medusa's tree attention); lecture 002 §6.6.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from inference_conformance.conformance.contracts.checks import check_index, check_kv, check_scale, check_tensor
from inference_conformance.conformance.coverage import CoverageClass
from inference_conformance.conformance.registry import Contract, InvalidCall

#: Dtypes of the contract (an implementation may still refuse one with NotImplementedError).
DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
#: Integer dtypes of ``parents`` and ``prefix_lens``.
INDEX_DTYPES = (torch.int32, torch.int64)
#: Largest head dim D of the contract.
MAX_HEAD_DIM = 256


@dataclass(frozen=True)
class TreeAttentionShape:
    """The sizes of one call: batch, query and KV heads, nodes, head dim, cache slots."""

    B: int
    Hq: int
    Hkv: int
    n_nodes: int
    D: int
    S_max: int


def validate(q, k_cache, v_cache, parents, prefix_lens, scale) -> TreeAttentionShape:
    """Check one call against the contract; return its sizes.

    Raises TypeError or ValueError naming the argument (see the module docstring). Reads
    ``parents`` and ``prefix_lens`` on the host (one synchronisation on CUDA)."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        dims = "(B, Hq, n_nodes, D)" if name == "q" else "(B, Hkv, S_max, D)"
        check_tensor(name, t, 4, dims, DTYPES, "tree_attention")
    check_index("parents", parents, "(n_nodes,)", INDEX_DTYPES)
    check_index("prefix_lens", prefix_lens, "(B,)", INDEX_DTYPES)
    B, Hq, n, D = q.shape
    if B < 1 or Hq < 1 or n < 1:
        raise ValueError(f"q must hold at least one sequence, head and tree node (B, Hq, n_nodes, D), got "
                         f"{tuple(q.shape)}")
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"q's head dim D must be in 1..{MAX_HEAD_DIM}, got {D}")
    _, Hkv, S_max, Dk = k_cache.shape
    if k_cache.shape[0] != B or Dk != D or Hkv < 1 or Hq % Hkv:
        raise ValueError(f"k_cache must have shape (B={B}, Hkv dividing Hq={Hq}, S_max, D={D}), got "
                         f"{tuple(k_cache.shape)}")
    check_kv(q, k_cache, v_cache, ("q", "k_cache", "v_cache"), (("parents", parents), ("prefix_lens", prefix_lens)))
    if tuple(parents.shape) != (n,):
        raise ValueError(f"parents must have shape (n_nodes,) = ({n},), got {tuple(parents.shape)}")
    if tuple(prefix_lens.shape) != (B,):
        raise ValueError(f"prefix_lens must have shape (B,) = ({B},), got {tuple(prefix_lens.shape)}")
    check_scale(scale, q.dtype)
    par = parents.detach().to("cpu", torch.int64)
    bad = ((par < -1) | (par >= torch.arange(n))).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise ValueError(f"parents[{i}] = {int(par[i])} must lie in [-1, {i}): -1 for the root level, else an "
                         f"earlier node (topological order)")
    lens = prefix_lens.detach().to("cpu", torch.int64)
    bad = ((lens < 0) | (lens + n > S_max)).nonzero()
    if bad.numel():
        b = int(bad[0, 0])
        raise ValueError(f"prefix_lens[{b}] = {int(lens[b])} must lie in [0, S_max - n_nodes] = [0, {S_max - n}] "
                         f"(the tree of {n} nodes follows the prefix in the cache's {S_max} slots)")
    return TreeAttentionShape(B, Hq, Hkv, n, D, S_max)


def ancestors(parents, i: int) -> list[int]:
    """Node i's root-to-node path, root side first, i last (``parents`` valid)."""
    path, j = [], int(i)
    while j >= 0:
        path.append(j)
        j = int(parents[j])
    return path[::-1]


def make_inputs(parents, lens, Hq: int, Hkv: int, D: int, seed: int, *, spare: int = 1):
    """(q, k_cache, v_cache, parents int64, prefix_lens int64) in float64 on the CPU from ``seed``:
    N(0, 1) values, S_max = max(lens) + n_nodes + ``spare``, every slot past a sequence's prefix
    and tree NaN."""
    g = torch.Generator().manual_seed(seed)
    n, B = len(parents), len(lens)
    S_max = max(lens) + n + spare
    q = torch.randn(B, Hq, n, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, Hkv, S_max, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, Hkv, S_max, D, generator=g, dtype=torch.float64)
    for b, s in enumerate(lens):
        k[b, :, s + n:] = float("nan")
        v[b, :, s + n:] = float("nan")
    return q, k, v, torch.tensor(parents, dtype=torch.int64), torch.tensor(lens, dtype=torch.int64)


def cases(seed: int, device: str) -> list[tuple[tuple, dict]]:
    """Small valid calls for the generic checks: a binary tree over two prefixes in float32 (GQA),
    a chain after an empty prefix in float64, a wide root in bfloat16 and a deep branch in
    float16, int32 indices in one."""
    out = []
    for i, (par, lens, Hq, Hkv, D, dt) in enumerate([
            ((-1, -1, 0, 0, 1, 1), (21, 9), 4, 2, 16, torch.float32),
            ((-1, 0, 1, 2), (0,), 2, 2, 8, torch.float64),
            ((-1, -1, -1, -1, 0, 0, 4), (5, 17, 1), 3, 1, 32, torch.bfloat16),
            ((-1, 0, 1, 0, 3, 4, 5), (16,), 8, 2, 64, torch.float16)]):
        q, k, v, p, L = make_inputs(par, lens, Hq, Hkv, D, 1000 * seed + i)
        if i == 0:
            p, L = p.int(), L.int()
        args = tuple(t.to(device=device, dtype=dt) for t in (q, k, v)) + (p.to(device), L.to(device))
        out.append((args, {"scale": D ** -0.5}))
    return out


def invalid(device: str) -> list[InvalidCall]:
    """The calls this contract documents as invalid (a binary tree of 6 nodes over prefixes 4 and
    7, Hq 4 over Hkv 2, D 8, float32, scale 0.35 unless the call is about it), with the argument
    each message must name."""
    q, k, v, par, lens = (t.to(device) for t in make_inputs((-1, -1, 0, 0, 1, 1), (4, 7), 4, 2, 8, 0))
    q, k, v = q.float(), k.float(), v.float()
    meta = torch.device("meta")

    def edit(t, i, value):
        t = t.clone()
        t[i] = value
        return t

    calls = [  # (what, args, kwargs, raises, argument)
        ("q-not-a-tensor", (q.tolist(), k, v, par, lens), {}, TypeError, "q"),
        ("integer-q", (q.long(), k, v, par, lens), {}, TypeError, "q"),
        ("k_cache-3-d", (q, k[0], v, par, lens), {}, ValueError, "k_cache"),
        ("v_cache-dtype-differs", (q, k, v.double(), par, lens), {}, TypeError, "v_cache"),
        ("v_cache-shape-differs", (q, k, v[:, :, :-1], par, lens), {}, ValueError, "v_cache"),
        ("heads-not-a-multiple", (q[:, :3], k, v, par, lens), {}, ValueError, "k_cache"),
        ("head-dim-differs", (q, k[..., :7], v[..., :7], par, lens), {}, ValueError, "k_cache"),
        ("parents-float", (q, k, v, par.double(), lens), {}, TypeError, "parents"),
        ("parents-one-short", (q, k, v, par[:5], lens), {}, ValueError, "parents"),
        ("parent-after-its-child", (q, k, v, edit(par, 1, 3), lens), {}, ValueError, "parents"),
        ("parent-below-minus-1", (q, k, v, edit(par, 0, -2), lens), {}, ValueError, "parents"),
        ("prefix_lens-one-short", (q, k, v, par, lens[:1]), {}, ValueError, "prefix_lens"),
        ("prefix_lens-negative", (q, k, v, par, edit(lens, 0, -1)), {}, ValueError, "prefix_lens"),
        ("tree-past-the-cache", (q, k, v, par, edit(lens, 1, 9)), {}, ValueError, "prefix_lens"),
        ("prefix_lens-a-list", (q, k, v, par, lens.tolist()), {}, TypeError, "prefix_lens"),
        ("scale-nan", (q, k, v, par, lens), {"scale": float("nan")}, ValueError, "scale"),
        ("scale-a-string", (q, k, v, par, lens), {"scale": "0.35"}, TypeError, "scale"),
        ("k_cache-on-another-device", (q, k.to(meta), v, par, lens), {}, ValueError, "k_cache"),
    ]
    return [InvalidCall(what, args, {"scale": 0.35, **kw}, (exc,), argument)
            for what, args, kw, exc, argument in calls]


CONTRACT = Contract(
    technique="tree_attention",
    functions=("tree_attention",),
    doc=__doc__,
    cases=cases,
    returns={"tree_attention": torch.Tensor},
    invalid=invalid,
)


# ----------------------------------------------------------------------------------------------
# coverage table: observations are the law's cases (properties/tree_attention/cases.py TreeCase:
# parents, lens, Hq, Hkv, D, scale)
# ----------------------------------------------------------------------------------------------

#: The law that judges one call's values (SD-10's, at the attention level).
_SD10 = ("law_tree_attention_matches_paths",)


def depth_of(parents) -> int:
    """The tree's depth (1 for a tree of root-level nodes only)."""
    return max(len(ancestors(parents, i)) for i in range(len(parents)))


def _max_depth(parents) -> int:
    """The largest depth of a tree given by parent pointers (the root's children at depth 1)."""
    d: list[int] = []
    for p in parents:
        d.append(1 if p < 0 else d[p] + 1)
    return max(d)


def _coverage() -> tuple:
    out = [
        CoverageClass("a chain (node i the child of node i - 1)", _SD10,
                      lambda c: len(c.parents) > 1 and all(p == i - 1 for i, p in enumerate(c.parents))),
        CoverageClass("a wide root (4 or more root-level nodes)", _SD10, lambda c: sum(p < 0 for p in c.parents) >= 4),
        CoverageClass("a deep branch (depth >= 4) beside other branches", _SD10,
                      lambda c: depth_of(c.parents) >= 4 and sum(p < 0 for p in c.parents) > 1),
        CoverageClass("a later sibling after an earlier sibling's subtree", _SD10,
                      lambda c: any(c.parents[j] == c.parents[i] and any(c.parents[m] == i for m in range(i + 1, j))
                                    for i in range(len(c.parents)) for j in range(i + 1, len(c.parents)))),
        CoverageClass("one node", _SD10, lambda c: len(c.parents) == 1),
        CoverageClass("more than 16 nodes", _SD10, lambda c: len(c.parents) > 16),
        CoverageClass("a node deeper than 16 (an ancestor chain past a tile of 16 nodes)", _SD10,
                      lambda c: _max_depth(c.parents) > 16),
        CoverageClass("prefix length 0", _SD10, lambda c: min(c.lens) == 0),
        CoverageClass("B > 1 with different prefix lengths", _SD10, lambda c: len(set(c.lens)) > 1),
        CoverageClass("GQA with several KV heads (Hq > Hkv > 1)", _SD10, lambda c: c.Hq > c.Hkv > 1),
        CoverageClass("head dim not a power of two", _SD10, lambda c: c.D & (c.D - 1)),
        CoverageClass("negative scale", _SD10, lambda c: c.scale < 0),
    ]
    for t in (16, 32):
        for r, what in ((0, "a multiple of"), (1, "one past a multiple of"), (t - 1, "one short of a multiple of")):
            out.append(CoverageClass(f"prefix length {what} {t}", _SD10,
                                     lambda c, t=t, r=r: any(n >= t - 1 and n % t == r for n in c.lens)))
    return tuple(out)


#: The tree_attention contract's coverage table (see :class:`CoverageClass`).
COVERAGE = _coverage()
