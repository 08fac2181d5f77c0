"""The reference of the ``kv_transfer`` contract (``conformance/contracts/kv_transfer.py``; claim
PA-9): ``send`` packs a ready request's state and the K/V of the sender's blocks that hold its
computed tokens, by block id in logical order with the sender's block size (:class:`KVTransfer`),
then releases them; ``receive`` admits the request into the receiving engine, which books blocks
of its own size at its own ids, and writes every token p of sender block p // block_size, slot
p % block_size, at the receiver's slot of p (slot mapping). The default transfer of
``optimized/paged_attention/engine_disagg.py``'s ``DisaggregatedEngine``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from inference_conformance.conformance.contracts.kv_transfer import validate


@dataclass
class KVTransfer:
    """The reference's payload: the request's ``state`` (the sender's ``request_state``), the
    sender's ``block_size`` and ``block_ids`` (logical order, ceil(length / block_size) of them),
    and ``k``, ``v``: per layer (len(block_ids), block_size, Hkv, D), block i holding tokens
    i·block_size ..; slots past ``state.length`` hold whatever the sender's blocks held."""

    state: object
    block_size: int
    block_ids: list
    k: list
    v: list

    @property
    def length(self) -> int:
        return self.state.length


def pack(engine, request_id) -> KVTransfer:
    """The payload of ready request ``request_id`` (nothing released): its state and copies of
    the K/V of its first ceil(length / block_size) blocks, in logical order."""
    state = engine.request_state(request_id)
    ids = engine.block_ids(request_id)[:-(-state.length // engine.block_size)]
    idx = torch.tensor(ids, dtype=torch.int64, device=engine.k[0].device)
    return KVTransfer(state, engine.block_size, ids, [c[idx].clone() for c in engine.k],
                      [c[idx].clone() for c in engine.v])


def tokens(blocks: torch.Tensor, length: int) -> torch.Tensor:
    """(n_blocks, block_size, Hkv, D) blocks in logical order -> (length, Hkv, D): the tokens."""
    return blocks.reshape(-1, *blocks.shape[2:])[:length]


def place(engine, t: KVTransfer, ids: list, length: int) -> None:
    """Write the first ``length`` tokens of ``t`` into ``engine``'s blocks ``ids`` (the
    receiver's, logical order) by slot mapping: token p at block ids[p // block_size], slot
    p % block_size, in every layer."""
    bs = engine.block_size
    dev = engine.k[0].device
    slots = torch.tensor([ids[p // bs] * bs + p % bs for p in range(length)], dtype=torch.int64, device=dev)
    for cache, sent in ((engine.k, t.k), (engine.v, t.v)):
        for layer, blocks in zip(cache, sent):
            flat = layer.view(-1, *layer.shape[2:])
            flat.index_copy_(0, slots, tokens(blocks, length).to(device=dev, dtype=layer.dtype))


class ReferenceTransfer:
    """The reference transfer: blocks by id in logical order, the sender's block size, placed by
    the receiver's slot mapping (see the module's docstring)."""

    def send(self, engine, request_id) -> KVTransfer:
        """Pack ready request ``request_id`` of ``engine`` (:func:`pack`) and release it there.
        TypeError naming engine; ValueError naming request_id for a request that is not ready."""
        validate(engine)
        t = pack(engine, request_id)
        engine.release(request_id)
        return t

    def receive(self, engine, payload) -> None:
        """Admit ``payload``'s request into ``engine`` and write its K/V into the blocks the engine
        books (:func:`place`). TypeError naming engine or payload; ValueError naming engine for K/V
        of another shape, naming the request id for one ``engine`` already holds."""
        validate(engine)
        if not isinstance(payload, KVTransfer):
            raise TypeError(f"payload must be a KVTransfer this transfer's send returned, got {type(payload).__name__}")
        validate(engine, (len(payload.k), *(tuple(payload.k[0].shape[2:]) if payload.k else (0, 0))))
        ids = engine.admit(payload.state)
        place(engine, payload, ids, payload.length)


#: The reference transfer (the default of the disaggregated engine).
TRANSFER = ReferenceTransfer()


def implementations():
    """The reference of the kv_transfer contract."""
    from inference_conformance.conformance.registry import builtin

    return (builtin("kv_transfer", "reference", TRANSFER),)
