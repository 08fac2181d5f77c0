"""The checks of FA-1, FA-2 (the lecture's worked numbers), FA-4, FA-5 (the traffic and memory
model) and FA-6 (peak memory linear in T), each a function of the softmax, formula or
measurements it judges: ``properties/attention/test_softmax.py`` and ``properties/attention/test_attention_memory.py``
give them the reference's functions (and, for FA-6, the GPU's measured bytes);
``properties/attention/test_attention_rejections.py`` gives them known-bad ones.

Every check raises AssertionError with a message naming the figure it missed; none derives a
bound from the thing it measures.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from hypothesis import strategies as st

from inference_conformance.conformance.tolerance import assert_exact, assert_scalar
from inference_conformance.properties import strategies

LECTURE_SCORES = [1000.0, 999.0, 998.0, 10.0]
GIB, MIB = 2**30, 2**20


# -------------------------------------------------------------------------------------- FA-1, FA-2
def check_fa1(softmax_textbook: Callable, softmax: Callable, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """FA-1 on two softmaxes of the last dim: the textbook one overflows (nan) on the lecture's
    [1000, 999, 998, 10] and the max-subtracted one gives [0.665, 0.245, 0.090, 0.000] (to the
    lecture's 3 decimals) summing to 1. Returns (textbook output, stable output)."""
    x = torch.tensor(LECTURE_SCORES, dtype=dtype)
    naive = softmax_textbook(x)
    assert torch.isnan(naive[:3]).all(), f"FA-1: textbook softmax of {LECTURE_SCORES} should overflow, got {naive}"
    p = softmax(x)
    lecture = [0.665, 0.245, 0.090, 0.000]
    assert torch.isfinite(p).all(), f"FA-1: max-subtracted softmax of {LECTURE_SCORES} is not finite: {p}"
    assert_exact(torch.round(p.double() * 1000).long(), torch.tensor([round(v * 1000) for v in lecture]),
                 what="FA-1: max-subtracted softmax rounded to 3 decimals")
    assert abs(float(p.sum()) - 1.0) < 1e-6, f"FA-1: probabilities sum to {float(p.sum())}"
    return naive, p


def check_fa2_two_chunks(trace: Callable, softmax_stats: Callable) -> tuple[float, float]:
    """FA-2 on ``trace(x, chunk sizes) -> [(m, l) after each chunk]``: the lecture's example in
    two chunks ends at m = 1000, l = 1.503215 (band 5e-7: its 7 digits), the one-pass (m, l).
    Returns the final (m, l)."""
    (_, _), (m2, l2) = trace(LECTURE_SCORES, [2, 2])
    m_one, l_one = softmax_stats(torch.tensor(LECTURE_SCORES, dtype=torch.float64))
    assert_exact(torch.tensor(m2, dtype=torch.float64), m_one, what="FA-2: online m vs one-pass max")
    assert_scalar(l2, float(l_one), rel=1e-14, what="FA-2: online l vs one-pass l")
    assert_scalar(m2, 1000.0, rel=0.0, what="FA-2: m after two chunks")
    assert_scalar(l2, 1.503215, rel=5e-7, what="FA-2: l after two chunks (lecture: 1.503215)")
    return m2, l2


def check_fa2_exercise3(trace: Callable, softmax_stats: Callable) -> list[tuple[float, float]]:
    """FA-2 (exercise 3) on ``trace``: [2, 1] then [3] gives m = 2, l = 1.368, then m = 3,
    l = 1.503 (band 5e-4: the lecture's 3 decimals), the last l equal to the one-pass l."""
    got = trace([2.0, 1.0, 3.0], [2, 1])
    lecture = [(2.0, 1.368), (3.0, 1.503)]
    for i, ((m, l), (m_lec, l_lec)) in enumerate(zip(got, lecture)):
        assert_scalar(m, m_lec, rel=0.0, what=f"FA-2: m after chunk {i + 1} (exercise 3)")
        assert_scalar(l, l_lec, rel=5e-4, what=f"FA-2: l after chunk {i + 1} (exercise 3, lecture rounds to 3 decimals)")
    _, l_one = softmax_stats(torch.tensor([2.0, 1.0, 3.0], dtype=torch.float64))
    assert_scalar(got[-1][1], float(l_one), rel=1e-14, what="FA-2: online l vs one-pass l (exercise 3)")
    return got


# -------------------------------------------------------------------------------------- FA-4, FA-5
def check_fa4(standard_traffic: Callable, flash_traffic: Callable, score_bytes: Callable,
              flash_score_bytes: Callable) -> tuple[dict, dict]:
    """FA-4 on the traffic model (elements per head: ``standard_traffic(T, d)``,
    ``flash_traffic(T, d, block)``, dicts of counts) and the score memory (``score_bytes(T,
    bytes per value)``, ``flash_score_bytes(T, block, bytes per value)``): standard 4Td + 4T²,
    FlashAttention-2 2Td(T/B) + 2Td, a saving of about 2x at d = B = 128 (band 2%, T = 32K),
    while the score memory's ratio grows as T. Returns (traffic ratio by T, memory ratio by T)."""
    d = B = 128
    ratios = {}
    for T in (1024, 4096, 32768):
        std = sum(standard_traffic(T, d).values())
        fa = sum(flash_traffic(T, d, B).values())
        assert_scalar(std, 4 * T * d + 4 * T * T, rel=0.0, what=f"FA-4: standard traffic at T={T} vs 4Td + 4T^2")
        assert_scalar(fa, 2 * T * d * (T // B) + 2 * T * d, rel=0.0,
                      what=f"FA-4: FlashAttention traffic at T={T} vs 2Td(T/B) + 2Td")
        ratios[T] = std / fa
    assert_scalar(ratios[32768], 2.0, rel=0.02, what="FA-4: traffic saving at T=32K, d=B=128 (lecture: about 2x)")
    mem = {T: score_bytes(T, 2) / flash_score_bytes(T, B, 2) for T in (1024, 4096, 32768)}
    assert_scalar(mem[32768] / mem[1024], 32.0, rel=0.0, what="FA-4: score-memory ratio grows as T")
    return ratios, mem


def check_fa5(score_bytes: Callable, flash_score_bytes: Callable) -> dict:
    """FA-5 (exercise 4) on the score memory: T = 32K, 32 heads, fp16: the score matrix is 2 GB
    per head and 64 GB per layer, FlashAttention with blocks of 128 holds 8 MB per head and 256 MB
    per layer (GB = 2^30, MB = 2^20, as the lecture's figures are). Returns the four figures."""
    T, heads, fp16 = 32 * 1024, 32, 2
    per_head = score_bytes(T, fp16)
    flash_head = flash_score_bytes(T, 128, fp16)
    assert_scalar(per_head / GIB, 2.0, rel=0.0, what="FA-5: S per head (GiB)")
    assert_scalar(per_head * heads / GIB, 64.0, rel=0.0, what="FA-5: S per layer (GiB)")
    assert_scalar(flash_head / MIB, 8.0, rel=0.0, what="FA-5: FlashAttention scores per head (MiB)")
    assert_scalar(flash_head * heads / MIB, 256.0, rel=0.0, what="FA-5: FlashAttention scores per layer (MiB)")
    return {"S per head GB": per_head / GIB, "S per layer GB": per_head * heads / GIB,
            "flash per head MB": flash_head / MIB, "flash per layer MB": flash_head * heads / MIB}


# -------------------------------------------------------------------------------------------- FA-6
def check_fa6(extra_bytes: dict[int, int]) -> float:
    """FA-6's bound on measured peak extra memory (bytes above the inputs, by T): from the
    shortest to the longest T it grows at most 2x the ratio of the lengths (linear in T with
    room for allocator rounding; T² would give the square). Returns the growth. Raises
    ValueError with fewer than two lengths."""
    if len(extra_bytes) < 2:
        raise ValueError(f"extra_bytes must hold at least two lengths, got {sorted(extra_bytes)}")
    lo, hi = min(extra_bytes), max(extra_bytes)
    growth = extra_bytes[hi] / max(extra_bytes[lo], 1)
    t_ratio = hi / lo
    assert growth <= 2 * t_ratio, (f"FA-6: peak extra memory grew {growth:.1f}x for {t_ratio:g}x longer T "
                                   f"(bound 2 x {t_ratio:g}): {extra_bytes}")
    return growth


@st.composite
def score_rows(draw):
    """(rows, n) float64 scores: normal, huge (±1e4..1e6) and -inf entries; every row keeps at
    least one finite entry. Returns (x, chunk sizes)."""
    rows = draw(st.integers(1, 4))
    n = draw(st.integers(1, 64))
    seed = draw(strategies.seeds)
    spread = draw(st.sampled_from([1.0, 30.0, 1e4, 1e6]))
    x = strategies.randn((rows, n), seed, scale=spread)
    kinds = draw(st.lists(st.sampled_from(["keep", "neginf", "huge", "tiny"]), min_size=n, max_size=n))
    for j, kind in enumerate(kinds):
        if kind == "neginf":
            x[:, j] = -math.inf
        elif kind == "huge":
            x[:, j] = x[:, j].sign() * 1e5 + x[:, j] * 1e-3
        elif kind == "tiny":
            x[:, j] = -1e6
    keep = draw(st.integers(0, n - 1))
    if torch.isneginf(x[:, keep]).any():
        x[:, keep] = strategies.randn((rows,), seed + 1)
    sizes, left = [], n
    while left:
        c = draw(st.integers(1, left))
        sizes.append(c)
        left -= c
    return x, sizes
