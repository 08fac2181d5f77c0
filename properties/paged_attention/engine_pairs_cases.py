"""The paged engine's features combined (``properties/paged_attention/test_paged_engine_pairs.py`` on the
engine itself; ``properties/inference_engine/laws/serving.py`` over every registered engine; PA-6,
PA-7, PA-8 together): what an example switches on (:class:`Combo`), the drawn combinations
(:func:`combos`), a run with a fork after the parent's first token (:func:`run_combo`) and each
request's tokens alone (:func:`expected`), the oracle: the reference model without any cache.

Continuous batching (requests arriving at drawn steps while others run, ``max_batch`` >= 2) is
on in every example; the four switches are the prefix cache, a token budget per step (chunked
prefill), a copy-on-write fork of a running request and a pool small enough to preempt.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from inference_conformance.properties.paged_attention.engine_cases import (SYSTEM, Req, admit_arrivals, alone,
                                                                      shared_prefix_workloads)
from inference_conformance.reference.transformer import generate

#: The engine features an example switches on, two or more at a time.
FEATURES = ("prefix_cache", "chunked_prefill", "fork", "preemption")
PAIRS = tuple(frozenset(p) for p in itertools.combinations(FEATURES, 2))


@dataclass(frozen=True)
class Combo:
    """One example: the requests (arrivals at their steps), the features on, the token budget
    (chunked prefill), the block size, the spare blocks over the largest request (preemption;
    otherwise a pool for every request at once), the batch size and the model's seed. A fork
    makes request 0's child (seed 777, temperature 1) once request 0 has its first token."""

    reqs: tuple
    features: frozenset
    budget: int = 4
    block_size: int = 3
    slack: int = 1
    max_batch: int = 4
    seed: int = 0

    def engine_kw(self) -> dict:
        """The engine's keyword arguments for this example."""
        need = [-(-(len(r.prompt) + r.max_new) // self.block_size) for r in self.reqs]
        pool = max(need) + self.slack if "preemption" in self.features else 2 * sum(need) + 2
        return dict(num_blocks=pool, block_size=self.block_size, max_batch=self.max_batch,
                    prefix_cache="prefix_cache" in self.features,
                    max_num_batched_tokens=self.budget if "chunked_prefill" in self.features else None)


@st.composite
def combos(draw):
    """Requests sharing a system prompt (some an earlier turn), arriving over time, with two or
    more features on, budgets 1..8, blocks of 1..4, 0..3 spare blocks, batches of 2..4."""
    reqs = draw(shared_prefix_workloads())
    feats = frozenset(draw(st.lists(st.sampled_from(FEATURES), min_size=2, max_size=4, unique=True)))
    return Combo(reqs, feats, budget=draw(st.integers(1, 8)), block_size=draw(st.integers(1, 4)),
                 slack=draw(st.integers(0, 3)), max_batch=draw(st.integers(2, 4)), seed=draw(st.integers(0, 100)))


#: A 12-token system prompt and a 6-token turn (request 0, four new tokens); the same system
#: prompt and one token more arriving at step 1, while request 0 is still prefilled in chunks of
#: 4: its one token left after the cached blocks is scheduled first, like a decode token (a block
#: published before its chunk is computed is read unwritten); a third request at step 2.
PINNED_REQS = (Req(SYSTEM + (20, 21, 22, 23, 24, 25), 4, 0, 0.0, 1), Req(SYSTEM + (30,), 3, 1, 1.0, 2),
               Req((5, 6), 9, 0, 0.0, 3))


def pinned() -> tuple:
    """One example per pair of features on the pinned requests (preemption: no spare block, one
    beside the prefix cache, so that the shared blocks are reused before the pool runs short)."""
    return tuple(Combo(PINNED_REQS, p, budget=4, block_size=3, slack=int("prefix_cache" in p), max_batch=4, seed=5)
                 for p in PAIRS)


FORK_SEED = 777


def run_combo(engine, combo: Combo, device: str = "cpu") -> dict:
    """Run ``combo`` through ``engine``: each request added at its arrival step; with "fork" on,
    request 0 forked into rid "child" (its own generator, temperature 1) in the first step after
    it has emitted a token while it still has more to make. Returns rid -> tokens and, under
    "fork", the parent's tokens at the fork (``"forked_after"``). Generators on ``device``."""
    reqs, step, forked_after = combo.reqs, 0, None
    pending = sorted(range(len(reqs)), key=lambda i: reqs[i].arrival)
    while pending or engine.has_work():
        admit_arrivals(engine, reqs, pending, step, device)
        if "fork" in combo.features and forked_after is None:
            parent = next((r for r in engine.running if r.rid == 0), None)
            if parent is not None and 1 <= len(parent.out) < parent.max_new:
                forked_after = list(parent.out)
                engine.fork(0, "child", torch.Generator(device=device).manual_seed(FORK_SEED), temperature=1.0)
        engine.step()
        step += 1
    return {**engine.finished, "forked_after": forked_after}


def expected(model, combo: Combo, forked_after, device: str = "cpu") -> dict:
    """rid -> the tokens each request gets alone (the reference model, no cache); the child: the
    parent's prompt and tokens at the fork, continued alone with the child's generator."""
    out = {i: alone(model, r, device) for i, r in enumerate(combo.reqs)}
    if forked_after is not None:
        r = combo.reqs[0]
        prefix = list(r.prompt) + forked_after
        toks, _ = generate(model, torch.tensor([prefix], device=device), r.max_new - len(forked_after), 1.0,
                           torch.Generator(device=device).manual_seed(FORK_SEED))
        out["child"] = forked_after + toks[0, len(prefix):].tolist()
    return out
