"""The checks of PA-3 (parallel sampling shares the prompt's blocks) and PA-5 (half a block
wasted per request), each a function of the cache or allocator count it judges:
``properties/paged_attention/test_block_allocator.py`` gives them :mod:`inference_conformance.reference.paged_attention`'s,
``properties/paged_attention/test_block_allocator_rejections.py`` known-bad ones."""
from __future__ import annotations

from typing import Callable

import torch

from inference_conformance.conformance import results
from inference_conformance.conformance.tolerance import assert_exact, assert_scalar
from inference_conformance.reference.paged_attention import PagedKVCache
from inference_conformance.reference.paged_attention.serving import lecture_trace


def slots_for_parallel_sampling(prompt: int, samples: int, output: int, block_size: int, share: bool,
                                cache_class: type = PagedKVCache) -> int:
    """Token slots a ``cache_class`` cache (a :class:`PagedKVCache` or a variant) holds once
    ``samples`` continuations of ``output`` tokens of one ``prompt``-token prompt are generated,
    with or without sharing the prompt by fork."""
    cache = cache_class(4 * samples * -(-(prompt + output) // block_size), block_size)
    if share:
        cache.new_sequence(0)
        cache.append_tokens(0, prompt)
        for s in range(1, samples):
            cache.fork(0, s)
    else:
        for s in range(samples):
            cache.new_sequence(s)
            cache.append_tokens(s, prompt)
    for _ in range(output):
        for s in range(samples):
            cache.append_tokens(s, 1)
    return cache.slots_held()


def check_pa3(cache_class: type = PagedKVCache) -> tuple[int, int]:
    """PA-3 on a paged cache class: one 512-token prompt sampled 8 times for 128 tokens with
    blocks of 16 holds 5,120 token slots unshared and 1,536 with the prompt's 32 blocks shared
    (70% saved), counted by the cache. Returns (unshared, shared)."""
    unshared = slots_for_parallel_sampling(512, 8, 128, 16, False, cache_class)
    shared = slots_for_parallel_sampling(512, 8, 128, 16, True, cache_class)
    assert_exact(torch.tensor([unshared, shared]), torch.tensor([5120, 1536]),
                 what="PA-3: token slots (unshared, shared), lecture (5120, 1536)")
    return unshared, shared


def check_pa5(waste_per_request: Callable, n: int = 4000) -> dict[int, float]:
    """PA-5 on ``waste_per_request(lengths, block_size) -> [empty slots per request]`` over
    ``n`` requests of the lecture's trace (prompt + output tokens): each request wastes exactly
    the unfilled part of its last block, (-length) mod block size, and the mean is half a block
    at blocks of 16 and 256 (band 10%: the trace's lengths are not uniform modulo 256). Returns
    the mean waste by block size."""
    lengths = [r.prompt + r.output for r in lecture_trace(n, seed=5)]
    by_block = {}
    for bs in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        w = waste_per_request(lengths, bs)
        assert_exact(torch.tensor(w), torch.tensor([(-m) % bs for m in lengths]),
                     what=f"PA-5: allocator's waste per request at block size {bs}")
        by_block[bs] = sum(w) / len(w)
    for bs in (16, 256):
        assert_scalar(by_block[bs], bs / 2, rel=0.1, what=f"PA-5: mean waste per request at block size {bs}")
    results.record("PA-5", measured=round(by_block[16], 2), lecture=8, unit="slots wasted per request, blocks of 16",
                   rule=f"{n} requests of the lecture's trace; lecture: half a block on average",
                   waste_by_block_size={str(k): round(v, 3) for k, v in by_block.items()})
    results.record("PA-5", measured=round(by_block[256], 2), lecture=128, unit="slots wasted per request, blocks of 256",
                   rule=f"{n} requests of the lecture's trace")
    return by_block
