"""Tree speculation with KV caches (claims SD-10, SD-12; lecture 002 §2; SpecInfer, Miao et al.
2024): :class:`TreeCachedModel` scores a token tree in one forward over a :class:`CachedModel`'s
cache (every node's keys and values written after the cached prefix, the tree mask and
depth-based positions, :class:`TreeCacheAttention`) and keeps one branch; :class:`TreeSpeculativeEngine`
runs greedy tree speculation of one sequence with a drafter (the ``drafter`` contract: ``reference/drafter.py``,
``optimized/drafter/``).
"""
from __future__ import annotations

import torch

from inference_conformance.optimized.kv_cache.append import INDEX_DTYPE
from inference_conformance.optimized.speculative.engine import CachedModel
from inference_conformance.reference.transformer import Transformer


class TreeCacheAttention:
    """The attention backend of one tree forward over a :class:`CachedModel`'s cache: each layer
    appends the forward's n_nodes keys and values at slots [L_b, L_b + n_nodes) (L: the cached
    lengths) and attends by tree attention, ``attend_fn(q, k_cache, v_cache, parents,
    prefix_lens, scale=D ** -0.5)``: any implementation of the ``tree_attention`` contract
    (``conformance/contracts/tree_attention.py``; the built-ins in ``optimized/tree_attention/``)."""

    def __init__(self, cache, parents: torch.Tensor, lengths: torch.Tensor, host_lengths: torch.Tensor, attend_fn):
        self.cache, self.parents, self.attend_fn = cache, parents, attend_fn
        self.lengths, self.host_lengths = lengths, host_lengths

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        B, _, n, _ = k.shape
        host_count = torch.full((B,), n, dtype=INDEX_DTYPE)
        self.cache.append(layer, k, v, self.lengths, host_count.to(k.device), self.host_lengths, host_count)
        return self.attend_fn(q, self.cache.k[layer, :B], self.cache.v[layer, :B], self.parents, self.lengths,
                              scale=q.shape[-1] ** -0.5)


def _tree_attend(attention):
    """The tree_attention implementation ``attention`` names: "triton" or "torch" (the built-ins
    of ``optimized/tree_attention/``), or itself when it is a callable (any implementation)."""
    if callable(attention):
        return attention
    from inference_conformance.optimized.tree_attention import fused, vectorized

    return {"triton": fused.tree_attention, "torch": vectorized.tree_attention}[attention]


class TreeCachedModel(CachedModel):
    """A :class:`CachedModel` that also scores token trees in one forward and keeps one branch.

    :meth:`tree_forward` writes every node's keys and values after the cached prefix and scores
    the nodes with the tree mask and depth-based positions (SD-10), by the tree_attention
    implementation ``attention`` ("triton", "torch" or a callable); :meth:`keep_path` moves the
    accepted nodes' keys and values to consecutive slots and forgets the rest (the rejected
    branches: their slots are refilled with NaN when ``nan_fill``)."""

    attention = "triton"

    @torch.no_grad()
    def tree_forward(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """tokens (B, n_nodes) int64 (checked ids), parents (n_nodes,) int64 (the contract's
        pointers); node i goes to slot L_b + i at position L_b − 1 + depth(i). Returns logits
        (B, n_nodes, V). The cached lengths grow by n_nodes (:meth:`keep_path` shrinks them)."""
        from inference_conformance.conformance.contracts.speculative_tree import depths

        self._check_ids(tokens, "tokens", 2)
        self._check_vocab(tokens, "tokens")
        B, n = tokens.shape
        if B != self.batch:
            raise ValueError(f"tokens has batch {B}, the engine holds {self.batch} sequences")
        host_len = self.cache.host_lengths[:B].clone()
        if int(host_len.max()) + n > self.cache.max_seq_len:
            raise ValueError(f"the tree of {n} nodes does not fit max_seq_len={self.cache.max_seq_len}")
        dev = self.device
        depth = torch.tensor(depths(parents.tolist()), dtype=INDEX_DTYPE, device=dev)
        lengths = self.cache.lengths[:B].clone()
        positions = self.node_positions(lengths, depth)                                # (B, n)
        attention = TreeCacheAttention(self.cache, parents.to(dev), lengths, host_len, _tree_attend(self.attention))
        logits = self.model(tokens, positions, attention)
        count = torch.full((B,), n, dtype=INDEX_DTYPE)
        self.cache.advance(count.to(dev), count)
        return logits

    def node_positions(self, lengths: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
        """(B, n_nodes) RoPE positions of the tree's nodes: L_b − 1 + depth(i) (lengths (B,), the
        cached prefix; depth (n_nodes,)), each node's position on its own root-to-node path."""
        return lengths[:, None] - 1 + depth[None]

    def keep_path(self, start: int, nodes: list[int]) -> None:
        """Keep, of the tree written at slots [start, start + n_nodes) of sequence 0, the nodes
        ``nodes`` (root side first): node ``nodes[d]`` moves to slot start + d; the length becomes
        start + len(nodes), the rest is forgotten (B = 1)."""
        for d, node in enumerate(nodes):                  # node >= d: a slot is read before it is overwritten
            if node != d:
                for t in (self.cache.k, self.cache.v):
                    t[:, 0, :, start + d] = t[:, 0, :, start + node]
        self.rollback(torch.tensor([start + len(nodes)], dtype=INDEX_DTYPE))


class TreeSpeculativeEngine:
    """Greedy tree speculation of one sequence (B = 1) with a drafter (SD-12).

    ``drafter.propose(context, hidden, target)`` (the ``drafter`` contract,
    ``conformance/contracts/drafter.py``) returns (parents, tokens): a token tree to try after the
    committed tokens ``context`` (a copy of the engine's list of ids), given the target's final
    hidden state at the last committed token where the last round computed it (else None) and the
    target model; an empty tree is a plain decode step. A malformed tree raises ValueError naming
    the drafter and the index (``check_proposal``). Each round the target scores the pending token and the tree in one forward (the
    pending token is the tree's root node), greedy verification keeps the longest branch whose
    every token is the target's argmax, one more token is emitted, and the rejected branches'
    keys and values are dropped (:meth:`TreeCachedModel.keep_path`). ``attention``: "triton" or
    "torch". Stats: ``rounds`` (target forwards after the prefill), ``emitted``, ``accepted``,
    ``drafted`` (tree nodes proposed).
    """

    def __init__(self, target: Transformer, drafter, *, max_seq_len: int, attention: str = "triton",
                 nan_fill: bool = False):
        if attention not in ("triton", "torch"):
            raise ValueError(f"attention must be 'triton' or 'torch', got {attention!r}")
        self.target = TreeCachedModel(target, 1, max_seq_len)
        self.target.attention = attention
        self.target.nan_fill = bool(nan_fill)
        self.drafter = drafter
        self._hidden = None

    def _keep_hidden(self, module, inputs, output):
        self._hidden = output

    def _keep(self, start: int, nodes: list[int]) -> None:
        """Drop the rejected branches (known-bad engines override)."""
        self.target.keep_path(start, nodes)

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, max_new_tokens: int, on_round=None):
        """``prompt`` (1, S) int64, S >= 1 -> (tokens (1, S + max_new_tokens), stats).
        ``on_round(engine, committed)`` is called after every round with the committed ids."""
        self.target._check_ids(prompt, "prompt", 2)
        self.target._check_vocab(prompt, "prompt")
        if prompt.shape[0] != 1:
            raise ValueError(f"prompt must hold one sequence (1, S), got shape {tuple(prompt.shape)}")
        S = prompt.shape[1]
        ctx = prompt[0].tolist()
        m = self.target
        m.start(1)
        if S > 1:
            m.extend(prompt[:, :S - 1], torch.tensor([S - 1]))
        stats = {"rounds": 0, "emitted": 0, "accepted": 0, "drafted": 0}
        hook = m.model.norm.register_forward_hook(self._keep_hidden)   # the final hidden states
        try:
            self._rounds(ctx, S, max_new_tokens, stats, on_round)
        finally:
            hook.remove()
        return torch.tensor([ctx[:S + max_new_tokens]], dtype=torch.int64, device=prompt.device), stats

    def _rounds(self, ctx, S, max_new_tokens, stats, on_round):
        from inference_conformance.conformance.contracts.drafter import check_proposal
        from inference_conformance.reference.speculative_tree import verify_tree_greedy

        m, dev, hidden = self.target, self.target.device, None
        while len(ctx) < S + max_new_tokens:
            parents, tokens = check_proposal(self.drafter.propose(list(ctx), hidden, m.model), m.model.cfg.vocab_size,
                                             who=f"the drafter {type(self.drafter).__name__}")
            n = len(tokens)
            room = m.cache.max_seq_len - (len(ctx) - 1) - 1
            if n > room:
                parents, tokens, n = parents[:room], tokens[:room], room
            start = len(ctx) - 1                                     # the pending token's slot
            tree_par = torch.tensor([-1] + [p + 1 for p in parents], dtype=torch.int64)
            chunk = torch.tensor([[ctx[-1]] + list(tokens)], dtype=torch.int64, device=dev)
            logits = m.tree_forward(chunk, tree_par)                 # (1, n+1, V)
            hid = self._hidden
            par = torch.tensor(parents, dtype=torch.int64)
            if n:
                out, path = verify_tree_greedy(par, torch.tensor([tokens], dtype=torch.int64), logits.cpu())
                nodes = [int(x) for x in path[0].tolist() if x >= 0]
            else:
                nodes = []
            last = int(logits[0, (nodes[-1] + 1) if nodes else 0].argmax())
            keep = [0] + [x + 1 for x in nodes]
            self._keep(start, keep)
            hidden = hid[0, keep[-1]] if hid is not None else None
            new = [tokens[x] for x in nodes] + [last]
            ctx.extend(new)
            stats["rounds"] += 1
            stats["emitted"] += len(new)
            stats["accepted"] += len(nodes)
            stats["drafted"] += n
            if on_round is not None:
                on_round(self, list(ctx))
