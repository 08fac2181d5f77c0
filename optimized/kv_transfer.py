"""An optimized ``kv_transfer`` (``conformance/contracts/kv_transfer.py``; claim PA-9): the payload
is one contiguous tensor (L, 2, length, Hkv, D) of the request's computed tokens only, without
the padding of the sender's last block and without its block size (what a transfer puts on the
wire), gathered and scattered with one index per engine, its slot mapping computed on the
device.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from inference_conformance.conformance.contracts.kv_transfer import validate


@dataclass
class PackedTokens:
    """The payload: the request's ``state`` and ``kv`` (L, 2, length, Hkv, D), K then V."""

    state: object
    kv: torch.Tensor


def slot_mapping(ids: list, block_size: int, length: int, device) -> torch.Tensor:
    """(length,) int64: the flat slot of each token p, ids[p // block_size]·block_size + p % block_size."""
    p = torch.arange(length, device=device)
    return torch.tensor(ids, dtype=torch.int64, device=device)[p // block_size] * block_size + p % block_size


class PackedTokenTransfer:
    """Sends the computed tokens' K/V packed contiguously (see the module's docstring)."""

    def send(self, engine, request_id) -> PackedTokens:
        validate(engine)
        state = engine.request_state(request_id)
        slots = slot_mapping(engine.block_ids(request_id), engine.block_size, state.length, engine.k[0].device)
        k0 = engine.k[0]
        kv = torch.empty(len(engine.k), 2, state.length, *k0.shape[2:], dtype=k0.dtype, device=k0.device)
        for i, cache in enumerate((engine.k, engine.v)):
            for layer, c in enumerate(cache):
                torch.index_select(c.view(-1, *c.shape[2:]), 0, slots, out=kv[layer, i])
        engine.release(request_id)
        return PackedTokens(state, kv)

    def receive(self, engine, payload) -> None:
        validate(engine)
        if not isinstance(payload, PackedTokens):
            raise TypeError(f"payload must be a PackedTokens this transfer's send returned, got {type(payload).__name__}")
        validate(engine, (payload.kv.shape[0], *payload.kv.shape[3:]))
        ids = engine.admit(payload.state)
        dev = engine.k[0].device
        slots = slot_mapping(ids, engine.block_size, payload.state.length, dev)
        kv = payload.kv.to(device=dev, dtype=engine.k[0].dtype)
        for i, cache in enumerate((engine.k, engine.v)):
            for layer, c in enumerate(cache):
                c.view(-1, *c.shape[2:]).index_copy_(0, slots, kv[layer, i])


#: The packed-token transfer.
TRANSFER = PackedTokenTransfer()


def implementations():
    """The optimized kv_transfer built-ins."""
    from inference_conformance.conformance.registry import builtin

    return (builtin("kv_transfer", "packed_tokens", TRANSFER),)
