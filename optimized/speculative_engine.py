"""A speculative decoding engine with KV caches and rollback (lecture 002 §2; Leviathan et al.
2023; claims SD-1, SD-7, SD-8).

:class:`SpeculativeEngine` runs a target and a draft :class:`inference_conformance.reference.transformer.Transformer`,
each over its own static KV cache (:class:`inference_conformance.optimized.kv_cache.KVCacheEngine`'s cache and layers,
extended here by :class:`CachedModel` with a multi-token ``extend`` and a ``rollback``; each
forward is the model's own, over a :class:`inference_conformance.optimized.kv_cache.StaticCacheAttention`). Every
row keeps its committed tokens; both caches hold all of them but the last (the *pending* token,
whose keys and values the next forward writes). One round:

1. the draft catches up on the committed tokens it has not cached (one, or two after a round
   that accepted every draft token), then proposes γ tokens one decode step at a time, each
   sampled from its processed distribution q (or its argmax when greedy);
2. the target scores the pending token and the γ draft tokens in one forward (γ + 1 logits);
3. ``verify`` keeps a prefix (float64 accept/reject of :mod:`inference_conformance.optimized.speculative`, or the
   greedy rule) and emits one more token;
4. both caches are rolled back to the accepted prefix: the target to the committed tokens but
   the new pending one, the draft to at most that: the caches then equal, length and visible
   content, those of decoding only the accepted tokens (SD-8). With ``nan_fill=True`` (a
   checking mode, what SD-8's law runs) the rolled-back slots are also refilled with NaN, so a
   stale slot that were ever read would poison the output; by default they are left as they are
   (every read masks slots past a row's length), which saves a write over the caches per round.

Per forward the host does no device round trip: lengths live on the host too, the RoPE tables
are computed once for every layer, the token ids the engine produced itself are not re-checked,
and the K/V masking copy is skipped when every row's chunk ends at the same slot (B = 1 always).

Temperature, top-k and top-p (:func:`inference_conformance.reference.speculative.process_logits`) are applied to the
target's and the draft's logits alike before verification; temperature 0 is greedy. The draft
tokens are sampled from exactly the q passed to ``verify`` (the same float32 tensor).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from inference_conformance.optimized import speculative as batched
from inference_conformance.optimized.kv_cache import KVCacheEngine, StaticCacheAttention
from inference_conformance.optimized.kv_append import INDEX_DTYPE
from inference_conformance.reference.speculative import best_gamma, process_logits
from inference_conformance.reference.transformer import Transformer


class CachedModel(KVCacheEngine):
    """A :class:`KVCacheEngine` whose sequences grow by several tokens per forward and shrink
    back: :meth:`start` (empty sequences), :meth:`extend` (right-padded chunks of per-row
    lengths, causal within the chunk), :meth:`rollback` (forget the slots past new lengths).
    ``nan_fill``: rollback refills the forgotten slots with NaN (checking mode)."""

    nan_fill = True

    def start(self, batch: int) -> None:
        """Forget every sequence and start ``batch`` empty ones."""
        if not 1 <= batch <= self.cache.max_batch:
            raise ValueError(f"batch must be in [1, max_batch={self.cache.max_batch}], got {batch}")
        self.cache.reset()
        self.batch = batch

    @torch.no_grad()
    def extend(self, tokens: torch.Tensor, counts: torch.Tensor, *, check_ids: bool = True) -> torch.Tensor:
        """Append ``tokens[b, :counts[b]]`` to sequence b in one forward; returns logits
        (B, T, V), logits[b, t] after sequence b's tokens and tokens[b, :t+1] (t < counts[b];
        the rest unspecified). tokens (B, T) int64; counts (B,) int64 on the CPU, 0..T.
        ``check_ids=False`` skips the range check of the ids (a device round trip) for ids the
        caller produced itself (sampled from the logits or already checked)."""
        self._check_ids(tokens, "tokens", 2)
        B, T = tokens.shape
        if B != self.batch:
            raise ValueError(f"tokens has batch {B}, the engine holds {self.batch} sequences")
        host_counts = counts.to("cpu", INDEX_DTYPE)
        host_len = self.cache.host_lengths[:B].clone()
        if int((host_len + host_counts).max()) > self.cache.max_seq_len:
            raise ValueError(f"extend would grow a sequence past max_seq_len={self.cache.max_seq_len}")
        if check_ids:
            self._check_vocab(tokens, "tokens")
        cache, dev = self.cache, self.device
        counts_d = host_counts.to(dev)
        lengths = cache.lengths[:B]
        positions = lengths[:, None] + torch.arange(T, device=dev)                  # (B, T)
        ends = host_len + host_counts
        span = int(ends.max())
        # every slot below span written (all rows end there): nothing to zero before attention
        ragged = bool((ends < span).any())
        slot = torch.arange(span, device=dev)
        written = slot[None, :] < (lengths + counts_d)[:, None]                      # (B, span)
        attention = StaticCacheAttention(
            cache, lengths, counts_d, host_len, host_counts,
            mask=(slot[None, None, :] <= positions[:, :, None])[:, None],           # (B, 1, T, span)
            span=span, keep=written[:, None, :, None] if ragged else None)         # (B, 1, span, 1)
        logits = self.model(tokens, positions, attention)                           # (B, T, V)
        cache.advance(counts_d, host_counts)
        return logits

    def rollback(self, new_lengths: torch.Tensor) -> None:
        """Shrink sequence b to ``new_lengths[b]`` tokens (CPU int64, <= its length): the
        slots past it are forgotten (refilled with NaN, as if never written, when ``nan_fill``)."""
        B = self.batch
        new = new_lengths.to("cpu", INDEX_DTYPE)
        old = self.cache.host_lengths[:B]
        if bool((new > old).any()) or bool((new < 0).any()):
            raise ValueError(f"rollback to {new.tolist()} from lengths {old.tolist()}")
        if self.nan_fill:
            top = int(old.max()) if B else 0
            dead = torch.arange(top)[None, :] >= new[:, None]                       # (B, top) CPU
            dead = dead.to(self.device)[None, :, None, :, None]
            for t in (self.cache.k, self.cache.v):
                t[:, :B, :, :top].masked_fill_(dead, float("nan"))
        self.cache.lengths[:B] = new.to(self.device)
        self.cache.host_lengths[:B] = new


class SpeculativeEngine:
    """Speculative decoding of a batch of prompts with a target and a draft model.

    ``gamma`` draft tokens per round (>= 1); ``temperature`` (0: greedy), ``top_k`` (0: none)
    and ``top_p`` (1: none) apply to both models; ``verify``: a ``speculative`` contract
    function (default the batched verifier of :mod:`inference_conformance.optimized.speculative`).
    ``adaptive``: choose each round's γ in 1..``gamma`` from the recent acceptance rate (an
    exponential average, weight ``1/4`` per round, of accepted / (accepted + rejections) over the
    batch) as the γ that maximises the SD-4 speedup at cost ratio ``draft_cost`` (default: the
    draft's parameters / the target's); ``last_gamma`` is the γ of the last round.
    ``max_seq_len`` must hold prompt + max_new_tokens + 2γ + 1 tokens (a row that has finished
    keeps scoring, and rolling back, γ + 1 tokens past its end while the others finish).
    ``nan_fill``: refill rolled-back cache slots with NaN (a checking mode for SD-8's law; off,
    they are only masked, which is all the output depends on).
    """

    def __init__(self, target: Transformer, draft: Transformer, *, gamma: int, max_batch: int,
                 max_seq_len: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 verify=None, append: str = "torch", adaptive: bool = False, draft_cost: float | None = None,
                 nan_fill: bool = False):
        if not isinstance(gamma, int) or gamma < 1:
            raise ValueError(f"gamma must be an int >= 1, got {gamma!r}")
        if target.cfg.vocab_size != draft.cfg.vocab_size:
            raise ValueError("the target and the draft must share one vocabulary")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if temperature > 0:
            process_logits(torch.zeros(2), temperature, top_k, top_p)             # validates the settings
        self.target = CachedModel(target, max_batch, max_seq_len, append)
        self.draft = CachedModel(draft, max_batch, max_seq_len, append)
        self.target.nan_fill = self.draft.nan_fill = bool(nan_fill)
        self.gamma, self.temperature, self.top_k, self.top_p = gamma, temperature, top_k, top_p
        self.adaptive = adaptive
        if draft_cost is None:
            draft_cost = sum(p.numel() for p in draft.parameters()) / sum(p.numel() for p in target.parameters())
        self.draft_cost = float(draft_cost)
        self.last_gamma = gamma
        self.verify = verify or (lambda *a, generator: batched.verify(*a, generator=generator, check=False))

    # ------------------------------------------------------------------ hooks (known-bad engines override)
    def _probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The processed distribution of (float32) logits: what q and p are."""
        return process_logits(logits.float(), self.temperature, self.top_k, self.top_p)

    def _draft_sample(self, logits: torch.Tensor, q: torch.Tensor, generator) -> torch.Tensor:
        """A draft token per row, sampled from exactly ``q`` (the distribution given to verify)."""
        return torch.multinomial(q, 1, generator=generator)[:, 0]

    def _q_for_verify(self, logits: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """The draft distribution passed to ``verify``: the very q the token was sampled from."""
        return q

    def _rollback(self, model: CachedModel, new_lengths: torch.Tensor) -> None:
        model.rollback(new_lengths)

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, max_new_tokens: int, *, generator: torch.Generator | None = None,
                 on_round=None):
        """Generate ``max_new_tokens`` tokens after ``prompt`` (B, S) int64 (one length for all
        rows). ``on_round(engine, committed, lengths)``, if given, is called after every round
        with the committed tokens (B, S + max_new_tokens + 2γ + 1) and their lengths (B,) CPU.

        Returns (tokens (B, S + max_new_tokens), stats: rounds, accepted, drafted, emitted and
        rejections (rounds that stopped before γ) per row while generating, summed;
        :func:`inference_conformance.reference.speculative.measured_alpha` reads them)."""
        self.target._check_ids(prompt, "prompt", 2)
        self.target._check_vocab(prompt, "prompt")                                   # the only ids checked
        greedy = self.temperature == 0
        B, S = prompt.shape
        g_max = g = self.gamma
        alpha_avg = None
        dev = self.target.device
        total = S + max_new_tokens + 2 * g_max + 1
        if total > min(self.target.cache.max_seq_len, self.draft.cache.max_seq_len):
            raise ValueError(f"prompt + max_new_tokens + 2 gamma + 1 = {total} exceeds the caches' max_seq_len")
        buf = torch.zeros(B, total, dtype=torch.int64, device=dev)
        buf[:, :S] = prompt
        L = torch.full((B,), S, dtype=torch.int64)                                   # committed, CPU
        Ld = torch.full((B,), S - 1, dtype=torch.int64)                              # draft-cached, CPU
        for m in (self.target, self.draft):
            m.start(B)
            if S > 1:
                m.extend(prompt[:, :S - 1], torch.full((B,), S - 1, dtype=torch.int64))
        rows = torch.arange(B, device=dev)
        ones = torch.ones(B, dtype=torch.int64)
        stats = {"rounds": 0, "accepted": 0, "drafted": 0, "emitted": 0, "rejections": 0}
        while bool((L < S + max_new_tokens).any()):
            active = L < S + max_new_tokens                                          # (B,) CPU
            if self.adaptive and alpha_avg is not None:
                g = best_gamma(min(alpha_avg, 1.0), self.draft_cost, g_max)
            self.last_gamma = g
            # 1. the draft catches up (1 or 2 committed tokens), then drafts γ tokens
            lag = L - Ld                                                              # 1 or 2
            T = int(lag.max())
            idx = (Ld[:, None] + torch.arange(T)).clamp(max=total - 1).to(dev)
            logits = self.draft.extend(buf.gather(1, idx), lag, check_ids=False)
            logits = logits[rows, (lag - 1).to(dev)]                                  # (B, V)
            xs, qs = [], []
            for i in range(g):
                if greedy:
                    x = logits.argmax(-1)
                else:
                    q = self._probs(logits)
                    x = self._draft_sample(logits, q, generator)
                    qs.append(self._q_for_verify(logits, q))
                xs.append(x)
                if i < g - 1:
                    logits = self.draft.extend(x[:, None], ones, check_ids=False)[:, 0]
            draft_tokens = torch.stack(xs, 1)                                         # (B, γ)
            # 2. the target scores the pending token and the γ draft tokens in one forward
            pending = buf[rows, (L - 1).to(dev)]
            chunk = torch.cat([pending[:, None], draft_tokens], 1)                    # (B, γ+1)
            t_logits = self.target.extend(chunk, torch.full((B,), g + 1, dtype=torch.int64), check_ids=False)
            # 3. verify
            if greedy:
                best = t_logits.argmax(-1)                                            # (B, γ+1)
                ok = (draft_tokens == best[:, :g]).to(torch.int64).cumprod(-1)
                n = ok.sum(-1)
                last = best.gather(1, n[:, None])[:, 0]
            else:
                p = self._probs(t_logits)                                             # (B, γ+1, V)
                tokens, n = self.verify(draft_tokens, torch.stack(qs, 1), p, generator=generator)
                last = tokens.gather(1, n[:, None])[:, 0]
            n_host = n.cpu()
            # commit the accepted tokens and the last one (rows still generating)
            j = torch.arange(g + 1, device=dev)
            emitted = torch.where(j < n[:, None], F.pad(draft_tokens, (0, 1)), last[:, None])   # (B, γ+1)
            keep = (j <= n[:, None]) & active.to(dev)[:, None]
            cols = L.to(dev)[:, None] + j
            buf[rows[:, None].expand_as(cols)[keep], cols[keep]] = emitted[keep]
            step = torch.where(active, n_host + 1, torch.zeros_like(n_host))
            new_L = L + step
            # 4. roll both caches back to the accepted prefix
            self._rollback(self.target, new_L - 1)
            Ld = torch.minimum(new_L - 1, L + g - 1)                                  # the draft cached L + γ - 1
            self._rollback(self.draft, Ld)
            stats["rounds"] += int(active.sum())
            stats["accepted"] += int((n_host * active).sum())
            stats["drafted"] += g * int(active.sum())
            stats["emitted"] += int(step.sum())
            rejected = int(((n_host < g) & active).sum())
            stats["rejections"] += rejected
            accepted = int((n_host * active).sum())
            if accepted + rejected:
                rate = accepted / (accepted + rejected)
                alpha_avg = rate if alpha_avg is None else 0.75 * alpha_avg + 0.25 * rate
            L = new_L
            if on_round is not None:
                on_round(self, buf, L.clone())
        return buf[:, :S + max_new_tokens], stats


# ======================================================================== token trees (SD-10, SD-12)
class TreeCacheAttention:
    """The attention backend of one tree forward over a :class:`CachedModel`'s cache: each layer
    appends the forward's n_nodes keys and values at slots [L_b, L_b + n_nodes) (L: the cached
    lengths) and attends by tree attention, ``attend_fn(q, k_cache, v_cache, parents,
    prefix_lens)`` (:func:`inference_conformance.optimized.tree_attention.tree_attention`, the Triton kernel, or its
    reference-core twin ``tree_attention_torch``)."""

    def __init__(self, cache, parents: torch.Tensor, lengths: torch.Tensor, host_lengths: torch.Tensor, attend_fn):
        self.cache, self.parents, self.attend_fn = cache, parents, attend_fn
        self.lengths, self.host_lengths = lengths, host_lengths

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        B, _, n, _ = k.shape
        host_count = torch.full((B,), n, dtype=INDEX_DTYPE)
        self.cache.append(layer, k, v, self.lengths, host_count.to(k.device), self.host_lengths, host_count)
        return self.attend_fn(q, self.cache.k[layer, :B], self.cache.v[layer, :B], self.parents, self.lengths)


def _tree_attend(name: str):
    from inference_conformance.optimized import tree_attention

    return {"triton": tree_attention.tree_attention, "torch": tree_attention.tree_attention_torch}[name]


class TreeCachedModel(CachedModel):
    """A :class:`CachedModel` that also scores token trees in one forward and keeps one branch.

    :meth:`tree_forward` writes every node's keys and values after the cached prefix and scores
    the nodes with the tree mask and depth-based positions (SD-10); :meth:`keep_path` moves the
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
        positions = lengths[:, None] - 1 + depth[None]                                 # (B, n)
        attention = TreeCacheAttention(self.cache, parents.to(dev), lengths, host_len, _tree_attend(self.attention))
        logits = self.model(tokens, positions, attention)
        count = torch.full((B,), n, dtype=INDEX_DTYPE)
        self.cache.advance(count.to(dev), count)
        return logits

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

    ``drafter.propose(context, hidden)`` returns (parents, tokens): a token tree to try after the
    committed tokens ``context`` (a list of ids), given the target's final hidden state after the
    last committed token where the last round computed it (else None); an empty tree is a plain
    decode step. Each round the target scores the pending token and the tree in one forward (the
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
        hidden = None
        stats = {"rounds": 0, "emitted": 0, "accepted": 0, "drafted": 0}
        hook = m.model.norm.register_forward_hook(self._keep_hidden)   # the final hidden states
        try:
            self._rounds(ctx, S, max_new_tokens, stats, on_round)
        finally:
            hook.remove()
        return torch.tensor([ctx[:S + max_new_tokens]], dtype=torch.int64, device=prompt.device), stats

    def _rounds(self, ctx, S, max_new_tokens, stats, on_round):
        from inference_conformance.reference.speculative_tree import verify_tree_greedy

        m, dev, hidden = self.target, self.target.device, None
        while len(ctx) < S + max_new_tokens:
            parents, tokens = self.drafter.propose(ctx, hidden)
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


# ------------------------------------------------------------------------------ drafters
class ChainDrafter:
    """γ greedy tokens of a draft model (recomputed over the context each step: the draft is small)."""

    def __init__(self, draft: Transformer, gamma: int):
        self.draft, self.gamma = draft, gamma

    @torch.no_grad()
    def propose(self, context, hidden):
        seq = list(context)
        for _ in range(self.gamma):
            seq.append(int(self.draft(torch.tensor([seq[-self.draft.cfg.max_seq_len:]]))[0, -1].argmax()))
        new = seq[len(context):]
        return list(range(-1, len(new) - 1)), new


class TopKTreeDrafter:
    """A token tree from a draft model: the ``widths[d]`` most probable tokens as the children of
    every node of depth d (SpecInfer's expansion; width 1 is a chain)."""

    def __init__(self, draft: Transformer, widths=(2, 2, 1)):
        self.draft, self.widths = draft, tuple(widths)

    @torch.no_grad()
    def propose(self, context, hidden):
        parents, tokens, paths = [], [], {-1: []}
        frontier = [-1]
        for w in self.widths:
            nxt = []
            for u in frontier:
                seq = list(context) + paths[u]
                top = self.draft(torch.tensor([seq]))[0, -1].topk(w).indices.tolist()
                for x in top:
                    parents.append(u)
                    tokens.append(int(x))
                    paths[len(tokens) - 1] = paths[u] + [int(x)]
                    nxt.append(len(tokens) - 1)
            frontier = nxt
        return parents, tokens


class SelfSpeculativeDrafter(ChainDrafter):
    """Self-speculation (Draft & Verify, Zhang et al. 2024; LayerSkip): the target with its blocks
    ``skip`` left out (weights shared, nothing copied) drafts γ greedy tokens."""

    def __init__(self, target: Transformer, skip, gamma: int):
        import copy

        import torch.nn as nn

        shallow = copy.copy(target)
        shallow._modules = dict(target._modules)
        shallow._modules["blocks"] = nn.ModuleList(b for i, b in enumerate(target.blocks) if i not in set(skip))
        super().__init__(shallow, gamma)


class PromptLookupDrafter:
    """Prompt lookup (Saxena 2023; lookahead decoding's n-gram pool in its simplest form): find the
    latest earlier occurrence of the context's last ``ngram`` tokens (trying ``ngram`` down to 1)
    and propose the ``gamma`` tokens that followed it; nothing when there is none."""

    def __init__(self, ngram: int = 3, gamma: int = 5):
        self.ngram, self.gamma = ngram, gamma

    def propose(self, context, hidden):
        ctx = list(context)
        for n in range(min(self.ngram, len(ctx) - 1), 0, -1):
            key = ctx[-n:]
            for s in range(len(ctx) - n - 1, -1, -1):
                if ctx[s:s + n] == key:
                    new = ctx[s + n:s + n + self.gamma]
                    return list(range(-1, len(new) - 1)), new
        return [], []


class HeadsDrafter:
    """Medusa-style heads on the target (Cai et al. 2024): from the target's final hidden state
    after the last committed token, the base head's argmax is that token's successor (the pending
    token the round scores anyway) and head j's argmax the token j places after it; proposes that
    chain of len(heads) tokens (nothing in a round without a hidden state, the first)."""

    def __init__(self, target: Transformer, heads):
        self.target, self.heads = target, heads

    @torch.no_grad()
    def propose(self, context, hidden):
        if hidden is None:
            return [], []
        new = [int(x) for x in self.heads(hidden[None].to(self.heads.dtype))[:, 0].argmax(-1).tolist()]
        return list(range(-1, len(new) - 1)), new
