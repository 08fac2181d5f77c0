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
from inference_conformance.optimized.kv_cache.append import INDEX_DTYPE
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

