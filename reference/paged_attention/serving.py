"""A serving simulator: a request trace replayed under three KV-cache policies with continuous
batching (claim PA-2; lecture 001 §4.1-4.3, Kwon et al. 2023 §3), and chunked prefill's effect on
the time between tokens (claim PA-8, :func:`simulate_chunked`; lecture 001 §4.5).

Model (the lecture's): all requests arrive at step 0 and wait in a FIFO queue; every step, each
running request generates one token; a request that has generated its output length leaves at
the end of that step and frees its memory (continuous batching: requests join and leave every
step). The KV budget is ``budget`` token slots. A request that has generated g tokens holds
prompt + g tokens of KV. The policies differ in what they reserve:

- ``reserve_max``: a contiguous region of prompt + ``max_output`` slots, placed first-fit in the
  budget's address space, reserved at admission for the request's lifetime;
- ``exact``: a contiguous region of prompt + the request's true output length (an oracle no
  real server has), first-fit, so the only losses are the slots of tokens not generated yet
  and external fragmentation (free space split into holes too small for the next request);
- ``paged``: blocks of ``block_size`` slots from a :class:`inference_conformance.reference.paged_attention.PagedKVCache`
  allocated as tokens arrive, so the only loss is the unfilled tail of each request's last
  block. When a running request needs a block and none is free, the most recently admitted
  running request is preempted: its blocks are freed and it goes back to the head of the queue,
  to be recomputed from scratch (its tokens are generated again; those steps count). New
  requests are admitted only while ``watermark`` of the blocks stays free and not in a step
  right after a preemption (vLLM's scheduler does both).

Admission is first-come first-served: the queue's head is admitted while it fits; a head that
does not fit blocks the queue (no overtaking). Per step the simulator reports running
requests, tokens held, slots reserved, utilisation = tokens held / budget, waste = slots
reserved / budget - utilisation, the queue length and preemptions.
"""
from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from inference_conformance.reference.paged_attention import OutOfBlocks, PagedKVCache

POLICIES = ("reserve_max", "exact", "paged")


@dataclass(frozen=True)
class Request:
    """One request: id, prompt tokens, output tokens it will generate."""

    rid: int
    prompt: int
    output: int


def lecture_trace(n: int = 400, *, prompt_min: int = 16, prompt_max: int = 512, mean_output: float = 128.0,
                  max_output: int = 1024, seed: int = 2023) -> list[Request]:
    """The lecture's trace (§4.3): ``n`` requests, prompts uniform in [prompt_min, prompt_max],
    outputs geometric (support 1, 2, ...) with mean ``mean_output``, capped at ``max_output``;
    numpy's PCG64 generator seeded with ``seed``."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(prompt_min, prompt_max + 1, size=n)
    outputs = np.minimum(rng.geometric(1.0 / mean_output, size=n), max_output)
    return [Request(i, int(p), int(o)) for i, (p, o) in enumerate(zip(prompts, outputs))]


class FirstFit:
    """A contiguous address space of ``size`` slots: first-fit allocation of extents, and
    coalescing of free neighbours on release."""

    def __init__(self, size: int):
        self.size = size
        self.holes: list[list[int]] = [[0, size]]   # sorted [start, length]

    def allocate(self, n: int) -> int | None:
        """Start of a free extent of ``n`` slots (the lowest that fits), or None."""
        for h in self.holes:
            if h[1] >= n:
                start = h[0]
                h[0] += n
                h[1] -= n
                if h[1] == 0:
                    self.holes.remove(h)
                return start
        return None

    def release(self, start: int, n: int) -> None:
        i = bisect.bisect_left([h[0] for h in self.holes], start)
        self.holes.insert(i, [start, n])
        if i + 1 < len(self.holes) and self.holes[i][0] + self.holes[i][1] == self.holes[i + 1][0]:
            self.holes[i][1] += self.holes.pop(i + 1)[1]
        if i > 0 and self.holes[i - 1][0] + self.holes[i - 1][1] == self.holes[i][0]:
            self.holes[i - 1][1] += self.holes.pop(i)[1]

    @property
    def free(self) -> int:
        return sum(h[1] for h in self.holes)

    @property
    def largest_hole(self) -> int:
        return max((h[1] for h in self.holes), default=0)


@dataclass
class StepStats:
    """One step: running requests, tokens held, slots reserved, utilisation and waste (fractions
    of the budget), queued requests, preemptions in this step, and whether the queue's head was
    refused although enough slots were free in total (external fragmentation)."""

    step: int
    running: int
    tokens_held: int
    slots_reserved: int
    utilisation: float
    waste: float
    queued: int
    preemptions: int
    fragmented: bool


@dataclass
class SimResult:
    """A whole run: its policy, budget, per-step stats, tokens generated per request (the last,
    complete run of each) and preemptions."""

    policy: str
    budget: int
    block_size: int | None
    steps: list[StepStats]
    generated: dict[int, int]
    preemptions: int
    tokens_generated: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def total_steps(self) -> int:
        return len(self.steps)

    @property
    def mean_utilisation(self) -> float:
        return float(np.mean([s.utilisation for s in self.steps]))

    @property
    def mean_waste(self) -> float:
        return float(np.mean([s.waste for s in self.steps]))

    @property
    def peak_running(self) -> int:
        return max(s.running for s in self.steps)

    @property
    def mean_running(self) -> float:
        return float(np.mean([s.running for s in self.steps]))

    def summary(self) -> dict:
        return dict(policy=self.policy, mean_utilisation=self.mean_utilisation, mean_waste=self.mean_waste,
                    peak_running=self.peak_running, mean_running=self.mean_running, total_steps=self.total_steps,
                    preemptions=self.preemptions, tokens_generated=self.tokens_generated,
                    fragmented_steps=sum(s.fragmented for s in self.steps))


@dataclass
class _Running:
    req: Request
    generated: int = 0
    start: int = -1     # contiguous policies: start of the reserved extent
    size: int = 0       # contiguous policies: reserved slots


def simulate(trace: list[Request], policy: str, *, budget: int = 32768, block_size: int = 16,
             max_output: int = 1024, watermark: float = 0.01, max_steps: int = 1_000_000) -> SimResult:
    """Replay ``trace`` under ``policy`` ("reserve_max", "exact" or "paged"); see the module
    docstring. Raises ValueError for an unknown policy, a request that can never fit the budget
    or an output above ``max_output``; RuntimeError past ``max_steps``."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    for r in trace:
        if r.output > max_output or r.output < 1 or r.prompt < 1:
            raise ValueError(f"request {r.rid}: prompt {r.prompt} and output {r.output} must be in 1..max_output")
        if r.prompt + max_output > budget:
            raise ValueError(f"request {r.rid} (prompt {r.prompt} + max output {max_output}) can never fit "
                             f"the budget of {budget} slots")
    queue: deque[_Running] = deque(_Running(r) for r in trace)
    running: list[_Running] = []
    done: dict[int, int] = {}
    steps: list[StepStats] = []
    preemptions = 0
    generated_total = 0
    space = FirstFit(budget) if policy != "paged" else None
    cache = PagedKVCache(budget // block_size, block_size) if policy == "paged" else None
    wm_blocks = int(np.ceil(watermark * (budget // block_size))) if policy == "paged" else 0
    preempted_last = False
    while queue or running:
        if len(steps) >= max_steps:
            raise RuntimeError(f"simulation did not finish within {max_steps} steps")
        # -- admission (FCFS, head-of-line)
        fragmented = False
        while queue and not (policy == "paged" and preempted_last):
            r = queue[0]
            if policy == "paged":
                need = -(-(r.req.prompt + 1) // block_size)
                if cache.allocator.num_free - need < wm_blocks and running:
                    break
                if need > cache.allocator.num_free:
                    break
                cache.new_sequence(r.req.rid)
                cache.append_tokens(r.req.rid, r.req.prompt)
            else:
                size = r.req.prompt + (max_output if policy == "reserve_max" else r.req.output)
                start = space.allocate(size)
                if start is None:
                    fragmented = space.free >= size
                    break
                r.start, r.size = start, size
            running.append(queue.popleft())
        if not running:
            raise ValueError(f"request {queue[0].req.rid} cannot be admitted into an empty budget")
        # -- paged: a slot for each running request's next token; preempt the newest on shortage
        step_preempt = 0
        if policy == "paged":
            i = 0
            while i < len(running):
                r = running[i]
                try:
                    cache.append_tokens(r.req.rid, 1)
                    i += 1
                except OutOfBlocks:
                    victim = running.pop()
                    cache.free(victim.req.rid)
                    victim.generated = 0
                    queue.appendleft(victim)
                    step_preempt += 1
                    # i stays: retry r unless it was the victim (then the loop ends)
        preemptions += step_preempt
        preempted_last = step_preempt > 0
        # -- one token for every running request
        for r in running:
            r.generated += 1
        generated_total += len(running)
        held = sum(r.req.prompt + r.generated for r in running)
        reserved = cache.slots_held() if policy == "paged" else sum(r.size for r in running)
        steps.append(StepStats(len(steps), len(running), held, reserved, held / budget, (reserved - held) / budget,
                               len(queue), step_preempt, fragmented))
        # -- finished requests leave and free their memory
        still = []
        for r in running:
            if r.generated == r.req.output:
                done[r.req.rid] = r.generated
                if policy == "paged":
                    cache.free(r.req.rid)
                else:
                    space.release(r.start, r.size)
            else:
                still.append(r)
        running = still
    return SimResult(policy, budget, block_size if policy == "paged" else None, steps, done, preemptions,
                     generated_total)


def downsample(values: list[float], n: int = 400) -> list[float]:
    """At most ``n`` values of a series, evenly spaced (first and last kept), for plots."""
    if len(values) <= n:
        return list(values)
    idx = np.linspace(0, len(values) - 1, n).round().astype(int)
    return [values[i] for i in idx]


# ----------------------------------------------------------------------------------------------
# chunked prefill (PA-8): the time between two tokens of a running request
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Arrival:
    """A request arriving at step ``at`` (it is admitted at the first step starting at or after
    it): id, prompt tokens, output tokens."""

    rid: int
    at: int
    prompt: int
    output: int


@dataclass
class ChunkedResult:
    """A run of :func:`simulate_chunked`: per step the tokens computed and its duration (the
    cost model), and per request the times its tokens came out."""

    token_budget: int | None
    step_tokens: list[int]
    step_times: list[float]
    emitted: dict[int, list[float]]

    @property
    def total_steps(self) -> int:
        return len(self.step_tokens)

    @property
    def total_time(self) -> float:
        return float(sum(self.step_times))

    def gaps(self, rids=None) -> list[float]:
        """Times between two consecutive tokens of the same request (of ``rids``; None: all)."""
        out = []
        for rid, times in self.emitted.items():
            if rids is None or rid in rids:
                out += [b - a for a, b in zip(times, times[1:])]
        return out

    def max_gap(self, rids=None) -> float:
        """The longest time between two tokens of a running request (the worst inter-token latency)."""
        return max(self.gaps(rids), default=0.0)


def simulate_chunked(trace: list[Arrival], *, token_budget: int | None, step_overhead: float = 1.0,
                     per_token: float = 1.0 / 256, max_steps: int = 1_000_000) -> ChunkedResult:
    """Continuous batching with chunked prefill (Sarathi-Serve; lecture 001 §4.5), memory ample,
    compute as the cost: a step costs ``step_overhead + per_token · tokens`` (the weights are
    read once per forward; each token computed adds its share; time in units of the overhead).

    Every step, in order: requests that have arrived join; each running request that has
    computed its prompt contributes its decode token (1 token), then the requests still in their
    prompt, in arrival order, contribute chunks of their remaining prompt while the budget lasts
    (``token_budget``; None: every remaining prompt whole in this step: unchunked prefill). A
    request that computes the last token of its prompt emits its first token at the step's end;
    every later step that computes its decode token emits one more, until ``output`` tokens.
    The clock advances by each step's cost; a step with no work (nothing arrived yet) jumps to
    the next arrival without cost. Raises ValueError for a budget below 1 or empty requests;
    RuntimeError past ``max_steps``."""
    if token_budget is not None and token_budget < 1:
        raise ValueError(f"token_budget must be >= 1 or None, got {token_budget}")
    for r in trace:
        if r.prompt < 1 or r.output < 1 or r.at < 0:
            raise ValueError(f"request {r.rid}: prompt {r.prompt}, output {r.output} must be >= 1, arrival >= 0")
    pending = sorted(trace, key=lambda r: (r.at, r.rid))
    computed: dict[int, int] = {}
    made: dict[int, int] = {}
    live: list[Arrival] = []
    emitted: dict[int, list[float]] = {r.rid: [] for r in trace}
    step_tokens, step_times = [], []
    clock, step = 0.0, 0
    while pending or live:
        if len(step_tokens) >= max_steps:
            raise RuntimeError(f"simulation did not finish within {max_steps} steps")
        while pending and pending[0].at <= step:
            r = pending.pop(0)
            live.append(r)
            computed[r.rid], made[r.rid] = 0, 0
        if not live:
            step = pending[0].at
            continue
        left = float("inf") if token_budget is None else token_budget
        plan: dict[int, int] = {}
        for r in live:                                      # decode tokens first
            if computed[r.rid] >= r.prompt and left >= 1:
                plan[r.rid] = 1
                left -= 1
        for r in live:                                      # then prompt chunks, in arrival order
            rest = r.prompt - computed[r.rid]
            if rest > 0 and left >= 1:
                plan[r.rid] = int(min(rest, left))
                left -= plan[r.rid]
        tokens = sum(plan.values())
        clock += step_overhead + per_token * tokens
        step_tokens.append(tokens)
        step_times.append(step_overhead + per_token * tokens)
        still = []
        for r in live:
            n = plan.get(r.rid, 0)
            if computed[r.rid] >= r.prompt:                 # a decode step (n = 1) or waiting (n = 0)
                made[r.rid] += n
                if n:
                    emitted[r.rid].append(clock)
            else:
                computed[r.rid] += n
                if computed[r.rid] == r.prompt:             # its prompt's last chunk: the first token
                    made[r.rid] += 1
                    emitted[r.rid].append(clock)
            if made[r.rid] < r.output:
                still.append(r)
        live = still
        step += 1
    return ChunkedResult(token_budget, step_tokens, step_times, emitted)
