"""A continuous-batching engine over the reference transformer with a paged KV cache and a prefix
cache (claims PA-6, PA-7; lecture 001 §4.1, §4.4; Yu et al. 2022 (Orca), Kwon et al. 2023 (vLLM),
Zheng et al. 2024 (SGLang's prefix sharing)).

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

``attention``: any ``paged_attention`` implementation (default: the reference;
``optimized.paged_attention.paged_attention`` for the Triton kernel); ``write``: the cache write
(default: PyTorch ``index_copy_``; ``optimized.paged_attention.write_kv_cache`` for Triton).
"""
from __future__ import annotations

import hashlib
import math
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from reference.paged_attention import OutOfBlocks, PagedKVCache
from reference.transformer import Transformer, sample_next


def _torch_write(k_cache, v_cache, k, v, slot_mapping) -> None:
    nb, bs, hkv, d = k_cache.shape
    idx = slot_mapping.to(torch.int64)
    k_cache.view(nb * bs, hkv, d).index_copy_(0, idx, k)
    v_cache.view(nb * bs, hkv, d).index_copy_(0, idx, v)


@dataclass
class PagedCacheAttention:
    """The attention backend (:class:`reference.transformer.AttentionCache`) of one step's
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

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (1, Hq, N, D), k, v (1, Hkv, N, D) after RoPE -> attention output (1, Hq, N, D)."""
        k_cache, v_cache = self.k_caches[layer], self.v_caches[layer]
        self.write(k_cache, v_cache, k[0].transpose(0, 1).contiguous(), v[0].transpose(0, 1).contiguous(),
                   self.slots)
        out = self.attention(q[0].transpose(0, 1).contiguous(), k_cache, v_cache, self.tables, self.seq_lens,
                             scale=self.scale)                               # (N, Hq, D)
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


class PagedEngine:
    """Continuous batching over ``model`` with a paged cache of ``num_blocks`` blocks of
    ``block_size`` tokens (shared by all layers), at most ``max_batch`` running requests.

    Errors: ValueError for bad sizes, a duplicate request id, an empty prompt, ids outside the
    vocabulary, a request longer than the model's max_seq_len or than the whole cache.
    """

    def __init__(self, model: Transformer, *, num_blocks: int, block_size: int, max_batch: int = 64,
                 attention=None, write=None, prefix_cache: bool = False):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        cfg = model.cfg
        self.model, self.cfg, self.block_size, self.max_batch = model, cfg, block_size, max_batch
        self.book = PagedKVCache(num_blocks, block_size)
        w = model.embed.weight
        shape = (num_blocks, block_size, cfg.n_kv_heads, cfg.hd)
        self.k = [torch.full(shape, float("nan"), dtype=w.dtype, device=w.device) for _ in range(cfg.n_layers)]
        self.v = [torch.full(shape, float("nan"), dtype=w.dtype, device=w.device) for _ in range(cfg.n_layers)]
        if attention is None:
            from reference.paged_attention import paged_attention as attention
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
        toks, pos, rows, last = [], [], [], []
        for i, r in enumerate(self.running):
            seq = r.tokens
            n = len(seq) - r.computed
            self.stats["computed_tokens"] += n
            toks += seq[r.computed:]
            pos += range(r.computed, len(seq))
            rows += [i] * n
            last.append(len(toks) - 1)
        ids = list(dict.fromkeys(r.rid for r in self.running))
        table = self.book.block_table(ids, fill=-1, device=dev)                   # (R, max_blocks)
        rows_t = torch.tensor(rows, device=dev)
        positions = torch.tensor(pos, device=dev)
        slots = torch.tensor([self.book.slot(self.running[i].rid, p) for i, p in zip(rows, pos)], device=dev)
        logits = self._forward(torch.tensor(toks, device=dev), positions, table[rows_t], slots, last)
        produced = {}
        still = []
        for i, r in enumerate(self.running):
            r.computed = len(r.tokens)
            self._register_blocks(r)
            nxt = int(sample_next(logits[i:i + 1], r.temperature, r.generator)[0])
            r.out.append(nxt)
            produced[r.rid] = nxt
            if len(r.out) == r.max_new:
                self.finished[r.rid] = list(r.out)
                self._release(r)
            else:
                still.append(r)
        self.running = still
        return produced

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

    def _forward(self, tokens, positions, table, slots, last) -> torch.Tensor:
        """One forward over the token matrix (N tokens of several sequences); logits (R, V) of
        each sequence's last token."""
        attention = PagedCacheAttention(self.k, self.v, self.write, self.attention, table, slots,
                                        self._query_lens(positions), 1.0 / math.sqrt(self.cfg.hd))
        return self.model(tokens[None], positions[None], attention, rows=torch.tensor(last, device=tokens.device))
