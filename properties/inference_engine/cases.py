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
from inference_conformance.conformance.tolerance import check_exact, check_within, report_verdict
from inference_conformance.conformance.tolerance_rules import HALF_DTYPES, NEAR_TIE, RULES, max_abs_error, model_rule
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


def measured_error(c: Completion, logits: torch.Tensor) -> float | None:
    """The engine's measured error on one completion: max |logprob − float64 log-softmax of the raw
    ``logits`` (n, V)| at its chosen tokens; None where it returns no logprobs."""
    if c.logprobs is None:
        return None
    ref = torch.log_softmax(logits, -1)[torch.arange(int(c.tokens.numel())), c.tokens]
    return max_abs_error(c.logprobs.double(), ref)


@functools.lru_cache(maxsize=4)
@torch.no_grad()
def dtype_error(folder: str, dtype: torch.dtype) -> float:
    """ε for an engine returning no logprobs: the largest |log-softmax − float64 log-softmax| of
    the reference model of ``folder`` run in ``dtype`` (``out_pt``, never the engine) over every
    position of four grammar documents (24 ids each). Measured on the suite's own model, so that an
    engine's wrong tokens cannot widen their own allowance (a greedy call of the engine judged
    excused any deterministic error it made)."""
    model = load_hf_llama(folder, dtype=dtype)
    worst = 0.0
    for d in document_prompts(0, 4, max_len=24):
        seq = torch.tensor([list(d)])
        lp, lp_pt = torch.log_softmax(oracle(folder)(seq)[0], -1), torch.log_softmax(model(seq)[0].double(), -1)
        worst = max(worst, max_abs_error(lp_pt, lp))
    return worst


def calibration(engine, out: list) -> float:
    """0 where every completion of ``out`` carries logprobs (each is judged by its own measured
    error); else :func:`dtype_error` of the dtype the engine computes in."""
    if all(c.logprobs is not None for c in out):
        return 0.0
    return dtype_error(folders()["target"], engine.capabilities().dtype)


def record_excused(claim: str):
    """The conformance test's ``after``: the positions the run excused as near-ties, shown in its cell."""
    def after(run) -> None:
        seen = [o for o in run.observations if isinstance(o, dict) and "positions" in o]
        excused, positions = sum(o["excused"] for o in seen), sum(o["positions"] for o in seen)
        results.record(claim, measured=excused, bound=f"{NEAR_TIE.max_share:.0%} of {positions} per example",
                       unit=f"positions excused as near-ties of {positions}", rule=NEAR_TIE.name)
    return after


def check_greedy(c: Completion, prompt: tuple, folder: str, bound: float, what: str,
                 calibration: float = 0.0) -> int:
    """EN-1 on one completion: logprobs by :func:`check_logprobs`; every token the float64 argmax
    or a near-tie of the rule "engine-near-tie" (its float64 gap to the top within 4 times the
    engine's measured error on this completion: :func:`measured_error`, or ``calibration`` where
    it returns no logprobs). Returns the number of excused positions; raises AssertionError."""
    n = int(c.tokens.numel())
    logits = position_logits(folder, prompt, c.tokens)                          # (n, V)
    check_logprobs(c, logits, bound, what)
    eps = measured_error(c, logits)
    chosen, top = logits[torch.arange(n), c.tokens], logits.max(-1).values
    report_verdict(NEAR_TIE.judge(chosen, top, None, f"{what}: tokens not the float64 argmax",
                                  calibration if eps is None else eps)).check()
    return int((top > chosen).sum())


def check_logprobs(c: Completion, logits: torch.Tensor, bound: float, what: str) -> None:
    """EN-1 on a completion's logprobs (greedy or sampled, whatever the sampling parameters): each
    within 2·``bound`` (:func:`dtype_bound`) of the float64 log-softmax of the raw logits (n, V)
    at its chosen token; nothing where the engine gives none."""
    if c.logprobs is None:
        return
    n = int(c.tokens.numel())
    ref = torch.log_softmax(logits, -1)[torch.arange(n), c.tokens]
    check_within(c.logprobs.double(), ref, torch.full((n,), 2 * bound, dtype=torch.float64),
                 what=f"{what}: logprobs of the chosen tokens",
                 rule="EN-1: logprobs (of the raw logits) within twice the dtype rule's bound of the float64 "
                      "log-softmax").check()


def check_same(a: Completion, b: Completion, prompt: tuple, folder: str, bound: float, what: str,
               bitwise: bool = False, calibration: float = 0.0) -> tuple[bool, bool]:
    """EN-2 / EN-3 (greedy): completion ``b`` equals ``a`` (the request alone, or target-only).
    Up to their first different token; there the two tokens' float64 logits after the shared
    prefix must be a near-tie of the rule "engine-near-tie" (within 4 times the larger of the two
    completions' measured errors, or ``calibration`` where they carry no logprobs), where the
    comparison stops, unless ``bitwise`` (a declared batch-invariant engine: tokens and logprobs
    identical). ``bound`` is unused (kept for callers). Returns (excused, logprobs bitwise
    equal); raises AssertionError."""
    ta, tb = a.tokens.tolist(), b.tokens.tolist()
    first = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), None)
    same_lp = (a.logprobs is not None and b.logprobs is not None and torch.equal(a.logprobs, b.logprobs))
    if bitwise or first is None:
        check_exact(b.tokens, a.tokens, what=f"{what}: tokens").check()
        if bitwise and a.logprobs is not None:
            check_exact(b.logprobs, a.logprobs, what=f"{what}: logprobs (declared batch invariant)").check()
        return False, same_lp
    la, lb = position_logits(folder, prompt, a.tokens), position_logits(folder, prompt, b.tokens)
    errs = [e for e in (measured_error(a, la), measured_error(b, lb)) if e is not None]
    eps = max(errs) if errs else calibration
    report_verdict(NEAR_TIE.judge(la[first, tb[first]].reshape(1), la[first, ta[first]].reshape(1), None,
                                  f"{what}: tokens differ at {first} ({ta[first]} vs {tb[first]})", eps)).check()
    return True, False


def check_excused(excused: int, positions: int, what: str) -> None:
    """At most the rule's share (10 %) of an example's ``positions`` excused as near-ties."""
    report_verdict(NEAR_TIE.judge_share(excused, positions, what)).check()


def generate(engine, requests: list, p: Params) -> list[Completion]:
    """``engine.generate(requests, p)``, one request per call where the engine declares no
    batching (the laws' many-request calls are then sent one by one, as a user would)."""
    if engine.capabilities().batching:
        return engine.generate(requests, p)
    return [engine.generate([r], p)[0] for r in requests]


def dtype_bound(engine) -> float:
    """Half the allowance on ``engine``'s logprobs, by the rule of the dtype it declares (a
    claim it is held to; it excuses no token): :func:`logit_bound` for float32 and float64; for a
    16-bit dtype, half the 16-bit model rule's bound measured on the reference model run in that
    dtype (:func:`half_model_bound`)."""
    dtype = engine.capabilities().dtype
    return half_model_bound(folders()["target"], dtype) if dtype in HALF_DTYPES else logit_bound(dtype)


@functools.lru_cache(maxsize=2)
@torch.no_grad()
def half_model_bound(folder: str, dtype: torch.dtype) -> float:
    """Half the 16-bit model rule's bound (2 · error of ``out_pt`` + 4 ulp · scale) on logprobs:
    ``out_pt`` the reference model of ``folder`` run in ``dtype`` (never the engine), against
    float64, at the float64 argmax and the next token of four grammar documents (24 ids each)."""
    model = load_hf_llama(folder, dtype=dtype)
    out_ref, out_pt = [], []
    for d in document_prompts(0, 4, max_len=24):
        seq = torch.tensor([list(d)])
        lp, lp_pt = torch.log_softmax(oracle(folder)(seq)[0], -1), torch.log_softmax(model(seq)[0].double(), -1)
        at = torch.stack([lp.argmax(-1)[:-1], seq[0, 1:]])                        # (2, T - 1)
        rows = torch.arange(at.shape[1])
        out_ref.append(lp[rows, at].flatten())
        out_pt.append(lp_pt[rows, at].flatten())
    ref = torch.cat(out_ref)
    return RULES[model_rule(dtype)].judge(ref, ref, torch.cat(out_pt), "logprobs").bound / 2


def record_figure(claim: str, measured, unit: str, rule: str) -> None:
    results.record(claim, measured=measured, unit=unit, rule=rule)
