"""A continuous-batching engine over the reference transformer with a paged KV cache, a prefix
cache, chunked prefill and prefill/decode disaggregation (claims PA-6, PA-7, PA-8, PA-9; lecture
001 §4.1, §4.4, §4.5; Yu et al. 2022 (Orca), Kwon et al. 2023 (vLLM), Zheng et al.
2024 (SGLang's prefix sharing), Agrawal et al. 2024 (Sarathi-Serve), Patel et al. 2024
(Splitwise), Zhong et al. 2024 (DistServe)).

Every :meth:`PagedEngine.step`:

1. each running request gets a slot for its next token; when no block is free, blocks held only
   by the prefix cache are evicted, then the most recently admitted request is preempted (its
   blocks freed; it goes back to the head of the queue and is recomputed later: prompt and the
   tokens it has generated are prefilled again, its generator untouched);
2. waiting requests are admitted first-come first-served while their blocks fit and the batch
   has room; a new request reuses the cached blocks of its prompt's longest cached prefix of
   full blocks and computes only the rest;
3. one forward over a single token matrix: the prefill tokens of the new requests and the last
   token of every decoding one, (N, d_model). Embedding, norms, projections, RoPE and the MLP
   run on the whole matrix at once (selective batching: only attention is per sequence); it is
   the model's own forward with a :class:`PagedCacheAttention`: each layer writes the N new
   keys and values into their slots (slot mapping) and calls the ``paged_attention`` contract
   with one query per token, the token's sequence's block table and ``seq_lens`` = its
   position + 1 (so prefill is causal);
4. each request that computed its last token samples the next one from its own logits with its
   own generator (greedy at temperature 0); a request with all its tokens leaves and its blocks
   are freed.

Prefix cache: full blocks are keyed by a SHA-256 chained over the parent block's key, the
block's token ids and a model key (the model's identity, dtype and device), so the key covers
everything the block's K/V depends on; equal tokens after different prefixes never share a
block. The cache holds one reference per block it keeps; a block only the cache holds is
evicted when memory is short.

Chunked prefill (``max_num_batched_tokens``, the token budget of a step; PA-8): blocks for a
request's whole prompt are booked at admission, but a step computes at most the budget's tokens:
first one token of every decoding request, then the prompts in admission order, each as much of
its remaining tokens as the budget still allows (a chunk; a long prompt is split over several
steps, each chunk batched with the other requests' decode tokens). A request samples only in the
step that computes its last token. Without a budget every request computes all its tokens at once.

Disaggregation (PA-9): ``optimized/paged_attention/engine_disagg.py`` (the engine surface a ``kv_transfer``
uses, :class:`DisaggregatedEngine`).

``attention``: any ``paged_attention`` implementation (default: the reference;
``inference_conformance.optimized.paged_attention.paged_attention`` for the Triton kernel), called with one query per
token; ``prefill``: a ``paged_prefill`` implementation (the contract's mixed batch), which, when
given, replaces it: one call per layer over the step's chunks and decode tokens;
``write``: the cache write (default: PyTorch ``index_copy_``;
``inference_conformance.optimized.paged_attention.write_kv_cache`` for Triton).
"""
from __future__ import annotations

import hashlib
import math
from collections import Counter, deque

import torch

from inference_conformance.optimized.paged_attention.engine_attention import PagedCacheAttention, torch_write
from inference_conformance.optimized.paged_attention.engine_disagg import TransferMixin
from inference_conformance.optimized.paged_attention.engine_state import EngineRequest
from inference_conformance.reference.paged_attention import OutOfBlocks, PagedKVCache
from inference_conformance.reference.transformer import Transformer, sample_next


class PagedEngine(TransferMixin):
    """Continuous batching over ``model`` with a paged cache of ``num_blocks`` blocks of
    ``block_size`` tokens (shared by all layers), at most ``max_batch`` running requests.

    ``max_num_batched_tokens``: the token budget of a step (chunked prefill; None: no budget, every
    prompt computed whole in one step). ``prefill``: a ``paged_prefill`` implementation for the
    step's mixed batch (None: ``attention`` with one query per token). ``keep_logits``: keep, per
    request, the logits (V,) each of its tokens was sampled from (``self.logits``). Per step the
    engine keeps the tokens it computed (``step_tokens``) and which requests emitted a token
    (``emitted``).

    Errors: ValueError for bad sizes, a duplicate request id, an empty prompt, ids outside the
    vocabulary, a request longer than the model's max_seq_len or than the whole cache.
    """

    def __init__(self, model: Transformer, *, num_blocks: int, block_size: int, max_batch: int = 64,
                 attention=None, write=None, prefix_cache: bool = False, max_num_batched_tokens: int | None = None,
                 prefill=None, keep_logits: bool = False):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_num_batched_tokens is not None and (isinstance(max_num_batched_tokens, bool)
                                                   or not isinstance(max_num_batched_tokens, int)
                                                   or max_num_batched_tokens < 1):
            raise ValueError(f"max_num_batched_tokens must be an int >= 1 or None, got {max_num_batched_tokens!r}")
        self.token_budget = max_num_batched_tokens
        self.prefill = prefill
        self.logits: dict | None = {} if keep_logits else None
        self.step_tokens: list[int] = []
        self.emitted: list[list] = []
        cfg = model.cfg
        self.model, self.cfg, self.block_size, self.max_batch = model, cfg, block_size, max_batch
        self.book = PagedKVCache(num_blocks, block_size)
        w = model.embed.weight
        shape = (num_blocks, block_size, cfg.n_kv_heads, cfg.hd)
        self.k = [torch.full(shape, float("nan"), dtype=w.dtype, device=w.device) for _ in range(cfg.n_layers)]
        self.v = [torch.full(shape, float("nan"), dtype=w.dtype, device=w.device) for _ in range(cfg.n_layers)]
        if attention is None:
            from inference_conformance.reference.paged_attention import paged_attention as attention
        self.attention = attention
        self.write = write or torch_write
        self.prefix: dict[str, int] | None = {} if prefix_cache else None
        self.model_key = f"{id(model)}:{w.dtype}:{w.device}"
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.finished: dict = {}
        self._ids: set = set()
        self.stats = Counter()
        #: per request id: tokens computed, prompt tokens reused from the prefix cache, preemptions
        self.computed_by, self.reused_by, self.preempted_by = Counter(), Counter(), Counter()

    # ------------------------------------------------------------------ requests
    def add_request(self, rid, prompt, max_new_tokens: int, temperature: float = 0.0,
                    generator: torch.Generator | None = None) -> None:
        """Queue a request: ``prompt`` a list of token ids, ``max_new_tokens`` >= 1 tokens to generate."""
        prompt = [int(t) for t in prompt]
        if rid in self._ids:
            raise ValueError(f"request id {rid!r} already used")
        if not prompt:
            raise ValueError("prompt must hold at least one token")
        if min(prompt) < 0 or max(prompt) >= self.cfg.vocab_size:
            raise ValueError(f"prompt holds ids outside [0, {self.cfg.vocab_size})")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        total = len(prompt) + max_new_tokens
        if total > self.cfg.max_seq_len:
            raise ValueError(f"prompt + max_new_tokens = {total} > the model's max_seq_len {self.cfg.max_seq_len}")
        if -(-total // self.block_size) > self.book.allocator.num_blocks:
            raise ValueError(f"request {rid!r} needs more than all {self.book.allocator.num_blocks} blocks")
        self._ids.add(rid)
        self.waiting.append(EngineRequest(rid, prompt, max_new_tokens, float(temperature), generator))

    def fork(self, parent, child, generator: torch.Generator | None = None, temperature: float | None = None) -> None:
        """Parallel sampling: ``child`` continues ``parent`` (a running request that has computed
        its prompt) from the same tokens, sharing every block of the parent (reference counts;
        a write to the shared, partly filled last block is copied first), with its own
        ``generator`` (and ``temperature``, default the parent's) and the parent's remaining
        budget of new tokens. Raises ValueError for an unknown or waiting parent or a used id."""
        if child in self._ids:
            raise ValueError(f"request id {child!r} already used")
        p = next((r for r in self.running if r.rid == parent), None)
        if p is None:
            raise ValueError(f"request {parent!r} is not running (fork needs its prompt computed)")
        self.book.fork(parent, child)
        self._ids.add(child)
        t = p.temperature if temperature is None else float(temperature)
        self.running.append(EngineRequest(child, list(p.prompt), p.max_new, t, generator, list(p.out), p.computed,
                                     list(p.keys)))

    def blocks_in_use(self) -> int:
        """Physical blocks held (by requests and the prefix cache)."""
        return self.book.allocator.num_used

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def run(self) -> dict:
        """Step until every queued request has finished; returns rid -> generated token ids."""
        while self.has_work():
            self.step()
        return dict(self.finished)

    # ------------------------------------------------------------------ memory
    def _evict_cached(self, need: int) -> None:
        """Free blocks that only the prefix cache holds until ``need`` blocks are free."""
        if self.prefix is None:
            return
        a = self.book.allocator
        for key in list(self.prefix):
            if a.num_free >= need:
                return
            blk = self.prefix[key]
            if a.refcount[blk] == 1:
                del self.prefix[key]
                a.free(blk)

    def _block_key(self, parent: str, tokens) -> str:
        """Prefix-cache key of a full block: chained over the parent's key, the block's token
        ids and the model."""
        h = hashlib.sha256()
        h.update(parent.encode())
        h.update(self.model_key.encode())
        h.update(",".join(map(str, tokens)).encode())
        return h.hexdigest()

    def _release(self, r: EngineRequest) -> None:
        self.book.free(r.rid)
        r.keys = []

    def _grow_running(self) -> None:
        i = 0
        while i < len(self.running):
            r = self.running[i]
            if self.book.length(r.rid) == len(r.tokens):     # mid-prefill: its blocks are booked
                i += 1
                continue
            try:
                self._evict_cached(1)
                self.book.append_tokens(r.rid, 1)
                i += 1
            except OutOfBlocks:
                victim = self.running.pop()
                self._release(victim)
                victim.computed = 0
                self.waiting.appendleft(victim)
                self.stats["preemptions"] += 1
                self.preempted_by[victim.rid] += 1

    def _admit(self) -> list[EngineRequest]:
        new = []
        while self.waiting and len(self.running) < self.max_batch:
            r = self.waiting[0]
            toks = r.tokens
            shared, parent = [], ""
            if self.prefix is not None:
                for j in range((len(toks) - 1) // self.block_size):     # keep >= 1 token to compute
                    key = self._block_key(parent, toks[j * self.block_size:(j + 1) * self.block_size])
                    if key not in self.prefix:
                        break
                    shared.append((key, self.prefix[key]))
                    parent = key
            need = -(-len(toks) // self.block_size) - len(shared)
            for _, blk in shared:                      # hold them before evicting anything
                self.book.allocator.share(blk)
            self._evict_cached(need)
            if self.book.allocator.num_free < need:
                for _, blk in shared:
                    self.book.allocator.free(blk)
                if not self.running and not new:
                    raise RuntimeError(f"request {r.rid!r} does not fit in an empty cache")
                break
            self.waiting.popleft()
            self.book.new_sequence(r.rid)
            self.book.tables[r.rid] = [blk for _, blk in shared]
            self.book.lengths[r.rid] = len(shared) * self.block_size
            r.computed = len(shared) * self.block_size
            r.keys = [key for key, _ in shared]
            self.stats["reused_tokens"] += r.computed
            self.reused_by[r.rid] += r.computed
            self.book.append_tokens(r.rid, len(toks) - r.computed)
            self.running.append(r)
            new.append(r)
        return new

    # ------------------------------------------------------------------ the step
    def _query_lens(self, positions: torch.Tensor) -> torch.Tensor:
        """Keys each token's query sees: every token up to and including its own position."""
        return (positions + 1).to(torch.int32)

    def _schedule(self) -> list[tuple[EngineRequest, int]]:
        """(request, tokens it computes this step) of the running requests, within the token
        budget: decode tokens first, then the prompts' chunks in admission order; in running
        order. Requests left out wait for a later step."""
        left = math.inf if self.token_budget is None else self.token_budget
        take: dict[int, int] = {}
        pending = [(i, len(r.tokens) - r.computed) for i, r in enumerate(self.running)]
        for i, n in [p for p in pending if p[1] == 1] + [p for p in pending if p[1] > 1]:
            m = int(min(n, left))
            if m > 0:
                take[i] = m
                left -= m
        return [(r, take[i]) for i, r in enumerate(self.running) if i in take]

    @torch.no_grad()
    def step(self) -> dict:
        """One engine step; returns rid -> the token each request generated in it."""
        self._grow_running()
        self._admit()
        if not self.running:
            return {}
        self.stats["steps"] += 1
        copies = self.book.copy_log
        for src, dst in copies:                       # copy-on-write requested by the bookkeeping
            for l in range(self.cfg.n_layers):
                self.k[l][dst] = self.k[l][src]
                self.v[l][dst] = self.v[l][src]
        copies.clear()
        dev = self.model.embed.weight.device
        plan = self._schedule()
        toks, pos, rows, last, loc = [], [], [], [], [0]
        for i, (r, n) in enumerate(plan):
            seq = r.tokens
            self.stats["computed_tokens"] += n
            self.computed_by[r.rid] += n
            toks += seq[r.computed:r.computed + n]
            pos += range(r.computed, r.computed + n)
            rows += [i] * n
            last.append(len(toks) - 1)
            loc.append(len(toks))
        self.step_tokens.append(len(toks))
        ids = [r.rid for r, _ in plan]
        table = self.book.block_table(ids, fill=-1, device=dev)                   # (R, max_blocks)
        rows_t = torch.tensor(rows, device=dev)
        positions = torch.tensor(pos, device=dev)
        slots = torch.tensor([self.book.slot(plan[i][0].rid, p) for i, p in zip(rows, pos)], device=dev)
        seq_lens = torch.tensor([r.computed + n for r, n in plan], dtype=torch.int32, device=dev)
        logits = self._forward(torch.tensor(toks, device=dev), positions, table, rows_t, slots, last, seq_lens,
                               torch.tensor(loc, dtype=torch.int32, device=dev))
        produced = {}
        done = set()
        for i, (r, n) in enumerate(plan):
            r.computed += n
            self._register_blocks(r)
            if r.computed < len(r.tokens):                 # a chunk short of the prompt's end: no token
                continue
            nxt = int(sample_next(logits[i:i + 1], r.temperature, r.generator)[0])
            if self.logits is not None:
                self.logits.setdefault(r.rid, []).append(logits[i].detach().clone())
            r.out.append(nxt)
            produced[r.rid] = nxt
            if len(r.out) == r.max_new:
                self.finished[r.rid] = list(r.out)
                self._release(r)
                done.add(id(r))
        self.running = [r for r in self.running if id(r) not in done]
        self.emitted.append(list(produced))
        return produced

    def _register_blocks(self, r: EngineRequest) -> None:
        if self.prefix is None:
            return
        table = self.book.tables[r.rid]
        toks = r.tokens
        while len(r.keys) < r.computed // self.block_size:
            j = len(r.keys)
            key = self._block_key(r.keys[-1] if r.keys else "", toks[j * self.block_size:(j + 1) * self.block_size])
            if key not in self.prefix:
                self.prefix[key] = table[j]
                self.book.allocator.share(table[j])
            r.keys.append(key)

    def _backend(self, **kw) -> PagedCacheAttention:
        """The attention backend of one step's forward (a known-bad engine swaps it)."""
        return PagedCacheAttention(**kw)

    def _forward(self, tokens, positions, table, rows, slots, last, seq_lens, query_start_loc) -> torch.Tensor:
        """One forward over the token matrix (N tokens of R sequences, sequence i's at rows
        query_start_loc[i] ..); logits (R, V) of each sequence's last computed token."""
        attention = self._backend(k_caches=self.k, v_caches=self.v, write=self.write, attention=self.attention,
                                  tables=table[rows], slots=slots, seq_lens=self._query_lens(positions),
                                  scale=1.0 / math.sqrt(self.cfg.hd), prefill=self.prefill, seq_tables=table,
                                  seq_seq_lens=seq_lens, query_start_loc=query_start_loc)
        return self.model(tokens[None], positions[None], attention, rows=torch.tensor(last, device=tokens.device))

