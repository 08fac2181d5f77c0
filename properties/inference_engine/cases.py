"""What the engine laws share (claims EN-1..EN-3, KV-2 for a whole engine): the exported model
folders, the float64 oracle read from them, the prompts, and the checks, each a plain function
of an engine's output so that the suite's tests show it rejecting a known-bad one.

Prompts come from the small world's grammar (documents of the ``val`` split, a prefix of
each) and, for EN-2, from a pool of segments: ``<bos>`` + A + S + tail with A of 7 ids and S of 8,
so that full blocks of 4 or 8 tokens (S's) repeat after different prefixes (A's): a prefix cache
keyed by a block's tokens alone serves such a block stale.
"""
from __future__ import annotations

import functools
import random
import tempfile

import torch

from inference_conformance.conformance import results
from inference_conformance.conformance.contracts.inference_engine import Completion, Params, logit_bound
from inference_conformance.conformance.tolerance import check_exact, check_within
from inference_conformance.smallworld import data
from inference_conformance.smallworld.hf_export import BOS_ID, export_world
from inference_conformance.smallworld.hf_llama import load_hf_llama

@functools.lru_cache(maxsize=1)
def folders() -> dict[str, str]:
    """The small world's exported folders, written once per process: "target", "draft_good"
    and "draft_good-hd64" (the draft zero-padded to head dim 64, for engines refusing 16)."""
    out = tempfile.mkdtemp(prefix="inference-conformance-models-")
    done = export_world(out, ("target", "draft_good"), (64,))
    return {k: str(p) for k, (p, _) in done.items()}


@functools.lru_cache(maxsize=4)
def oracle(folder: str):
    """The float64 reference model of ``folder``."""
    return load_hf_llama(folder, dtype=torch.float64)


def params(**kw) -> Params:
    """Params over the exported target (and draft_good for speculative='draft')."""
    f = folders()
    if kw.get("speculative") == "draft":
        kw.setdefault("draft", f["draft_good"])
    return Params(f["target"], **kw)


def document_prompts(seed: int, n: int, max_len: int = 12) -> list[tuple]:
    """``n`` prompts: a prefix (1..max_len ids, ``<bos>`` first) of grammar documents."""
    rng = random.Random(seed)
    docs = data.encode(data.split("val", 200))
    return [tuple(d[:rng.randint(1, min(max_len, len(d)))]) for d in rng.sample(docs, n)]


def shared_block_prompts(seed: int, vocab_size: int = 294) -> list[tuple]:
    """Four prompts ``<bos>`` + A_i + S_j + tail, (i, j) over {0, 1}²: full blocks repeat after
    different prefixes (see the module docstring)."""
    rng = random.Random(seed)
    seg = lambda n: [rng.randrange(3, vocab_size) for _ in range(n)]   # noqa: E731
    A, S = [seg(7), seg(7)], [seg(8), seg(8)]
    return [tuple([BOS_ID] + A[i] + S[j] + seg(rng.randint(0, 3))) for i in (0, 1) for j in (0, 1)]


@torch.no_grad()
def position_logits(folder: str, prompt: tuple, tokens: torch.Tensor) -> torch.Tensor:
    """(n, V) float64 logits that chose each of ``tokens`` after ``prompt`` (teacher-forced)."""
    seq = torch.tensor([list(prompt) + tokens.tolist()])
    return oracle(folder)(seq)[0, len(prompt) - 1:-1]


def check_greedy(c: Completion, prompt: tuple, folder: str, bound: float, what: str) -> int:
    """EN-1 on one completion: every token the float64 argmax, or within 2·``bound`` of it (an
    excused near-tie); logprobs within 2·``bound`` of the float64 log-softmax. Returns the
    number of excused positions; raises AssertionError (the tolerance policy's verdict)."""
    n = int(c.tokens.numel())
    logits = position_logits(folder, prompt, c.tokens)                          # (n, V)
    gap = logits.max(-1).values - logits[torch.arange(n), c.tokens]
    limit = torch.full((n,), 2 * bound, dtype=torch.float64)
    check_within(gap, torch.zeros(n, dtype=torch.float64), limit, what=f"{what}: float64 gap of the chosen tokens",
                 rule="EN-1: the chosen token's float64 logit within twice the dtype's bound of the top").check()
    check_logprobs(c, logits, bound, what)
    return int((gap > 0).sum())


def check_logprobs(c: Completion, logits: torch.Tensor, bound: float, what: str) -> None:
    """EN-1 on a completion's logprobs (greedy or sampled): each within 2·``bound`` of the float64
    log-softmax of the raw logits (n, V) at its chosen token; nothing where the engine gives none."""
    if c.logprobs is None:
        return
    n = int(c.tokens.numel())
    ref = torch.log_softmax(logits, -1)[torch.arange(n), c.tokens]
    check_within(c.logprobs.double(), ref, torch.full((n,), 2 * bound, dtype=torch.float64),
                 what=f"{what}: logprobs of the chosen tokens",
                 rule="EN-1: logprobs within twice the dtype's bound of the float64 log-softmax").check()


def check_same(a: Completion, b: Completion, prompt: tuple, folder: str, bound: float, what: str,
               bitwise: bool = False) -> tuple[bool, bool]:
    """EN-2 / EN-3 (greedy): completion ``b`` equals ``a`` (the request alone, or target-only).
    Up to their first different token; there the float64 logits of the two tokens after the
    shared prefix must be within 2·``bound`` (an excused near-tie, where the comparison stops),
    unless ``bitwise`` (a declared batch-invariant engine: tokens and logprobs identical).
    Returns (excused, logprobs bitwise equal); raises AssertionError."""
    ta, tb = a.tokens.tolist(), b.tokens.tolist()
    first = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), None)
    same_lp = (a.logprobs is not None and b.logprobs is not None and torch.equal(a.logprobs, b.logprobs))
    if bitwise or first is None:
        check_exact(b.tokens, a.tokens, what=f"{what}: tokens").check()
        if bitwise and a.logprobs is not None:
            check_exact(b.logprobs, a.logprobs, what=f"{what}: logprobs (declared batch invariant)").check()
        return False, same_lp
    logits = position_logits(folder, prompt, a.tokens)[first]
    gap = (logits[ta[first]] - logits[tb[first]]).abs().reshape(1)
    check_within(gap, torch.zeros(1, dtype=torch.float64), torch.full((1,), 2 * bound, dtype=torch.float64),
                 what=f"{what}: tokens differ at {first} ({ta[first]} vs {tb[first]})",
                 rule="the two tokens' float64 logits within twice the dtype's bound (a near-tie)").check()
    return True, False


def generate(engine, requests: list, p: Params) -> list[Completion]:
    """``engine.generate(requests, p)``, one request per call where the engine declares no
    batching (the laws' many-request calls are then sent one by one, as a user would)."""
    if engine.capabilities().batching:
        return engine.generate(requests, p)
    return [engine.generate([r], p)[0] for r in requests]


def dtype_bound(engine) -> float:
    """EN-1's bound for ``engine``'s declared dtype."""
    return logit_bound(engine.capabilities().dtype)


def record_figure(claim: str, measured, unit: str, rule: str) -> None:
    results.record(claim, measured=measured, unit=unit, rule=rule)
