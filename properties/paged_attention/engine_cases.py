"""Inputs and shared pieces of the paged engine's tests (``properties/paged_attention/test_paged_engine.py``;
the serve laws of ``properties/inference_engine/laws/serving.py`` run its pinned workloads;
PA-6..PA-8; PA-9's ``properties/kv_transfer/cases.py`` runs the same requests): the test model (:data:`CFG`, :func:`model_for`), requests
(:class:`Req`) and their strategies
(:func:`workloads`, :func:`shared_prefix_workloads`), running them through an engine at their
arrival steps (:func:`run_engine`) or alone without a cache
(:func:`alone`), and the comparison of two engines' tokens and logits (:func:`same_as`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from inference_conformance.conformance.tolerance import assert_close, assert_exact
from inference_conformance.optimized.paged_attention.engine import PagedEngine
from inference_conformance.reference.transformer import Transformer, TransformerConfig, generate, init_weights


CFG = TransformerConfig(vocab_size=37, d_model=16, n_layers=2, n_heads=6, n_kv_heads=2, d_ff=24, max_seq_len=64,
                        head_dim=4)


def model_for(seed: int, device: str = "cpu") -> Transformer:
    """The test model in float64, weights with std d_model^-1/2 (attention far from uniform)."""
    return init_weights(Transformer(CFG), seed, std=CFG.d_model ** -0.5).to(device=device, dtype=torch.float64).eval()


@dataclass(frozen=True)
class Req:
    prompt: tuple
    max_new: int
    arrival: int
    temperature: float
    seed: int


@st.composite
def workloads(draw, max_requests: int = 5, max_prompt: int = 14, max_new: int = 6):
    n = draw(st.integers(1, max_requests))
    reqs = []
    for i in range(n):
        plen = draw(st.integers(1, max_prompt))
        prompt = tuple(draw(st.lists(st.integers(0, CFG.vocab_size - 1), min_size=plen, max_size=plen)))
        reqs.append(Req(prompt, draw(st.integers(1, max_new)), draw(st.integers(0, 4)),
                        draw(st.sampled_from([0.0, 0.0, 1.0])), draw(st.integers(0, 2**16))))
    return tuple(reqs)


def admit_arrivals(engine: PagedEngine, reqs, pending: list, step: int, device: str) -> None:
    """Add to ``engine`` each request of ``pending`` (indices into ``reqs``, by arrival; consumed)
    that has arrived by ``step``; a sampled one gets a generator on ``device`` seeded by its seed."""
    while pending and reqs[pending[0]].arrival <= step:
        i = pending.pop(0)
        r = reqs[i]
        gen = torch.Generator(device=device).manual_seed(r.seed) if r.temperature > 0 else None
        engine.add_request(i, list(r.prompt), r.max_new, r.temperature, gen)


def run_engine(engine: PagedEngine, reqs, device: str = "cpu") -> dict:
    """Add each request at its arrival step, step until all finish; rid (its index) -> tokens.
    A sampled request's generator (seeded by its ``seed``) is on ``device``."""
    step = 0
    pending = sorted(range(len(reqs)), key=lambda i: reqs[i].arrival)
    while pending or engine.has_work():
        admit_arrivals(engine, reqs, pending, step, device)
        engine.step()
        step += 1
    return engine.finished


def alone(model, r: Req, device: str = "cpu") -> list:
    """The tokens ``r`` gets run alone through ``model`` without any cache (its generator on
    ``device``, seeded by its ``seed``)."""
    gen = torch.Generator(device=device).manual_seed(r.seed) if r.temperature > 0 else None
    toks, _ = generate(model, torch.tensor([list(r.prompt)], device=device), r.max_new, r.temperature, gen)
    return toks[0, len(r.prompt):].tolist()


def blocks_for(reqs, block_size: int) -> int:
    return max(-(-(len(r.prompt) + r.max_new) // block_size) for r in reqs)


# ---------------------------------------------------------------------------------------- PA-7
SYSTEM = tuple(range(2, 14))    # a 12-token system prompt: 4 full blocks of 3


@st.composite
def shared_prefix_workloads(draw):
    """Requests that share a system prompt (and some also an earlier turn), arriving over time."""
    n = draw(st.integers(2, 5))
    reqs = []
    for i in range(n):
        tail = tuple(draw(st.lists(st.integers(0, CFG.vocab_size - 1), min_size=1, max_size=6)))
        prefix = SYSTEM if draw(st.booleans()) or i == 0 else SYSTEM[: draw(st.integers(0, len(SYSTEM)))]
        reqs.append(Req(prefix + tail, draw(st.integers(1, 4)), draw(st.integers(0, 3)) + 2 * i,
                        draw(st.sampled_from([0.0, 1.0])), draw(st.integers(0, 2**16))))
    return tuple(reqs)


# ---------------------------------------------------------------------------------------- PA-8
def same_as(engine, baseline, reqs, what: str) -> None:
    """Every request's sampled tokens equal (exactly) and its logits, token by token, within the
    float64 tolerance of ``baseline``'s (both engines keep their logits)."""
    for i, r in enumerate(reqs):
        assert_exact(torch.tensor(engine.finished[i]), torch.tensor(baseline.finished[i]),
                     what=f"request {i} (prompt {len(r.prompt)}, {r.max_new} new, T={r.temperature}) tokens, {what}")
        assert_close(torch.stack(engine.logits[i]), torch.stack(baseline.logits[i]),
                     what=f"request {i} logits, {what}")


# ------------------------------------------- the pinned workloads (here and the serve laws)
#: Four requests in 7 blocks of 2: preemption and recomputation happen; one is sampled.
PREEMPTING = (Req(tuple(range(3, 12)), 5, 0, 0.0, 1), Req(tuple(range(20, 26)), 6, 0, 1.0, 2),
              Req((5, 5, 5), 4, 1, 0.0, 3), Req(tuple(range(1, 12)), 3, 2, 1.0, 4))


#: Equal tokens after different prefixes: block (7, 8, 9) follows (1, 2, 3) in one prompt and
#: opens the other; a key without the parent would share it.
DIFFERENT_PREFIXES = (Req((1, 2, 3, 7, 8, 9, 4), 3, 0, 0.0, 1), Req((7, 8, 9, 7, 8, 9, 5), 3, 2, 0.0, 2))


#: A 19-token prompt arriving while two requests decode, a token budget of 4: the prompt is
#: prefilled in chunks of 4 minus the decode tokens batched with them, over blocks of 3; the
#: second prompt's chunks start inside a block.
LONG_PROMPT = (Req((5, 6, 7), 6, 0, 0.0, 1), Req((8, 9), 7, 0, 1.0, 2), Req(tuple(range(1, 20)), 3, 1, 1.0, 3),
               Req(tuple(range(10, 17)), 2, 2, 0.0, 4))

