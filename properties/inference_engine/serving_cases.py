"""What the serve laws share (``properties/inference_engine/laws/serving.py``; claims PA-6, PA-7,
PA-8 for a whole engine): the schedules (the paged engine's workloads, ``properties/paged_attention/
engine_cases.py`` and ``engine_pairs_cases.py``, as :class:`Arrival` / :class:`Fork` entries), one
``serve`` call and the check of every completion it returns against the request alone; and
PA-7's law (:data:`PA7`), which ``tests/test_serve_accounting.py`` also runs: outputs judged in
every example, the accounting where the engine reports its counts, "partial" where it never could.

Oracle: a greedy request's tokens are the float64 reference's, teacher-forced (EN-1's check: a token
that is not the float64 argmax is excused only within twice the engine dtype's bound); a sampled one
(and a Fork's continuation) exactly the tokens the same engine's ``generate`` gives the request
alone with the same seed (a float32 engine's batch roundoff moves a draw across a boundary with a
probability of the order of its roundoff, ~1e-6 per token).
"""
from __future__ import annotations

from inference_conformance.conformance.contracts.inference_engine import Arrival, Fork, Request
from inference_conformance.conformance.laws import refusal
from inference_conformance.conformance.outcomes import unsupported
from inference_conformance.conformance.tolerance import check_exact
from inference_conformance.properties.inference_engine import cases
from inference_conformance.properties.paged_attention.engine_cases import (  # noqa: F401 (the laws' inputs)
    DIFFERENT_PREFIXES,
    LONG_PROMPT,
    PREEMPTING,
    SYSTEM,
    Req,
    shared_prefix_workloads,
    workloads,
)
from inference_conformance.properties.paged_attention.engine_pairs_cases import (  # noqa: F401
    FEATURES,
    PAIRS,
    PINNED_REQS,
    Combo,
    combos,
    pinned,
)

#: The fork's child: its id, the parent's tokens it starts after (2: on the pinned 18-token prompt
#: in blocks of 3 the fork shares a partly filled block, so the first write after it copies),
#: its seed and temperature.
CHILD, FORK_AFTER, FORK_SEED, FORK_TEMPERATURE = "child", 2, 777, 1.0


def schedule(reqs, fork: bool = False) -> list:
    """Arrivals (ids 0.., at their steps) of ``reqs`` (:class:`Req`; temperatures are the call's),
    and with ``fork`` request 0's child after its first two tokens, sampled at temperature 1."""
    out = [Arrival(i, Request(tuple(r.prompt), r.max_new, r.seed), r.arrival) for i, r in enumerate(reqs)]
    if fork and reqs[0].max_new > FORK_AFTER:
        out.append(Fork(CHILD, 0, FORK_AFTER, FORK_SEED, FORK_TEMPERATURE))
    return out


def blocks_for(reqs, block_size: int) -> list[int]:
    """Blocks each request holds at its end."""
    return [-(-(len(r.prompt) + r.max_new) // block_size) for r in reqs]


def pool(run, **kw) -> dict:
    """``kw`` (block_size, kv_blocks) where the engine takes a KV pool ("kv_pool"), else none."""
    return kw if "kv_pool" in run.impl.capabilities().serving else {}


def serve(run, sched: list, what: str, **kw) -> dict:
    """``run.impl.serve(sched, params(**kw))``, a refusal ending the example as unsupported; an
    engine declaring no ``serve`` at all ends the test as unsupported at once (no example could run)."""
    if not run.impl.capabilities().serving:
        unsupported(f"serve with {what}: the engine declares no serve (Capabilities.serving is empty)")
    with refusal(run, f"serve with {what}"):
        return run.impl.serve(sched, cases.params(**kw))


def check_served(run, sched: list, out: dict, temperature: float, what: str) -> int:
    """Every entry of ``sched`` got what it gets alone (the module docstring's oracle), and where
    the engine reports logprobs, a sampled request's and a fork's are those of the float64 model
    after the tokens it holds (EN-1's rule: a K/V slot another request overwrote shows there even
    where the sampled tokens agree); returns the greedy positions excused as near-ties. Raises
    AssertionError (the tolerance verdict)."""
    eng, bound, folder = run.impl, cases.dtype_bound(run.impl), cases.folders()["target"]
    missing = sorted(str(e.id) for e in sched if e.id not in out)
    assert not missing, f"serve returned no completion for {missing} ({what})"
    excused = 0
    for e in sched:
        c = out[e.id]
        if isinstance(e, Arrival):
            r, t, lead = e.request, temperature, ()
            check_exact(c.tokens.new_tensor([c.tokens.numel()]), c.tokens.new_tensor([r.max_new_tokens]),
                        what=f"request {e.id}: number of tokens ({what})").check()
        else:
            parent = next(a for a in sched if isinstance(a, Arrival) and a.id == e.parent)
            lead = tuple(out[e.parent].tokens[:e.after].tolist())
            check_exact(c.tokens[:e.after], out[e.parent].tokens[:e.after],
                        what=f"fork {e.id}: the parent's first {e.after} tokens ({what})").check()
            r = Request(parent.request.prompt + lead, parent.request.max_new_tokens - e.after, e.seed)
            t, c = e.temperature, type(c)(c.tokens[e.after:], None if c.logprobs is None else c.logprobs[e.after:])
        label = f"request {e.id} (prompt {len(r.prompt)}, {r.max_new_tokens} new, T={t}) served with {what} vs alone"
        if t == 0:
            excused += cases.check_greedy(c, r.prompt, folder, bound, label)
        else:
            with refusal(run, "sampling a request alone"):
                alone = eng.generate([r], cases.params(temperature=t))[0]
            check_exact(c.tokens, alone.tokens, what=label).check()
            cases.check_logprobs(c, cases.position_logits(folder, r.prompt, c.tokens), bound, label)
    return excused


def check_computed_once(out: dict, sched: list, what: str) -> str:
    """PA-7's accounting where the engine reports it ("stats") and preempted nothing: each
    Arrival computed every position of prompt and output but the last, less those it reused
    from the prefix cache (a cached block computed again counts twice). Returns "" where the
    check ran, else why it could not (no counts, or a preemption: recomputation is the engine's
    choice). Raises AssertionError (the tolerance verdict) for a position computed twice or never."""
    arrivals = [e for e in sched if isinstance(e, Arrival)]
    got = [out[e.id] for e in arrivals]
    if any(c.computed_tokens is None or c.cached_tokens is None or c.preemptions is None for c in got):
        return ('the engine reports no per-request counts: no "stats" in Capabilities.serving, '
                "Completion.computed_tokens / cached_tokens / preemptions None")
    if any(c.preemptions for c in out.values()):
        return "the engine preempted a request (what it recomputes is its choice)"
    computed = [c.computed_tokens + c.cached_tokens for c in got]
    want = [len(e.request.prompt) + e.request.max_new_tokens - 1 for e in arrivals]
    check_exact(c_t(computed), c_t(want), what=f"computed + cached tokens per request ({what}): each position "
                                              "computed once").check()
    return ""


def c_t(xs):
    import torch

    return torch.tensor(xs, dtype=torch.int64)


#: Four requests with one 12-token system prompt arriving one after another (4 blocks of 3 reused).
SHARED_SYSTEM = tuple(Req(SYSTEM + (20 + i, 21 + i), 2, 3 * i, 0.0, i) for i in range(4))
#: PA-7's second half, which only an engine reporting its counts ("stats") lets the law check.
COMPUTED_ONCE = "the accounting (each position computed once)"
