"""Prefill/decode disaggregation for the paged engine (PA-9; lecture 001 §4.5, Patel et al. 2024
(Splitwise), Zhong et al. 2024 (DistServe)): :class:`TransferMixin` gives
``optimized/paged_attention/engine.py``'s engine :meth:`~TransferMixin.send` (pack a request that has
computed its prompt and sampled its first token into a :class:`KVTransfer`, its blocks by id in
logical order with their K/V, and free them) and :meth:`~TransferMixin.receive` (on another
engine, with its own pool and block size: book blocks for the tokens and write them into its own
block ids through its slot mapping); :class:`DisaggregatedEngine` runs a prefill engine and a
decode engine so.
"""
from __future__ import annotations

import torch

from inference_conformance.optimized.paged_attention.engine_state import EngineRequest, KVTransfer
from inference_conformance.reference.paged_attention import OutOfBlocks


class TransferMixin:
    """Sending and receiving requests between engines (mixed into ``PagedEngine``, whose state it
    reads: ``running``, ``book``, ``k``, ``v``, ``block_size``, ``cfg``, ``write``, ``logits``,
    ``max_batch``, ``_ids``, ``_release``, ``_evict_cached``)."""

    def ready_to_send(self) -> list:
        """Ids of running requests that have computed every token but their last sampled one
        (a prefill engine hands these to a decode engine)."""
        return [r.rid for r in self.running if r.out and r.computed == len(r.tokens) - 1]

    def _pack(self, r: EngineRequest) -> tuple[list, list, list]:
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
        r = EngineRequest(t.rid, list(t.prompt), t.max_new, t.temperature, t.generator, list(t.out), t.length)
        self._ids.add(t.rid)
        self.running.append(r)
        if self.logits is not None:
            self.logits[t.rid] = list(t.logits)


class DisaggregatedEngine:
    """Prefill/decode disaggregation (PA-9; Splitwise, DistServe): requests go to
    ``prefill_engine``, which computes each prompt and samples its first token; each such request
    is then sent (:meth:`TransferMixin.send`) to ``decode_engine``, with its own pool and block size,
    which continues it. Each :meth:`step` steps the prefill engine, moves every ready request
    across while the decode engine has room (the others wait in the prefill engine), then steps
    the decode engine. ``finished``: rid -> tokens, from either engine (a one-token request ends
    in the prefill engine); ``transfers``: requests moved so far."""

    def __init__(self, prefill_engine: TransferMixin, decode_engine: TransferMixin):
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
