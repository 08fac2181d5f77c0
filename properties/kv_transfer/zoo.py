"""Known-bad KV transfers (the bug zoo): each one is a bug of the field's prefill/decode KV
connectors, and PA-9's law (``properties/kv_transfer/cases.py``) must reject every one
(``test_kv_transfer.py``).

All are the reference transfer (``reference/kv_transfer.py``) with one step changed, so that only
the bug makes them wrong: each writes only what its payload holds, so none crashes the engine;
the decode engine attends over slots the bug left unwritten (NaN or another request's K/V) or
over K/V in the wrong place.
"""
from __future__ import annotations

import torch

from inference_conformance.reference.kv_transfer import KVTransfer, ReferenceTransfer, pack, place


class DropsLastPartialBlock(ReferenceTransfer):
    """The sender leaves out the request's last block when it is partly filled (the block being
    written), as a transfer of "full blocks only" does; the receiver writes the tokens it got."""

    def send(self, engine, request_id):
        t = pack(engine, request_id)
        if t.length % t.block_size:
            t = KVTransfer(t.state, t.block_size, t.block_ids[:-1], [k[:-1] for k in t.k], [v[:-1] for v in t.v])
        engine.release(request_id)
        return t

    def receive(self, engine, payload):
        ids = engine.admit(payload.state)
        place(engine, payload, ids, min(payload.length, len(payload.block_ids) * payload.block_size))


class BlocksInIdOrder(ReferenceTransfer):
    """The sender sends a request's blocks sorted by block id, not in its block table's logical
    order: a pool that hands blocks out in no particular order reorders the tokens."""

    def send(self, engine, request_id):
        t = pack(engine, request_id)
        order = sorted(range(len(t.block_ids)), key=t.block_ids.__getitem__)
        engine.release(request_id)
        return KVTransfer(t.state, t.block_size, [t.block_ids[i] for i in order], [k[order] for k in t.k],
                          [v[order] for v in t.v])


class TruncatedToWholeBlocks(ReferenceTransfer):
    """The receiver writes only the tokens that fill whole blocks of its own block size: the tail
    that lands in its partly filled last block is lost."""

    def receive(self, engine, payload):
        ids = engine.admit(payload.state)
        place(engine, payload, ids, payload.length // engine.block_size * engine.block_size)


class PlacedAtSenderIds(ReferenceTransfer):
    """The receiver writes each token at the sender's slot (the sender's block id and offset,
    taken in its own pool), not at the slot of its own block table."""

    def receive(self, engine, payload):
        engine.admit(payload.state)
        n_slots = engine.k[0].shape[0] * engine.block_size
        slots = torch.tensor([(payload.block_ids[p // payload.block_size] * payload.block_size
                               + p % payload.block_size) % n_slots for p in range(payload.length)])
        for cache, sent in ((engine.k, payload.k), (engine.v, payload.v)):
            for layer, blocks in zip(cache, sent):
                tokens = blocks.reshape(-1, *blocks.shape[2:])[:payload.length]
                layer.view(-1, *layer.shape[2:]).index_copy_(0, slots.to(layer.device), tokens.to(layer.device))


class HeadMajorLayoutMismatch(ReferenceTransfer):
    """The receiver reads the sender's blocks, laid out (block_size, Hkv, D), as if they were
    (Hkv, block_size, D) (a prefill instance with the "NHD" layout, a decode instance expecting
    "HND"): right only for blocks of one token."""

    def receive(self, engine, payload):
        def relaid(blocks):
            n, bs, h, d = blocks.shape
            return blocks.reshape(n, h, bs, d).transpose(1, 2).contiguous()
        ids = engine.admit(payload.state)
        bad = KVTransfer(payload.state, payload.block_size, payload.block_ids, [relaid(k) for k in payload.k],
                         [relaid(v) for v in payload.v])
        place(engine, bad, ids, payload.length)


class ReadsAfterRelease(ReferenceTransfer):
    """The payload keeps the sender's cache and block ids, not a copy: the receiver reads the
    sender's blocks after the send released them (a zero-copy connector that frees before the
    transfer completes), by when the sender's pool may have reused them."""

    def send(self, engine, request_id):
        state, ids = engine.request_state(request_id), engine.block_ids(request_id)
        engine.release(request_id)
        return (state, engine, ids)

    def receive(self, engine, payload):
        state, sender, ids = payload
        n = -(-state.length // sender.block_size)
        idx = torch.tensor(ids[:n], dtype=torch.int64, device=sender.k[0].device)
        t = KVTransfer(state, sender.block_size, ids[:n], [c[idx] for c in sender.k], [c[idx] for c in sender.v])
        place(engine, t, engine.admit(state), state.length)


def _bug(cls) -> str:
    """The first sentence of a known-bad transfer's docstring (its one-line bug)."""
    return " ".join(cls.__doc__.split()).split(". ")[0].rstrip(".")


def implementations():
    """The known-bad KV transfers: PA-9's law names each in its ``kills``."""
    from inference_conformance.conformance.registry import known_bad

    return (
        known_bad("kv_transfer", "drops_last_partial_block", DropsLastPartialBlock(), bug=_bug(DropsLastPartialBlock)),
        known_bad("kv_transfer", "blocks_in_id_order", BlocksInIdOrder(), bug=_bug(BlocksInIdOrder)),
        known_bad("kv_transfer", "truncated_to_whole_blocks", TruncatedToWholeBlocks(), bug=_bug(TruncatedToWholeBlocks)),
        known_bad("kv_transfer", "placed_at_sender_ids", PlacedAtSenderIds(), bug=_bug(PlacedAtSenderIds)),
        known_bad("kv_transfer", "head_major_layout_mismatch", HeadMajorLayoutMismatch(),
                  bug=_bug(HeadMajorLayoutMismatch)),
        known_bad("kv_transfer", "reads_after_release", ReadsAfterRelease(), bug=_bug(ReadsAfterRelease)),
    )
