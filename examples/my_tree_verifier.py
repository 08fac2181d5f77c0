"""A worked outside implementation of the ``speculative_tree`` contract, written without the
suite's code except its argument checks: recursive rejection sampling in numpy, node by node over the
whole batch, its uniforms drawn from the given generator. ``verify_tree`` conforms; ``wrong_tree_verifier``
recomputes the residual from p after every rejected sibling (norm(max(0, p − q)) each time)
instead of from the residual the earlier siblings left, a bug of multi-draft verifiers that SD-11
rejects.

    PYTHONPATH=examples pytest properties --impl speculative_tree=my_tree_verifier:verify_tree
"""
from __future__ import annotations

import numpy as np
import torch

from inference_conformance.conformance.contracts.speculative_tree import validate


def _verify(parents, draft_tokens, draft_probs, target_probs, generator, update_residual: bool):
    validate(parents, draft_tokens, draft_probs, target_probs, generator)
    par = parents.cpu().numpy()
    tok = draft_tokens.cpu().numpy()
    q = draft_probs.detach().cpu().double().numpy()
    p = target_probs.detach().cpu().double().numpy()
    B, n = tok.shape
    depth = np.zeros(n, dtype=int)
    for i, j in enumerate(par):
        depth[i] = 1 if j < 0 else depth[j] + 1
    last_child = {int(u): max(i for i in range(n) if par[i] == u) for u in set(par.tolist())}
    D = int(depth.max())
    uniforms = torch.rand((B, n + 1), generator=generator, dtype=torch.float64,
                          device=draft_tokens.device).cpu().numpy()
    rows = np.arange(B)
    node = np.full(B, -1)                      # each row's current node
    walking = np.ones(B, dtype=bool)
    r = p[:, 0].copy()                         # each row's residual
    tokens = np.full((B, D + 1), -1, dtype=np.int64)
    path = np.full((B, D), -1, dtype=np.int64)
    for c in range(n):                         # nodes in topological order: children after parents
        u = int(par[c])
        here = walking & (node == u)
        qu, x = q[:, u + 1], tok[:, c]
        accept = here & (uniforms[:, c] * qu[rows, x] < r[rows, x])
        reject = here & ~accept
        base = r if update_residual else p[:, u + 1]
        res = np.clip(base - qu, 0.0, None)
        mass = res.sum(1, keepdims=True)
        res = np.where(mass > 0, res / np.where(mass > 0, mass, 1.0), r)
        r = np.where(accept[:, None], p[:, c + 1], np.where(reject[:, None], res, r))
        node = np.where(accept, c, node)
        path[accept, depth[c] - 1] = c
        tokens[accept, depth[c] - 1] = x[accept]
        is_leaf = c not in last_child
        walking &= ~((accept & is_leaf) | (reject & (last_child[u] == c)))
    n_acc = (path >= 0).sum(1)
    cdf = np.cumsum(r / r.sum(1, keepdims=True), axis=1)
    last = np.minimum((cdf <= uniforms[:, -1:]).sum(1), r.shape[1] - 1)
    tokens[rows, n_acc] = last
    dev = draft_tokens.device
    return torch.from_numpy(tokens).to(dev), torch.from_numpy(path).to(dev)


def verify_tree(parents, draft_tokens, draft_probs, target_probs, *, generator):
    return _verify(parents, draft_tokens, draft_probs, target_probs, generator, update_residual=True)


def wrong_tree_verifier(parents, draft_tokens, draft_probs, target_probs, *, generator):
    return _verify(parents, draft_tokens, draft_probs, target_probs, generator, update_residual=False)
