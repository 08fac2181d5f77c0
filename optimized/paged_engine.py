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

Disaggregation (PA-9): :meth:`PagedEngine.send` packs a request that has computed its prompt
(and sampled its first token) into a :class:`KVTransfer`, its blocks by id in logical order with
their K/V, and frees them; :meth:`PagedEngine.receive` on another engine (its own pool, its own
block size) books blocks for the tokens and writes them into its own block ids through its slot
mapping. :class:`DisaggregatedEngine` runs a prefill engine and a decode engine so.

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
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from inference_conformance.reference.paged_attention import OutOfBlocks, PagedKVCache
from inference_conformance.reference.transformer import Transformer, sample_next


def _torch_write(k_cache, v_cache, k, v, slot_mapping) -> None:
    nb, bs, hkv, d = k_cache.shape
    idx = slot_mapping.to(torch.int64)
    k_cache.view(nb * bs, hkv, d).index_copy_(0, idx, k)
    v_cache.view(nb * bs, hkv, d).index_copy_(0, idx, v)


@dataclass
class PagedCacheAttention:
    """The attention backend (:class:`inference_conformance.reference.transformer.AttentionCache`) of one step's
    forward over a paged cache: the forward's N tokens, of several sequences, are one row
    (B = 1, T = N) of the token matrix.

    Each layer writes token i's k, v into slot ``slots[i]`` of its layer's caches
    (``write(k_caches[layer], v_caches[layer], k (N, Hkv, D), v, slots)``; caches
    (num_blocks, block_size, Hkv, D)), then calls ``attention`` (a ``paged_attention``
    implementation) with one query per token, the block table of the token's sequence
    (``tables``: (N, max_blocks) int32) and ``seq_lens`` (N,) int32 = the keys it sees.
    """

    k_caches: list
    v_caches: list
    write: Callable
    attention: Callable
    tables: torch.Tensor
    slots: torch.Tensor
    seq_lens: torch.Tensor
    scale: float
    #: the mixed-batch path: a ``paged_prefill`` implementation and its per-sequence block table
    #: (R, max_blocks), seq_lens (R,) and query_start_loc (R + 1,); None: one query per token
    prefill: Callable | None = None
    seq_tables: torch.Tensor | None = None
    seq_seq_lens: torch.Tensor | None = None
    query_start_loc: torch.Tensor | None = None

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (1, Hq, N, D), k, v (1, Hkv, N, D) after RoPE -> attention output (1, Hq, N, D): the
        step's K/V written first, then attention over the cache (the chunk sees its own keys)."""
        self._write(layer, k, v)
        return self._attend(layer, q)

    def _write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.write(self.k_caches[layer], self.v_caches[layer], k[0].transpose(0, 1).contiguous(),
                   v[0].transpose(0, 1).contiguous(), self.slots)

    def _attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        k_cache, v_cache = self.k_caches[layer], self.v_caches[layer]
        qt = q[0].transpose(0, 1).contiguous()                               # (N, Hq, D)
        if self.prefill is not None:
            out = self.prefill(qt, k_cache, v_cache, self.seq_tables, self.seq_seq_lens, self.query_start_loc,
                               scale=self.scale)
        else:
            out = self.attention(qt, k_cache, v_cache, self.tables, self.seq_lens, scale=self.scale)
        return out.transpose(0, 1)[None]


@dataclass
class _Request:
    rid: object
    prompt: list
    max_new: int
    temperature: float
    generator: torch.Generator | None
    out: list = field(default_factory=list)
    computed: int = 0          # tokens whose K/V are in the cache
    keys: list = field(default_factory=list)   # prefix-cache keys of its full computed blocks

    @property
    def tokens(self) -> list:
        return self.prompt + self.out


@dataclass
class KVTransfer:
    """A request handed from one engine to another (PA-9): its tokens, sampling state and the K/V
    of its first ``length`` tokens as the sender's blocks: ``block_ids`` (the sender's ids, in
    logical order), ``block_size`` (the sender's), ``k``, ``v`` (per layer (len(block_ids),
    block_size, Hkv, D), block i holding tokens i·block_size ..). ``logits``: the logits it
    sampled from so far (with ``keep_logits``)."""

    rid: object
    prompt: list
    out: list
    max_new: int
    temperature: float
    generator: torch.Generator | None
    length: int
    block_size: int
    block_ids: list
    k: list
    v: list
    logits: list = field(default_factory=list)


class PagedEngine:
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
        self.write = write or _torch_write
        self.prefix: dict[str, int] | None = {} if prefix_cache else None
        self.model_key = f"{id(model)}:{w.dtype}:{w.device}"
        self.waiting: deque[_Request] = deque()
        self.running: list[_Request] = []
        self.finished: dict = {}
        self._ids: set = set()
        self.stats = Counter()

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
        self.waiting.append(_Request(rid, prompt, max_new_tokens, float(temperature), generator))

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
        self.running.append(_Request(child, list(p.prompt), p.max_new, t, generator, list(p.out), p.computed,
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

    def _release(self, r: _Request) -> None:
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

    def _admit(self) -> list[_Request]:
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
            self.book.append_tokens(r.rid, len(toks) - r.computed)
            self.running.append(r)
            new.append(r)
        return new

    # ------------------------------------------------------------------ the step
    def _query_lens(self, positions: torch.Tensor) -> torch.Tensor:
        """Keys each token's query sees: every token up to and including its own position."""
        return (positions + 1).to(torch.int32)

    def _schedule(self) -> list[tuple[_Request, int]]:
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

    # ------------------------------------------------------------------ disaggregation (PA-9)
    def ready_to_send(self) -> list:
        """Ids of running requests that have computed every token but their last sampled one
        (a prefill engine hands these to a decode engine)."""
        return [r.rid for r in self.running if r.out and r.computed == len(r.tokens) - 1]

    def _pack(self, r: _Request) -> tuple[list, list, list]:
        """(block ids, K per layer, V per layer) of the request's computed tokens' blocks, in
        logical order."""
        n_blocks = -(-r.computed // self.block_size)
        ids = list(self.book.tables[r.rid][:n_blocks])
        idx = torch.tensor(ids, dtype=torch.int64, device=self.k[0].device)
        return ids, [c[idx].clone() for c in self.k], [c[idx].clone() for c in self.v]

    def send(self, rid) -> KVTransfer:
        """Take running request ``rid`` (ready: :meth:`ready_to_send`) out of this engine as a
        :class:`KVTransfer` and free its blocks. ValueError for a request that is not ready."""
        r = next((x for x in self.running if x.rid == rid), None)
        if r is None or rid not in self.ready_to_send():
            raise ValueError(f"request {rid!r} is not running with its prompt computed")
        ids, ks, vs = self._pack(r)
        t = KVTransfer(r.rid, list(r.prompt), list(r.out), r.max_new, r.temperature, r.generator, r.computed,
                       self.block_size, ids, ks, vs, list(self.logits.pop(r.rid, [])) if self.logits is not None else [])
        self.running.remove(r)
        self._release(r)
        self._ids.discard(rid)
        return t

    def _place(self, t: KVTransfer, rid) -> None:
        """Write the transfer's tokens into this engine's blocks of ``rid`` (booked): token p of
        sender block p // t.block_size, slot p % t.block_size, goes to this engine's slot of p."""
        dev = self.k[0].device
        slots = torch.tensor([self.book.slot(rid, p) for p in range(t.length)], device=dev)
        for l in range(self.cfg.n_layers):
            k = t.k[l].reshape(-1, *t.k[l].shape[2:])[:t.length].to(dev)
            v = t.v[l].reshape(-1, *t.v[l].shape[2:])[:t.length].to(dev)
            self.write(self.k[l], self.v[l], k.contiguous(), v.contiguous(), slots[:k.shape[0]])

    def receive(self, t: KVTransfer) -> None:
        """Continue a request sent by another engine: book blocks of this engine's block size for
        its ``t.length`` tokens (and the next), write their K/V into them by slot mapping
        (:meth:`_place`), and run it from its last sampled token. ValueError for a used id, a
        full batch, a transfer of another model shape; :class:`OutOfBlocks` when its blocks do
        not fit (nothing booked then)."""
        if t.rid in self._ids:
            raise ValueError(f"request id {t.rid!r} already used")
        if len(self.running) >= self.max_batch:
            raise ValueError(f"the batch is full ({self.max_batch} running)")
        shape = (self.cfg.n_kv_heads, self.cfg.hd)
        for name, cs in (("k", t.k), ("v", t.v)):
            if len(cs) != self.cfg.n_layers or any(tuple(c.shape) != (len(t.block_ids), t.block_size, *shape)
                                                   for c in cs):
                raise ValueError(f"transfer {name}: {len(cs)} layers of blocks do not fit {self.cfg.n_layers} layers "
                                 f"of ({len(t.block_ids)}, {t.block_size}, {shape[0]}, {shape[1]})")
        need = -(-(t.length + 1) // self.block_size)
        self._evict_cached(need)
        if self.book.allocator.num_free < need:
            raise OutOfBlocks(f"{need} blocks needed, {self.book.allocator.num_free} free")
        self.book.new_sequence(t.rid)
        self.book.append_tokens(t.rid, t.length)
        self._place(t, t.rid)
        r = _Request(t.rid, list(t.prompt), t.max_new, t.temperature, t.generator, list(t.out), t.length)
        self._ids.add(t.rid)
        self.running.append(r)
        if self.logits is not None:
            self.logits[t.rid] = list(t.logits)

    def _register_blocks(self, r: _Request) -> None:
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


class DisaggregatedEngine:
    """Prefill/decode disaggregation (PA-9; Splitwise, DistServe): requests go to
    ``prefill_engine``, which computes each prompt and samples its first token; each such request
    is then sent (:meth:`PagedEngine.send`) to ``decode_engine``, with its own pool and block size,
    which continues it. Each :meth:`step` steps the prefill engine, moves every ready request
    across while the decode engine has room (the others wait in the prefill engine), then steps
    the decode engine. ``finished``: rid -> tokens, from either engine (a one-token request ends
    in the prefill engine); ``transfers``: requests moved so far."""

    def __init__(self, prefill_engine: PagedEngine, decode_engine: PagedEngine):
        self.prefill_engine, self.decode_engine = prefill_engine, decode_engine
        self.transfers = 0

    def add_request(self, rid, prompt, max_new_tokens: int, temperature: float = 0.0,
                    generator: torch.Generator | None = None) -> None:
        if rid in self.decode_engine._ids:
            raise ValueError(f"request id {rid!r} already used")
        self.prefill_engine.add_request(rid, prompt, max_new_tokens, temperature, generator)

    def has_work(self) -> bool:
        return self.prefill_engine.has_work() or self.decode_engine.has_work()

    @property
    def finished(self) -> dict:
        return {**self.prefill_engine.finished, **self.decode_engine.finished}

    @property
    def logits(self) -> dict | None:
        p, d = self.prefill_engine.logits, self.decode_engine.logits
        return None if p is None or d is None else {**p, **d}

    def step(self) -> None:
        self.prefill_engine.step()
        d = self.decode_engine
        for rid in self.prefill_engine.ready_to_send():
            if len(d.running) >= d.max_batch:
                break
            d.receive(self.prefill_engine.send(rid))
            self.transfers += 1
        d.step()

    def run(self) -> dict:
        while self.has_work():
            self.step()
        return self.finished
