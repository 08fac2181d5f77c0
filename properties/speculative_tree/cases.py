"""Inputs and checks of the token-tree laws (SD-11, SD-13; SpecInfer, lecture 001 §6), shared by
``properties/speculative_tree/test_speculative_tree.py`` and its engine laws: :class:`TreeCase` and the tree
strategies (:func:`tree_case`, :func:`tree_cases`, :data:`PINNED_TREES`), their tensors
(:func:`tree_tensors`), the structure checks (:func:`check_tree_structure`), and the statistical
law on emitted sequences (:data:`TREE_STAT_CONFIGS`, :func:`emitted_counts`,
:func:`tree_law_verdicts`, :func:`tree_law_power`). The chain (SD-1) cases are in
``properties/speculative/cases.py``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st

from inference_conformance.conformance.contracts.speculative import PAD
from inference_conformance.conformance.stats import GTest, check_counts, multinomial_counts
from inference_conformance.properties.speculative.cases import ALPHA, normalized


@dataclass(frozen=True)
class TreeCase:
    """One token tree and the draft's and target's distributions after every prefix.

    ``parents``: the contract's parent pointers; ``V``: the vocabulary; ``q_table``, ``p_table``
    (P, V) float64: the draft's and the target's distribution after each prefix of length
    0..depth, prefixes numbered level by level (:meth:`prefix_id`); ``label``: the boundary class."""

    parents: tuple
    V: int
    q_table: np.ndarray
    p_table: np.ndarray
    label: str = ""

    @property
    def depth(self) -> int:
        from inference_conformance.conformance.contracts.speculative_tree import depths

        return max(depths(self.parents))

    def prefix_id(self, prefix) -> int:
        """The row of ``prefix`` (a token tuple) in the tables: levels in order, base-V within one."""
        offset = sum(self.V ** k for k in range(len(prefix)))
        code = 0
        for x in prefix:
            code = code * self.V + int(x)
        return offset + code

    def q(self, prefix) -> np.ndarray:
        return self.q_table[self.prefix_id(prefix)]

    def p(self, prefix) -> np.ndarray:
        return self.p_table[self.prefix_id(prefix)]

    def outcomes(self, rule=None) -> dict:
        """The exact distribution of one round's emitted tokens under ``rule`` (default: exact)."""
        from inference_conformance.reference.speculative_tree import EXACT, tree_outcomes

        return tree_outcomes(self.parents, self.q, self.p, self.V, rule or EXACT)

    def __repr__(self) -> str:
        return f"TreeCase({self.label or 'drawn'}, parents={list(self.parents)}, V={self.V})"


def tree_case(parents, V: int, seed: int, kind: str = "dense") -> TreeCase:
    """A :class:`TreeCase` with seeded random rows of one boundary class: ``dense`` (every token
    possible), ``sparse`` (zeros in q and p, never a whole row), ``p=q`` (the draft is the
    target), ``disjoint`` (q and p with disjoint supports at the root), ``onehot-p`` (a
    deterministic target), ``q=0<p`` (the draft never proposes a token the target likes)."""
    from inference_conformance.conformance.contracts.speculative_tree import depths

    rng = np.random.default_rng(seed)
    n_rows = sum(V ** k for k in range(max(depths(parents)) + 1))
    q = rng.gamma(0.6, size=(n_rows, V)) + 1e-3
    p = rng.gamma(0.6, size=(n_rows, V)) + 1e-3
    if kind == "sparse":
        q *= rng.random((n_rows, V)) < 0.7
        p *= rng.random((n_rows, V)) < 0.7
        q[:, 0] += 1e-2
        p[:, -1] += 1e-2
    elif kind == "p=q":
        p = q.copy()
    elif kind == "disjoint":
        half = max(1, V // 2)
        q[0, half:], p[0, :half] = 0.0, 0.0
    elif kind == "onehot-p":
        p = np.eye(V)[rng.integers(V, size=n_rows)]
    elif kind == "q=0<p":
        q[:, -1] = 0.0
    return TreeCase(tuple(parents), V, normalized(q), normalized(p), kind)


TREE_KINDS = ("dense", "sparse", "p=q", "disjoint", "onehot-p", "q=0<p")


@st.composite
def tree_cases(draw, max_nodes: int = 5, max_V: int = 3) -> TreeCase:
    """Random trees (n_nodes in 1..max_nodes, each parent drawn from the root and the earlier
    nodes) and vocabularies V in 2..max_V, with rows of a drawn boundary class."""
    n = draw(st.integers(1, max_nodes))
    parents = tuple(draw(st.integers(-1, i - 1)) for i in range(n))
    V = draw(st.integers(2, max_V))
    return tree_case(parents, V, draw(st.integers(0, 2**31 - 1)), draw(st.sampled_from(TREE_KINDS)))


#: Pinned trees of the exact law: each shape of the contract and every boundary class, plus the
#: deepest chain the enumerator is cheap on.
def _pinned_trees():
    from inference_conformance.conformance.contracts.speculative_tree import SHAPES

    out = [tree_case(shape, 3, i, kind) for i, (shape, kind) in enumerate(zip(SHAPES.values(), TREE_KINDS))]
    out += [tree_case(SHAPES["binary"], 3, 11, TREE_KINDS[4]), tree_case(SHAPES["wide-root"], 2, 12, TREE_KINDS[5]),
            tree_case((-1, 0, 1, 2), 3, 13, "dense")]
    return tuple(out)


PINNED_TREES = _pinned_trees()


def tree_tensors(case: TreeCase, B: int, seed: int, device: str, dtype=torch.float64):
    """B independent rounds of ``case``: node tokens drawn from their parents' q rows (each row
    its own draws), and each node's q and p after its path. Returns (parents (n_nodes,),
    draft_tokens (B, n_nodes), draft_probs, target_probs (B, n_nodes+1, V)) on ``device``."""
    g = torch.Generator().manual_seed(seed)
    Q, P = torch.from_numpy(case.q_table), torch.from_numpy(case.p_table)
    V = case.V
    code = [torch.zeros(B, dtype=torch.int64)]                       # row of each node's prefix; root: 0
    level = [0]
    offsets = [sum(V ** k for k in range(d)) for d in range(case.depth + 2)]
    tokens = []
    for i, par in enumerate(case.parents):
        parent_row = code[par + 1]
        x = torch.multinomial(Q[parent_row], 1, generator=g)[:, 0]
        d = level[par + 1] + 1
        within = (parent_row - offsets[d - 1]) * V + x
        code.append(offsets[d] + within)
        level.append(d)
        tokens.append(x)
    rows = torch.stack(code, 1)                                       # (B, n_nodes+1)
    par = torch.tensor(case.parents, dtype=torch.int64, device=device)
    return (par, torch.stack(tokens, 1).to(device), Q[rows].to(device, dtype), P[rows].to(device, dtype))


def check_tree_structure(parents, tokens, path, draft_tokens) -> None:
    """Exact checks of one ``verify_tree`` result: shapes and dtype, the path a chain of parent
    pointers from the root, its tokens the nodes' tokens, one emitted token after it in [0, V),
    −1 padding after that."""
    from inference_conformance.conformance.contracts.speculative_tree import depths

    par = [int(x) for x in parents.tolist()]
    depth = max(depths(par))
    B = draft_tokens.shape[0]
    assert tokens.dtype == torch.int64 and path.dtype == torch.int64, \
        f"tokens and path must be int64, got {tokens.dtype} and {path.dtype}"
    assert tuple(tokens.shape) == (B, depth + 1) and tuple(path.shape) == (B, depth), \
        f"tokens must be (B, depth+1) = ({B}, {depth + 1}) and path (B, depth), got {tuple(tokens.shape)}, " \
        f"{tuple(path.shape)}"
    pt, tt, dt = path.cpu().numpy(), tokens.cpu().numpy(), draft_tokens.cpu().numpy()
    n = (pt >= 0).sum(1)
    cols = np.arange(depth)
    assert ((pt >= 0) == (cols[None] < n[:, None])).all(), "path: accepted nodes must come first, then -1 padding"
    prev = np.full(B, -1)
    for d in range(depth):
        on = d < n
        node = pt[:, d]
        ok = ~on | (np.asarray(par)[np.clip(node, 0, None)] == prev)
        assert ok.all(), f"path row {int(np.flatnonzero(~ok)[0])}: node {int(node[~ok][0])} is not a child of the " \
                         f"node before it"
        same = ~on | (tt[:, d] == dt[np.arange(B), np.clip(node, 0, None)])
        assert same.all(), f"tokens row {int(np.flatnonzero(~same)[0])}: an accepted token is not its node's token"
        prev = np.where(on, node, prev)
    last = tt[np.arange(B), n]
    assert (last >= 0).all(), "tokens: the emitted token after the path is missing (-1)"
    pad = np.arange(depth + 1)[None] > n[:, None]
    assert (tt[pad] == PAD).all(), "tokens: -1 padding expected after the emitted token"


#: The grid of the statistical law's probabilities: multiples of 2^-GRID_BITS, exact in every
#: dtype of the contract (bfloat16 holds 8 significant bits), each row summing to exactly 1.
GRID_BITS = 8


def on_grid(table: np.ndarray, bits: int = GRID_BITS) -> np.ndarray:
    """``table`` (rows, V) float64 rounded row by row to multiples of 2^-bits summing to exactly 1
    (largest remainders), zeros kept and every nonzero entry at least 2^-bits: the same numbers
    in float64, float32, float16 and bfloat16, so one enumeration is exact for every dtype."""
    n = 2 ** bits
    out = np.zeros_like(table)
    for i, row in enumerate(np.asarray(table, np.float64)):
        nz = row > 0
        units = np.where(nz, np.maximum(np.floor(row * n), 1), 0).astype(np.int64)
        order = np.argsort(-(row * n - units))
        k = 0
        while units.sum() != n:
            j = order[k % len(order)]
            step = 1 if units.sum() < n else -1
            if nz[j] and units[j] + step >= 1:
                units[j] += step
            k += 1
        out[i] = units / n
    return out


def grid_case(case: TreeCase) -> TreeCase:
    """``case`` with its q and p tables :func:`on_grid` (its label and tree kept)."""
    return TreeCase(case.parents, case.V, on_grid(case.q_table), on_grid(case.p_table), case.label)


#: Tree configurations of the statistical SD-11 law: three shapes, dense rows where every
#: acceptance matters, and two boundary classes, their probabilities on the grid (the law runs in
#: every dtype of the contract); rounds per configuration.
TREE_STAT_CONFIGS = {
    "binary-V3": grid_case(tree_case((-1, -1, 0, 0, 1, 1), 3, 101, "dense")),
    "three-drafts-V3": grid_case(tree_case((-1, 0, -1, 2, -1, 4), 3, 102, "dense")),
    "wide-root-V4": grid_case(tree_case((-1, -1, -1, -1, 0, 0, 4), 4, 103, "dense")),
    "disjoint-binary": grid_case(tree_case((-1, -1, 0, 0, 1, 1), 3, 104, "disjoint")),
    "q=0<p-drafts": grid_case(tree_case((-1, 0, -1, 2), 3, 105, "q=0<p")),
}
TREE_STAT_TRIALS = {"binary-V3": 20_000, "three-drafts-V3": 20_000, "wide-root-V4": 20_000,
                    "disjoint-binary": 6_000, "q=0<p-drafts": 6_000}


def sequence_categories(outcomes: dict) -> tuple[dict, np.ndarray]:
    """The emitted sequences of ``outcomes`` as categories: ({sequence: index}, probabilities)."""
    keys = sorted(outcomes)
    return {k: i for i, k in enumerate(keys)}, np.array([outcomes[k] for k in keys])


def emitted_counts(tokens, index: dict) -> tuple[np.ndarray, int]:
    """Counts of each emitted sequence (a row of ``tokens`` up to its padding) over ``index``'s
    categories, and the number of rows whose sequence is not among them (impossible outcomes)."""
    counts = np.zeros(len(index))
    impossible = 0
    for row in tokens.cpu().tolist():
        key = tuple(x for x in row if x != PAD)
        i = index.get(key)
        if i is None:
            impossible += 1
        else:
            counts[i] += 1
    return counts, impossible


def tree_law_verdicts(impl, seed: int, device: str, alpha: float = ALPHA, dtype=torch.float64):
    """The statistical SD-11 law on ``impl``: per configuration of :data:`TREE_STAT_CONFIGS`, one
    ``verify_tree`` call over its rounds, the probabilities in ``dtype`` (exact: on the grid), its
    structure checked exactly, then one G-test of the emitted sequences against the enumeration
    at alpha / configurations (family-wise ``alpha``)."""
    out = []
    for k, (name, case) in enumerate(TREE_STAT_CONFIGS.items()):
        # the drafts' seed and the verifier's differ: one stream for both would correlate the
        # verifier's uniforms with the draws that made the tokens
        args = tree_tensors(case, TREE_STAT_TRIALS[name], 7919 * (seed + k) + 1, device, dtype)
        tokens, path = impl(*args, generator=torch.Generator(device=device).manual_seed(seed + k))
        check_tree_structure(args[0], tokens, path, args[1])
        index, probs = sequence_categories(case.outcomes())
        counts, impossible = emitted_counts(tokens, index)
        if impossible:
            counts = np.append(counts, impossible)
            probs = np.append(probs, 0.0)
        out.append(check_counts(counts, probs / probs.sum(), alpha=alpha / len(TREE_STAT_CONFIGS),
                                what=f"{name}: emitted sequences of {TREE_STAT_TRIALS[name]} rounds vs the exact "
                                     f"enumeration"))
    return out


def tree_law_power(rule, draws: int, seed: int, alpha: float = ALPHA) -> tuple[int, dict[str, int]]:
    """The statistical SD-11 law run ``draws`` times on exact multinomial draws of the rounds of a
    verifier following ``rule`` (a :class:`inference_conformance.reference.speculative_tree.Rule`; the exact one: the
    law's false-alarm rate, a biased one: its power). Returns (draws rejected, per configuration)."""
    rng = np.random.default_rng(seed)
    any_reject = np.zeros(draws, dtype=bool)
    per: dict[str, int] = {}
    for name, case in TREE_STAT_CONFIGS.items():
        index, exact = sequence_categories(case.outcomes())
        biased = case.outcomes(rule)
        keys = sorted(set(biased) | set(index))
        full_exact = np.array([exact[index[k]] if k in index else 0.0 for k in keys])
        full_biased = np.array([biased.get(k, 0.0) for k in keys])
        n = TREE_STAT_TRIALS[name]
        counts = multinomial_counts(full_biased, n, draws, rng)
        rejected = GTest(full_exact / full_exact.sum(), n, alpha / len(TREE_STAT_CONFIGS)).rejects(counts)
        per[name] = int(rejected.sum())
        any_reject |= rejected
    return int(any_reject.sum()), per
