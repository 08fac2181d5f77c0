"""Train / validation / test splits of the garden world, generated from fixed seeds.

Each split is ``generate_documents(size, seed)`` with its own seed, so every machine builds the
same documents (no data files are shipped). :func:`batches` turns documents into padded id
tensors: ``inputs`` = ``<bos>`` + words[:-1], ``targets`` = words (``<eos>`` included), padding
targets = -100 (ignored by the loss). NLL is per predicted token, ``<eos>`` included.
"""
from __future__ import annotations

import random
from functools import lru_cache

import torch

from inference_conformance.smallworld.grammar import generate_documents
from inference_conformance.smallworld.tokenizer import tokenizer

#: name -> (seed, number of documents)
SPLITS = {"train": (1001, 400_000), "val": (2002, 2_000), "test": (3003, 2_000)}
#: the fixed test subset that CI recomputes (first documents of the test split)
TEST_SUBSET = 64
IGNORE = -100


@lru_cache(maxsize=4)
def split(name: str, n: int | None = None) -> tuple[tuple[str, ...], ...]:
    """Documents of split ``name`` (first ``n`` of them; all by default). The first ``n`` are the
    same whatever ``n`` is. Raises ValueError for an unknown split."""
    if name not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {name!r}")
    seed, size = SPLITS[name]
    n = size if n is None else min(n, size)
    return tuple(tuple(d) for d in generate_documents(n, seed))


def encode(docs) -> list[list[int]]:
    tok = tokenizer()
    return [tok.encode_document(list(d)) for d in docs]


def pad_batch(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Encoded documents (``<bos>`` ... ``<eos>``) -> (inputs (B, T), targets (B, T)) int64."""
    tok = tokenizer()
    T = max(len(s) for s in seqs) - 1
    inputs = torch.full((len(seqs), T), tok.pad_id, dtype=torch.int64)
    targets = torch.full((len(seqs), T), IGNORE, dtype=torch.int64)
    for b, s in enumerate(seqs):
        x = torch.tensor(s, dtype=torch.int64)
        inputs[b, : len(s) - 1] = x[:-1]
        targets[b, : len(s) - 1] = x[1:]
    return inputs, targets


def batches(seqs: list[list[int]], batch_size: int, seed: int | None = None):
    """Yield padded (inputs, targets) batches; shuffled with ``random.Random(seed)`` when a seed
    is given, else in order."""
    order = list(range(len(seqs)))
    if seed is not None:
        random.Random(seed).shuffle(order)
    for i in range(0, len(order), batch_size):
        yield pad_batch([seqs[j] for j in order[i: i + batch_size]])


@torch.no_grad()
def nll(model, docs, batch_size: int = 256) -> float:
    """Mean negative log-likelihood in nats per predicted token (``<eos>`` included) of ``model``
    (a reference Transformer) on ``docs``, accumulated in float64."""
    seqs = encode(docs)
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for inputs, targets in batches(seqs, batch_size):
        logits = model(inputs.to(device))  # (B, T, V)
        logp = torch.log_softmax(logits.double(), dim=-1)
        t = targets.to(device)
        mask = t != IGNORE
        picked = logp.gather(-1, t.clamp(min=0)[..., None]).squeeze(-1)
        total += float(-(picked[mask]).sum())
        count += int(mask.sum())
    return total / count
