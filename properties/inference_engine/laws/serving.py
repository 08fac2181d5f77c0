"""The serve laws, over every registered engine (claims PA-6, PA-7, PA-8 for a whole engine; the
contract's ``serve``), each rejecting its engines of the zoo (``properties/inference_engine/zoo.py``).
An engine without ``serve`` (or without the part a law uses) refuses: "unsupported", never a pass.

- PA-6 (:func:`law_serve_arrivals_preemption`): requests arriving at drawn steps, of drawn prompt
  and output lengths, in a KV pool of drawn block size holding the largest request and a few
  blocks more (the engine must preempt and recompute; an engine without "kv_pool" runs its own
  pool: arrivals only), greedy or sampled: every request gets what it gets alone
  (``serving_cases.py``'s oracle). Elsewhere too the pool is set only where the engine takes it,
  except for the pairs with preemption (refused without it).
- PA-7 (:func:`law_serve_prefix_cache`, whose law ``tests/test_serve_accounting.py`` runs too):
  requests sharing a system prompt (some an earlier turn) or equal tokens after different prefixes,
  with the prefix cache: every request gets what it gets alone; where the engine reports its counts,
  each position is computed once (computed + cached = prompt + output - 1 per request). A run in
  which no example could check the counts (an engine without "stats", or preempting in every
  example) is "partial", naming why, never a plain pass; the outputs are judged all the same.
- PA-8, the engine half (:func:`law_serve_chunked`): a token budget per step (chunked prefill)
  at any budget, arrivals and block size: every request gets what it gets alone.
- PA-6..PA-8 combined (:func:`law_serve_features_combined`): arrivals in every example and two or
  more of prefix cache, chunk budget, copy-on-write fork and preemption: every request and the
  forked child get what they get alone; a bug between two features passes the laws of one (the
  engine publishing a prefix block before its chunk is computed).
"""
from __future__ import annotations

from hypothesis import strategies as st

from inference_conformance.conformance.laws import Kills, Law
from inference_conformance.properties.inference_engine import serving_cases

SEEDS = st.integers(0, 2 ** 16)
_FEW = dict(params=("device",), max_examples=lambda n: max(1, n // 10))

#: The paged engine's pinned workloads (``properties/paged_attention/engine_cases.py``).
PREEMPTING, DIFFERENT_PREFIXES, LONG_PROMPT = serving_cases.PREEMPTING, serving_cases.DIFFERENT_PREFIXES, serving_cases.LONG_PROMPT


def law_serve_arrivals_preemption(run, device, reqs, block_size, slack, sampled):
    """PA-6: arrivals and preemption in a small pool; every request as alone."""
    t = 1.0 if sampled else 0.0
    pool = max(serving_cases.blocks_for(reqs, block_size)) + slack
    kw = serving_cases.pool(run, block_size=block_size, kv_blocks=pool)
    what = f"arrivals, {pool} blocks of {block_size}" if kw else "arrivals (the engine's own KV pool)"
    sched = serving_cases.schedule(reqs)
    out = serving_cases.serve(run, sched, what, temperature=t, **kw)
    serving_cases.check_served(run, sched, out, t, what)
    run.observe({"preemptions": sum(c.preemptions or 0 for c in out.values())})


def law_serve_chunked(run, device, reqs, budget, block_size, sampled):
    """PA-8 (engine half): a token budget per step; every request as alone."""
    t = 1.0 if sampled else 0.0
    what = f"chunked prefill, budget {budget}, blocks of {block_size}"
    sched = serving_cases.schedule(reqs)
    pool = serving_cases.pool(run, block_size=block_size, kv_blocks=2 * sum(serving_cases.blocks_for(reqs, block_size)) + 2)
    out = serving_cases.serve(run, sched, what, temperature=t, chunked_prefill=budget, **pool)
    serving_cases.check_served(run, sched, out, t, what)


def law_serve_features_combined(run, device, combo):
    """PA-6..PA-8 combined: arrivals with two or more of prefix cache, budget, fork, preemption."""
    kw = combo.engine_kw()
    feats = " + ".join(sorted(combo.features))
    sched = serving_cases.schedule(combo.reqs, fork="fork" in combo.features)
    pool = dict(block_size=kw["block_size"], kv_blocks=kw["num_blocks"])   # preemption needs it: else refused
    pool = pool if "preemption" in combo.features else serving_cases.pool(run, **pool)
    out = serving_cases.serve(run, sched, feats, prefix_caching=kw["prefix_cache"], chunked_prefill=kw["max_num_batched_tokens"],
                  **pool)
    serving_cases.check_served(run, sched, out, 0.0, feats)
    run.observe({"features": tuple(sorted(combo.features))})


def law_serve_prefix_cache(run, device, reqs):
    """PA-7: with the prefix cache every request as alone; each position computed once."""
    sched = serving_cases.schedule(reqs)
    # blocks of 3 where the engine takes a pool (the workloads' shared prefixes are 4 such blocks)
    out = serving_cases.serve(run, sched, "the prefix cache", prefix_caching=True, **serving_cases.pool(run, block_size=3))
    serving_cases.check_served(run, sched, out, 0.0, "the prefix cache")
    unchecked = serving_cases.check_computed_once(out, sched, "the prefix cache")
    if unchecked:   # no example that checked it: the run is partial, never a plain pass
        run.uncheck(serving_cases.COMPUTED_ONCE, unchecked)
    run.observe({"computed_once_checked": not unchecked, "cached": sum(c.cached_tokens or 0 for c in out.values())})


PA6 = Law(claim="PA-6", technique="inference_engine", body=law_serve_arrivals_preemption,
          given={"reqs": serving_cases.workloads(), "block_size": st.integers(1, 4), "slack": st.integers(0, 4),
                 "sampled": st.booleans()},
          examples=(dict(reqs=PREEMPTING, block_size=2, slack=0, sampled=False),),
          kills=(Kills(("query_misses_its_own_token",)),), **_FEW,
    test="test_pa6_serve_arrivals_preemption",
    zoo_tests=("test_pa6_serve_zoo_rejected",))
PA8 = Law(claim="PA-8", technique="inference_engine", body=law_serve_chunked,
          given={"reqs": serving_cases.workloads(max_requests=4, max_prompt=20), "budget": st.integers(1, 10),
                 "block_size": st.integers(1, 5), "sampled": st.booleans()},
          examples=(dict(reqs=LONG_PROMPT, budget=4, block_size=3, sampled=False),),
          kills=(Kills(("chunk_kv_written_after_attention",)),), **_FEW,
    test="test_pa8_serve_chunked",
    zoo_tests=("test_pa8_serve_zoo_rejected",))
PAIRS = Law(claim="PA-7", claims=("PA-6", "PA-7", "PA-8"), technique="inference_engine",
            body=law_serve_features_combined, given={"combo": serving_cases.combos()},
            examples=tuple(dict(combo=c) for c in serving_cases.pinned()),
            kills=(Kills(("prefix_published_before_computed", "fork_writes_into_the_shared_block")),), **_FEW,
    test="test_serve_features_combined",
    zoo_tests=("test_serve_features_combined_zoo_rejected",))

PA7 = Law(claim="PA-7", technique="inference_engine", body=law_serve_prefix_cache,
          given={"reqs": serving_cases.shared_prefix_workloads()},
          examples=(dict(reqs=serving_cases.DIFFERENT_PREFIXES), dict(reqs=serving_cases.SHARED_SYSTEM)),
          kills=(Kills(("stale_prefix",)),), params=("device",), max_examples=lambda n: max(1, n // 10),
    test="test_pa7_serve_prefix_cache",
    zoo_tests=("test_pa7_serve_zoo_rejected",))
