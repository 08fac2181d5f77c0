"""The ``speculative_tree`` contract: verifying a token tree (or k independent drafts) in one round.

    verify_tree(parents, draft_tokens, draft_probs, target_probs, *, generator) -> (tokens, path)

Tree speculation (SpecInfer, Miao et al. 2024; lecture 002 §6.6): the draft proposes a token tree
instead of one chain, the target scores every node in one forward (the tree mask, claim SD-10),
and ``verify_tree`` keeps one root-to-node path and emits one more token. k independent drafts
are the tree whose root has k chains. This is its own contract, beside the chain's
(``speculative``: ``verify``), so that every chain verifier keeps its one-function call.

Arguments (B sequences, n_nodes draft nodes, V vocabulary; one tree shape for the whole batch):

- ``parents`` (n_nodes,) int64: the parent of node i, ``-1`` for the root (the last token already
  in the sequence), else a node before it: ``-1 <= parents[i] < i`` (nodes in topological order).
  The depth of a node is 1 for the root's children; ``depth`` below is the largest.
- ``draft_tokens`` (B, n_nodes) int64: the token of each node, in [0, V).
- ``draft_probs`` (B, n_nodes+1, V) float: the draft's distribution q at the root (row 0) and
  after each node (row i+1). The children of a node are drawn independently from that node's row
  (siblings are i.i.d., with replacement: the case SpecInfer's theorem covers), so a node's
  token has q > 0 in its parent's row.
- ``target_probs`` (B, n_nodes+1, V) float: the target's distribution p at the root (row 0) and
  after each node (row i+1), as the tree-masked forward gives them.
  Both probability tensors are non-negative, finite, of one floating dtype (float64, float32,
  float16, bfloat16), on one device, and each row sums to 1 (within 1e-9 in float64, 1e-5 in
  float32, 1e-2 in 16-bit); any strides.
- ``generator``: a ``torch.Generator`` on the tensors' device, the only source of randomness.

The rule, recursive rejection sampling (SpecInfer, Algorithm 2; multi-draft speculative sampling):
start at the root with the residual r = p(root). Try the children of the current node u in index
order: child c with token x is accepted with probability min(1, r(x) / q_u(x)); on acceptance
move to c (r = p(c)) and repeat; on rejection replace r by norm(max(0, r − q_u)) and try the next
sibling. When every child of u is rejected, emit a token drawn from r (the correction); when u
has no children, emit the bonus token drawn from p(u).

Returns ``tokens`` (B, depth+1) int64 on the inputs' device: the accepted path's draft tokens,
then the one emitted token, then −1 padding; and ``path`` (B, depth) int64: the accepted nodes'
indices, root side first, then −1 padding (the number accepted is ``(path >= 0).sum(-1)``; the
emitted token is ``tokens[b, n]``).

The law this buys (SD-11): the emitted tokens follow the target's distribution exactly, for any
tree shape and any drafts. Unspecified: the order in which the generator's numbers are drawn, and
the correction where max(0, r − q) is zero everywhere (r = q: a rejection has probability 0).
A chain (parents = −1, 0, 1, ...) is the ``speculative`` contract's round.

Errors (:func:`validate`, before anything is computed): TypeError for a non-tensor, ``parents`` or
``draft_tokens`` not int64, probabilities not floating or of two dtypes, a generator that is not a
``torch.Generator``; ValueError for wrong ranks or sizes (n_nodes >= 1, V >= 1), a parent outside
[-1, i), mixed devices or a generator on another device, a token outside [0, V), a node whose
token has q = 0 in its parent's row, negative or non-finite probabilities, or a row whose sum is
not 1. Each message names the argument. An implementation may raise ``NotImplementedError`` for a
dtype, size or tree shape it does not support ("unsupported", never a pass).

Sources: Miao et al. 2024 (SpecInfer: tree-based speculative inference and verification,
Algorithm 2 and Theorem 4.2); Chen et al. 2023; Cai et al. 2024 (Medusa, its typical acceptance
is not this rule: SD-13); lecture 002 §6.6. Claims: SD-11, SD-13 (CLAIMS.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from inference_conformance.conformance.contracts.speculative import (DTYPES, PAD, TOKEN_DTYPE, check_tokens_and_probs, check_types,
                                               random_distributions)
from inference_conformance.conformance.registry import Contract, InvalidCall

__all__ = ["DTYPES", "PAD", "TreeShape", "validate", "depths", "children", "cases", "invalid", "CONTRACT"]


@dataclass(frozen=True)
class TreeShape:
    """The sizes of one call: batch B, ``n_nodes`` draft nodes, vocabulary V, the tree's ``depth``."""

    B: int
    n_nodes: int
    V: int
    depth: int


def depths(parents) -> list[int]:
    """The depth of each node of ``parents`` (a list or tensor of ints; the root's children: 1).
    Assumes valid parent pointers (:func:`validate`)."""
    out: list[int] = []
    for i, par in enumerate(int(x) for x in parents):
        out.append(1 if par < 0 else out[par] + 1)
    return out


def children(parents) -> list[list[int]]:
    """``children[u + 1]``: the children of node u in index order (``children[0]``: the root's)."""
    par = [int(x) for x in parents]
    out: list[list[int]] = [[] for _ in range(len(par) + 1)]
    for i, p in enumerate(par):
        out[p + 1].append(i)
    return out


def validate(parents, draft_tokens, draft_probs, target_probs, generator) -> TreeShape:
    """Check one ``verify_tree`` call against the contract; return its sizes.

    Raises TypeError or ValueError naming the argument (see the module docstring). Reads the
    tensors on the host (one synchronisation on CUDA).
    """
    if not isinstance(parents, torch.Tensor):
        raise TypeError(f"parents must be a torch.Tensor, got {type(parents).__name__}")
    if parents.dtype != TOKEN_DTYPE:
        raise TypeError(f"parents must be int64 (n_nodes,), got {parents.dtype}")
    check_types(draft_tokens, draft_probs, target_probs, generator, contract="speculative_tree",
                tokens_shape="(B, n_nodes)")
    if parents.dim() != 1 or parents.shape[0] < 1:
        raise ValueError(f"parents must have shape (n_nodes,) with n_nodes >= 1, got shape {tuple(parents.shape)}")
    n = parents.shape[0]
    if draft_tokens.dim() != 2 or draft_tokens.shape[0] < 1 or draft_tokens.shape[1] != n:
        raise ValueError(f"draft_tokens must have shape (B, n_nodes) = (B >= 1, {n}), got shape "
                         f"{tuple(draft_tokens.shape)}")
    B = draft_tokens.shape[0]
    for name, t in (("draft_probs", draft_probs), ("target_probs", target_probs)):
        if t.dim() != 3:
            raise ValueError(f"{name} must have 3 dimensions (B, n_nodes+1, V), got shape {tuple(t.shape)}")
    V = draft_probs.shape[-1]
    if V < 1:
        raise ValueError(f"draft_probs must have a vocabulary V >= 1, got shape {tuple(draft_probs.shape)}")
    for name, t in (("draft_probs", draft_probs), ("target_probs", target_probs)):
        if tuple(t.shape) != (B, n + 1, V):
            raise ValueError(f"{name} must have shape (B, n_nodes+1, V) = ({B}, {n + 1}, {V}), got "
                             f"{tuple(t.shape)}")
    dev = draft_tokens.device
    for name, t in (("parents", parents), ("draft_probs", draft_probs), ("target_probs", target_probs)):
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device}, draft_tokens on {dev}: all tensors must be on one device")
    if generator.device.type != dev.type:
        raise ValueError(f"generator is on {generator.device}, the tensors on {dev}: pass a torch.Generator "
                         f"on the tensors' device")
    par = parents.detach().to("cpu")
    idx = torch.arange(n)
    bad = ((par < -1) | (par >= idx)).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise ValueError(f"parents[{i}] = {int(par[i])} must lie in [-1, {i}): -1 for the root, else an "
                         f"earlier node (topological order)")
    tok = check_tokens_and_probs(draft_tokens, draft_probs, target_probs, V)
    rows = (par + 1)[None, :, None].expand(B, n, 1)                     # each node's parent row
    q_parent = draft_probs.detach().to("cpu").gather(1, rows.expand(B, n, V))
    q_x = q_parent.gather(-1, tok[..., None])[..., 0]
    zero = (q_x == 0).nonzero()
    if zero.numel():
        b, i = (int(x) for x in zero[0])
        raise ValueError(f"draft_tokens[{b}, {i}] = {int(tok[b, i])} has draft probability 0 in its parent's row "
                         f"draft_probs[{b}, {int(par[i]) + 1}]: a node's token is drawn from its parent's q, so q > 0")
    return TreeShape(B, n, V, max(depths(par.tolist())))


#: Tree shapes of the contract's cases and laws: a chain, k = 3 independent drafts of two tokens,
#: a binary tree of depth 2, and SpecInfer's wide-then-narrow shape.
SHAPES = {
    "chain": (-1, 0, 1),
    "three-drafts": (-1, 0, -1, 2, -1, 4),
    "binary": (-1, -1, 0, 0, 1, 1),
    "wide-root": (-1, -1, -1, -1, 0, 0, 4),
}


def draw_tree_tokens(parents, q: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """(B, n_nodes) int64 node tokens drawn from their parents' rows of ``q`` (B, n_nodes+1, V)
    float64 on the CPU (the draft's proposal the contract assumes)."""
    B, _, V = q.shape
    rows = torch.tensor([int(p) + 1 for p in parents])
    return torch.multinomial(q[:, rows].reshape(-1, V), 1, generator=generator).reshape(B, len(rows))


def cases(seed: int, device: str) -> list[tuple[tuple, dict]]:
    """Small valid calls for the checks every contract gets: each tree shape of :data:`SHAPES`
    in one dtype (float64 with V = 257, float32, float16, bfloat16), one row where q = p."""
    out = []
    for i, ((name, parents), dt, V) in enumerate(zip(SHAPES.items(), DTYPES, (257, 8, 50, 16))):
        g = torch.Generator().manual_seed(1000 * seed + i)
        n, B = len(parents), 3
        q = random_distributions((B, n + 1, V), g, sharp=2.0)
        p = random_distributions((B, n + 1, V), g, sharp=2.0)
        p[0] = q[0]
        q, p = q.to(dt), p.to(dt)
        q = q / q.double().sum(-1, keepdim=True).to(dt)
        p = p / p.double().sum(-1, keepdim=True).to(dt)
        tokens = draw_tree_tokens(parents, q.double(), g)
        par = torch.tensor(parents, dtype=torch.int64, device=device)
        gen = torch.Generator(device=device).manual_seed(seed + i)
        out.append(((par, tokens.to(device), q.to(device), p.to(device)), {"generator": gen}))
    return out


def invalid(device: str) -> list[InvalidCall]:
    """The calls this contract documents as invalid, with the argument each message must name:
    the binary tree of depth 2 (6 nodes), B = 2, V = 5, float32, tokens drawn from q."""
    g = torch.Generator().manual_seed(0)
    parents = SHAPES["binary"]
    q = random_distributions((2, 7, 5), g)
    p = random_distributions((2, 7, 5), g)
    tok = draw_tree_tokens(parents, q, g).to(device)
    par = torch.tensor(parents, dtype=torch.int64, device=device)
    q, p = q.float().to(device), p.float().to(device)

    def edit(t, idx, value):
        t = t.clone()
        t[idx] = value
        return t

    # node 2's parent is node 0 (row 1): q = 0 at its token there
    x = int(tok[0, 2])
    q_zero = edit(edit(q, (0, 1), 0.0), (0, 1, (x + 1) % 5), 1.0)
    calls = [  # (what, (parents, draft_tokens, draft_probs, target_probs), raises, argument)
        ("parents-not-a-tensor", (list(parents), tok, q, p), TypeError, "parents"),
        ("int32-parents", (par.int(), tok, q, p), TypeError, "parents"),
        ("int32-draft-tokens", (par, tok.int(), q, p), TypeError, "draft_tokens"),
        ("mixed-dtypes", (par, tok, q.double(), p), TypeError, ("draft_probs", "target_probs")),
        ("parents-2-d", (par[None], tok, q, p), ValueError, "parents"),
        ("parent-after-its-child", (edit(par, 1, 3), tok, q, p), ValueError, "parents"),
        ("parent-below-minus-1", (edit(par, 0, -2), tok, q, p), ValueError, "parents"),
        ("tokens-one-node-short", (par, tok[:, :5], q, p), ValueError, "draft_tokens"),
        ("target-one-row-short", (par, tok, q, p[:, :6]), ValueError, "target_probs"),
        ("vocab-differs", (par, tok, q, p[..., :4]), ValueError, "target_probs"),
        ("token-out-of-range", (par, torch.full_like(tok, 5), q, p), ValueError, "draft_tokens"),
        ("q-0-at-a-node-token", (par, tok, q_zero, p), ValueError, ("draft_probs", "draft_tokens")),
        ("row-not-summing-to-1", (par, tok, q, p * 1.5), ValueError, "target_probs"),
        ("nan-probability", (par, tok, q, torch.full_like(p, float("nan"))), ValueError, "target_probs"),
    ]
    out = [InvalidCall(what, args, {"generator": torch.Generator(device=device).manual_seed(0)}, (exc,), argument)
           for what, args, exc, argument in calls]
    out.append(InvalidCall("generator-not-a-generator", (par, tok, q, p), {"generator": 0}, (TypeError,), "generator"))
    return out


CONTRACT = Contract(
    technique="speculative_tree",
    functions=("verify_tree",),
    doc=__doc__,
    cases=cases,
    returns={"verify_tree": tuple},
    invalid=invalid,
)
