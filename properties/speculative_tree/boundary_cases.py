"""The deterministic SD-11 check at the boundary values of a verifier's random numbers (SpecInfer's
recursive rejection sampling, ``conformance/contracts/speculative_tree.py``).

A node whose token x has residual r(x) = 0 (target probability 0, or nothing left of it after a
rejected sibling) is accepted with probability min(1, r(x)/q(x)) = 0: rejected for every uniform
u in [0, 1), u = 0 = r/q included; a node with r(x) >= q(x) is accepted with probability 1, for
every u, the largest u below 1 included. A verifier testing u <= r/q accepts the first at u = 0,
one drawing u in (0, 1] rejects the second at u = 1: events of probability 2^-53 (2^-24 for
float32 uniforms) that no seeded sampler reaches. :func:`uniforms_at` gives every uniform the
verifier draws through ``torch.rand``, ``torch.rand_like`` or ``Tensor.uniform_`` one of the two
ends of [0, 1) (0, or 1 - 2^-(p+1) in the draw's dtype of p significant bits: the largest below 1);
:data:`BOUNDARY_TREES` are trees whose every node is one of the two kinds, on probabilities that
are multiples of 1/4 (exact in every dtype of the contract); :func:`boundary_verdicts` checks the
path and the emitted token of each, in both ends. A verifier that draws none of its uniforms
through those functions cannot be given them: the check says so ("unsupported"), never a pass.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch


def boundary_value(end: str, dtype: torch.dtype) -> float:
    """The uniform at ``end`` of [0, 1) in ``dtype``: "low" 0.0, "high" the largest value below 1."""
    return 0.0 if end == "low" else 1.0 - torch.finfo(dtype).eps / 2


@contextmanager
def uniforms_at(end: str):
    """Inside the block every uniform drawn through ``torch.rand``, ``torch.rand_like`` or
    ``Tensor.uniform_`` (the generator passed or not) is :func:`boundary_value` ``(end, dtype)``
    (scaled to [a, b) for ``uniform_(a, b)``); yields a list that records each draw's dtype."""
    real_full, real_rand, real_rand_like = torch.full, torch.rand, torch.rand_like
    own_uniform = torch.Tensor.__dict__.get("uniform_")          # None: inherited from the C base class
    drawn: list = []

    def filled(shape, dtype, device):
        dtype = dtype or torch.get_default_dtype()
        drawn.append(dtype)
        return real_full(tuple(shape), boundary_value(end, dtype), dtype=dtype, device=device)

    def rand(*size, **kw):
        if "size" in kw:
            size = (kw.pop("size"),)
        shape = tuple(size[0]) if len(size) == 1 and not isinstance(size[0], int) else size
        return filled(shape, kw.get("dtype"), kw.get("device"))

    def rand_like(x, **kw):
        return filled(x.shape, kw.get("dtype") or x.dtype, kw.get("device") or x.device)

    def uniform_(self, a=0.0, b=1.0, **kw):
        drawn.append(self.dtype)
        with torch.no_grad():
            return self.fill_(a + (b - a) * boundary_value(end, self.dtype))

    torch.rand, torch.rand_like, torch.Tensor.uniform_ = rand, rand_like, uniform_
    try:
        yield drawn
    finally:
        torch.rand, torch.rand_like = real_rand, real_rand_like
        if own_uniform is None:
            del torch.Tensor.uniform_
        else:
            torch.Tensor.uniform_ = own_uniform


@dataclass(frozen=True)
class BoundaryTree:
    """One tree of the boundary check, the same in every row: ``parents``, node ``tokens``, the
    draft's and the target's rows ``q``, ``p`` ((n_nodes+1) lists of V probabilities, multiples of
    1/4), the ``path`` every uniform in [0, 1) must give, and the tokens the emitted one may be
    (those of positive probability in the row it is drawn from)."""

    name: str
    parents: tuple
    tokens: tuple
    q: tuple
    p: tuple
    path: tuple
    emitted: tuple


_U = (0.25, 0.25, 0.25, 0.25)
BOUNDARY_TREES = (
    # two drafts at the root, both of target probability 0: rejected at u = 0; the residual is p
    BoundaryTree("p(x)=0 siblings", (-1, -1, 0), (0, 1, 2), ((0.5, 0.5, 0, 0), _U, _U, _U),
                 ((0, 0, 0.5, 0.5), _U, _U, _U), (), (2, 3)),
    # the first sibling (p = 0) rejected leaves norm(max(0, p - q)) = one-hot at 2: the second
    # sibling's token 1 has p = 1/4 <= q = 1/2, nothing left of it, rejected at u = 0; emits 2
    BoundaryTree("residual 0 after a sibling", (-1, -1), (0, 1), ((0.5, 0.5, 0, 0), _U, _U),
                 ((0, 0.25, 0.75, 0), _U, _U), (), (2,)),
    # r = q at every node of a chain (p = q): accepted at the largest u below 1; the bonus from p
    BoundaryTree("r = q chain", (-1, 0, 1), (1, 2, 1), (_U, (0.5, 0, 0.5, 0), (0, 0.25, 0.75, 0), _U),
                 (_U, (0.5, 0, 0.5, 0), (0, 0.25, 0.75, 0), (0, 0, 0.25, 0.75)), (0, 1, 2), (2, 3)),
    # r > q at the first node (accepted for every u), then its only child, of target probability
    # 0, rejected; the correction norm(max(0, p - q)) is one-hot at 2
    BoundaryTree("accepted, then p(x)=0", (-1, 0), (2, 0), ((0.25, 0.25, 0.5, 0), (0.5, 0.5, 0, 0), _U),
                 ((0, 0, 1, 0), (0, 0.25, 0.75, 0), _U), (0,), (2,)),
)


def boundary_tensors(tree: BoundaryTree, B: int, device, dtype):
    """(parents, draft_tokens (B, n_nodes), draft_probs, target_probs (B, n_nodes+1, V)) of ``tree``."""
    par = torch.tensor(tree.parents, dtype=torch.int64, device=device)
    tok = torch.tensor([tree.tokens] * B, dtype=torch.int64, device=device)
    q = torch.tensor([tree.q] * B, dtype=dtype, device=device)
    p = torch.tensor([tree.p] * B, dtype=dtype, device=device)
    return par, tok, q, p


def boundary_verdicts(impl, device, dtype, B: int = 3) -> tuple[list[str], int]:
    """Run ``impl`` on every tree of :data:`BOUNDARY_TREES` with every uniform at each end of [0, 1)
    (:func:`uniforms_at`). Returns (the failures, one line each: tree, end, what was expected and
    what came out; the number of uniforms the verifier drew through the patched functions)."""
    failures, draws = [], 0
    for tree in BOUNDARY_TREES:
        args = boundary_tensors(tree, B, device, dtype)
        for end in ("low", "high"):
            with uniforms_at(end) as drawn:
                tokens, path = impl(*args, generator=torch.Generator(device=device).manual_seed(0))
            draws += len(drawn)
            for b in range(B):
                got_path = [int(x) for x in path[b].tolist() if x >= 0]
                emitted = int(tokens[b, len(got_path)]) if len(got_path) < tokens.shape[1] else None
                if got_path != list(tree.path) or emitted not in tree.emitted:
                    u = boundary_value(end, drawn[0] if drawn else torch.float64)
                    failures.append(f"{tree.name} ({dtype}, every uniform u = {u!r}): row {b} accepted nodes "
                                    f"{got_path} then emitted {emitted}; every u in [0, 1) must accept {list(tree.path)} "
                                    f"(r(x) >= q(x)), reject the next (r(x) = 0) and emit one of {list(tree.emitted)}")
                    break
    return failures, draws
