"""Prefill/decode disaggregation for the paged engine (PA-9; lecture 001 §4.5, Patel et al. 2024
(Splitwise), Zhong et al. 2024 (DistServe)): :class:`TransferMixin` gives
``optimized/paged_attention/engine.py``'s engine the surface a ``kv_transfer`` implementation
(``conformance/contracts/kv_transfer.py``) may use: the requests ready to send, a request's state
and block ids, its release on the sending side, its admission on the receiving side (blocks of
the receiver's own size and ids); the K/V themselves are read from and written to the engine's
``k`` and ``v`` by the transfer. :class:`DisaggregatedEngine` runs a prefill engine and a decode
engine, moving each request across with a transfer's ``send`` and ``receive``.
"""
from __future__ import annotations

import torch

from inference_conformance.optimized.paged_attention.engine_state import EngineRequest, RequestState
from inference_conformance.reference.paged_attention import OutOfBlocks


class TransferMixin:
    """The ``kv_transfer`` contract's engine surface (mixed into ``PagedEngine``, whose state it
    reads: ``running``, ``book``, ``block_size``, ``cfg``, ``logits``, ``max_batch``, ``_ids``,
    ``_release``, ``_evict_cached``). Besides these methods a transfer reads ``block_size`` and
    writes ``k``, ``v`` (per layer (num_blocks, block_size, Hkv, D))."""

    def ready_to_send(self) -> list:
        """Ids of running requests that have computed every token but their last sampled one
        (a prefill engine hands these to a decode engine)."""
        return [r.rid for r in self.running if r.out and r.computed == len(r.tokens) - 1]

    def _ready(self, request_id):
        r = next((x for x in self.running if x.rid == request_id), None)
        if r is None or not r.out or r.computed != len(r.tokens) - 1:
            raise ValueError(f"request_id {request_id!r} is not a running request of this engine with its prompt "
                             f"computed (ready to send: {self.ready_to_send()})")
        return r

    def request_state(self, request_id) -> RequestState:
        """The state of ready request ``request_id`` (copies: the engine keeps running it until
        :meth:`release`). ValueError naming request_id for a request that is not ready."""
        r = self._ready(request_id)
        logits = list(self.logits.get(r.rid, [])) if self.logits is not None else []
        return RequestState(r.rid, list(r.prompt), list(r.out), r.max_new, r.temperature, r.generator, r.computed,
                            logits)

    def block_ids(self, request_id) -> list:
        """This engine's block ids of ready request ``request_id``, in logical order (its block
        table): block i holds its tokens i·block_size .. (i + 1)·block_size − 1; ValueError naming
        request_id for a request that is not ready."""
        r = self._ready(request_id)
        return list(self.book.tables[r.rid])

    def release(self, request_id) -> None:
        """Take ready request ``request_id`` out of this engine and free its blocks (their K/V are
        this engine's to overwrite from then on: the blocks that fall free are filled with NaN at
        once, as a busy pool would reuse them, so a transfer that reads them after the release
        reads NaN). ValueError naming request_id for a request that is not ready."""
        r = self._ready(request_id)
        held = list(self.book.tables[r.rid])
        self.running.remove(r)
        self._release(r)
        self._ids.discard(request_id)
        if self.logits is not None:
            self.logits.pop(request_id, None)
        free = set(self.book.allocator.free_blocks())
        dead = torch.tensor([b for b in held if b in free], dtype=torch.int64, device=self.k[0].device)
        for cache in (*self.k, *self.v):
            cache[dead] = float("nan")

    def admit(self, state: RequestState) -> list:
        """Continue a request another engine sent: book blocks of this engine's block size for its
        ``state.length`` tokens (room for the next one checked too) and run it from its last
        sampled token; return this engine's block ids for those tokens, in logical order (the
        caller writes their K/V into ``k``, ``v`` before the next step). TypeError naming state
        for a state that is not a :class:`RequestState`; ValueError naming the request id for one
        already used here, naming the batch when it is full, naming length when it does not match
        the tokens; :class:`OutOfBlocks` when its blocks do not fit (nothing booked then)."""
        if not isinstance(state, RequestState):
            raise TypeError(f"state must be the RequestState request_state returned, got {type(state).__name__}")
        if state.request_id in self._ids:
            raise ValueError(f"request id {state.request_id!r} is already used in this engine")
        if len(self.running) >= self.max_batch:
            raise ValueError(f"the batch is full ({self.max_batch} running)")
        if not state.out or state.length != len(state.prompt) + len(state.out) - 1:
            raise ValueError(f"state.length {state.length} must be the tokens but the last sampled one "
                             f"({len(state.prompt)} + {len(state.out)} - 1)")
        need = -(-(state.length + 1) // self.block_size)
        self._evict_cached(need)
        if self.book.allocator.num_free < need:
            raise OutOfBlocks(f"{need} blocks needed, {self.book.allocator.num_free} free")
        self.book.new_sequence(state.request_id)
        self.book.append_tokens(state.request_id, state.length)
        self.running.append(EngineRequest(state.request_id, list(state.prompt), state.max_new, state.temperature,
                                          state.generator, list(state.out), state.length))
        self._ids.add(state.request_id)
        if self.logits is not None:
            self.logits[state.request_id] = list(state.logits)
        return list(self.book.tables[state.request_id])


class DisaggregatedEngine:
    """Prefill/decode disaggregation (PA-9; Splitwise, DistServe): requests go to
    ``prefill_engine``, which computes each prompt and samples its first token; each such request
    is then moved by ``transfer`` (a ``kv_transfer`` implementation: ``send`` on the prefill
    engine, ``receive`` on the decode engine; default the reference) to ``decode_engine``, with its
    own pool and block size, which continues it. Each :meth:`step` steps the prefill engine, sends
    every ready request the decode engine has room for (the others wait in the prefill engine),
    receives them in the order sent (``receive_order="sent"``) or the reverse ("reversed"), then
    steps the decode engine. ``finished``: rid -> tokens, from either engine (a one-token request
    ends in the prefill engine); ``transfers``: requests moved so far; ``most_in_flight``: the
    most payloads sent in one step before the first was received."""

    def __init__(self, prefill_engine: TransferMixin, decode_engine: TransferMixin, transfer=None, *,
                 receive_order: str = "sent"):
        if receive_order not in ("sent", "reversed"):
            raise ValueError(f"receive_order must be 'sent' or 'reversed', got {receive_order!r}")
        if transfer is None:
            from inference_conformance.reference.kv_transfer import TRANSFER as transfer
        self.prefill_engine, self.decode_engine, self.transfer = prefill_engine, decode_engine, transfer
        self.receive_order = receive_order
        self.transfers = 0
        self.most_in_flight = 0

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
        room = d.max_batch - len(d.running)
        payloads = [self.transfer.send(self.prefill_engine, rid) for rid in self.prefill_engine.ready_to_send()[:room]]
        self.most_in_flight = max(self.most_in_flight, len(payloads))
        for payload in (payloads if self.receive_order == "sent" else payloads[::-1]):
            self.transfer.receive(d, payload)
            self.transfers += 1
        d.step()

    def run(self) -> dict:
        while self.has_work():
            self.step()
        return self.finished
