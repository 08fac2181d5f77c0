"""A KV transfer written outside the suite, from its contract page (docs/kv_transfer.md) alone.

Checked with no change to the suite:

    CI=true PYTHONPATH=examples .venv/bin/python -m pytest -n 1 properties --impl kv_transfer=my_kv_transfer:TRANSFER

The payload is a plain dict, as one would serialise it for the wire: the request's state and,
per layer, the K and V of its computed tokens one token per row (whatever the sender's block
size), so the receiver never needs the sender's block size or ids. ``BUGGY`` is the same with a
classic bug: only whole blocks are sent, the partly filled last block is left behind.
"""
from __future__ import annotations

import torch

from inference_conformance.conformance.contracts.kv_transfer import validate

MAGIC = "my-kv-transfer/1"


class MyTransfer:
    """Sends the computed tokens' K/V token by token, in logical order."""

    def tokens_to_send(self, length: int, block_size: int) -> int:
        return length

    def send(self, engine, request_id):
        validate(engine)
        state = engine.request_state(request_id)          # ValueError naming request_id if not ready
        ids = engine.block_ids(request_id)
        n = self.tokens_to_send(state.length, engine.block_size)
        rows = [(ids[p // engine.block_size], p % engine.block_size) for p in range(n)]
        blocks = torch.tensor([b for b, _ in rows], dtype=torch.long)
        slots = torch.tensor([s for _, s in rows], dtype=torch.long)
        k = [layer[blocks, slots].cpu().clone() for layer in engine.k]      # each (n, Hkv, D)
        v = [layer[blocks, slots].cpu().clone() for layer in engine.v]
        engine.release(request_id)
        return {"magic": MAGIC, "state": state, "k": k, "v": v}

    def receive(self, engine, payload):
        validate(engine)
        if not isinstance(payload, dict) or payload.get("magic") != MAGIC:
            raise TypeError(f"payload must be a dict this transfer's send returned, got {type(payload).__name__}")
        k, v = payload["k"], payload["v"]
        validate(engine, (len(k), k[0].shape[1], k[0].shape[2]))          # ValueError naming engine
        ids = engine.admit(payload["state"])               # ValueError naming the request id if held
        bs = engine.block_size
        n = k[0].shape[0]
        blocks = torch.tensor([ids[p // bs] for p in range(n)], dtype=torch.long)
        slots = torch.tensor([p % bs for p in range(n)], dtype=torch.long)
        for cache, sent in ((engine.k, k), (engine.v, v)):
            for layer, rows in zip(cache, sent):
                layer[blocks.to(layer.device), slots.to(layer.device)] = rows.to(layer.device, layer.dtype)


class WholeBlocksOnly(MyTransfer):
    """The bug: only the tokens of the sender's full blocks are sent (the last, partly filled
    block is dropped)."""

    def tokens_to_send(self, length: int, block_size: int) -> int:
        return length // block_size * block_size


TRANSFER = MyTransfer()
BUGGY = WholeBlocksOnly()
