"""Sampling whole documents from a garden-world model (with a simple KV cache).

:func:`sample_ids` runs the reference :class:`~inference_conformance.reference.transformer.Transformer`'s one forward
step by step over a :class:`GrowingCache` (each layer's keys and values so far), and draws every token with
:func:`inference_conformance.reference.transformer.sample_next` (one uniform per row per step from ``generator``),
so it consumes the same random numbers as :func:`inference_conformance.reference.transformer.generate` and emits the
same tokens (``properties/world/test_world_models.py`` checks it in float64). It exists so that the
training command can judge 1000 samples per model in seconds; the suite's KV-cache engines live
in ``optimized/``.
"""
from __future__ import annotations

import torch

from inference_conformance.reference.transformer import Transformer, naive_attention, sample_next
from inference_conformance.smallworld.checker import grammatical_fraction
from inference_conformance.smallworld.tokenizer import tokenizer


class GrowingCache:
    """The simplest :class:`~inference_conformance.reference.transformer.AttentionCache`: each layer's keys and values
    so far, grown by concatenation along T; the forward's queries attend over every cached key
    (one new token per row per step, so no mask is needed)."""

    def __init__(self, n_layers: int):
        self.kv: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * n_layers

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.kv[layer] is not None:
            k = torch.cat([self.kv[layer][0], k], dim=2)  # (B, Hkv, t+1, D)
            v = torch.cat([self.kv[layer][1], v], dim=2)
        self.kv[layer] = (k, v)
        return naive_attention(q, k, v)  # (B, Hq, 1, D): one query sees every cached key


@torch.no_grad()
def sample_ids(model: Transformer, n: int, temperature: float = 1.0, generator: torch.Generator | None = None,
               max_len: int | None = None) -> torch.Tensor:
    """``n`` sequences (n, 1 + steps) int64 starting with ``<bos>``; stops when every row has
    produced ``<eos>`` or after ``max_len`` tokens (default: the model's max_seq_len - 1)."""
    cfg = model.cfg
    tok = tokenizer()
    device = next(model.parameters()).device
    max_len = cfg.max_seq_len - 1 if max_len is None else max_len
    tokens = torch.full((n, 1), tok.bos_id, dtype=torch.int64, device=device)  # (B, 1)
    done = torch.zeros(n, dtype=torch.bool, device=device)
    cache = GrowingCache(cfg.n_layers)
    for t in range(max_len):
        positions = torch.full((n, 1), t, dtype=torch.int64, device=device)  # (B, 1)
        logits = model(tokens[:, -1:], positions, cache)[:, -1]  # (B, V): the model's one forward
        nxt = sample_next(logits, temperature, generator)  # (B,)
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)
        done |= nxt == tok.eos_id
        if bool(done.all()):
            break
    return tokens


def sample_documents(model: Transformer, n: int, temperature: float = 1.0, seed: int = 0,
                     batch_size: int = 250) -> list[list[str]]:
    """``n`` documents (lists of words, ``<eos>`` kept when produced) drawn at ``temperature``
    from ``model``, deterministic from ``seed`` (one ``torch.Generator`` for all batches)."""
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    tok = tokenizer()
    docs: list[list[str]] = []
    for i in range(0, n, batch_size):
        ids = sample_ids(model, min(batch_size, n - i), temperature, g)
        docs.extend(tok.document_words(row.tolist()) for row in ids)
    return docs


def grammatical_rate(model: Transformer, n: int = 1000, temperature: float = 1.0, seed: int = 0) -> float:
    """Fraction of ``n`` sampled documents the garden checker accepts (lecture 001 §6.4)."""
    return grammatical_fraction(sample_documents(model, n, temperature, seed))
