"""FlashAttention's memory: the HBM-traffic and score-memory model (claims FA-4, FA-5; lecture
001 §3, exercise 4) and the measured peak memory, linear in T (claim FA-6, on a GPU)."""
from __future__ import annotations

import pytest
import torch

from conformance import results
from conformance.tolerance import (
    assert_scalar,
)
from properties import strategies as S
from reference import attention as ref

# ----------------------------------------------------------------------------------------------
# FA-4, FA-5: the traffic and memory model (analytic)
# ----------------------------------------------------------------------------------------------


@pytest.mark.claim("FA-4")
def test_fa4_traffic_model():
    d = B = 128
    ratios = {}
    for T in (1024, 4096, 32768):
        std = sum(ref.standard_attention_traffic(T, d).values())
        fa = sum(ref.flash_attention_traffic(T, d, B).values())
        assert_scalar(std, 4 * T * d + 4 * T * T, rel=0.0, what=f"standard traffic at T={T}")
        assert_scalar(fa, 2 * T * d * (T // B) + 2 * T * d, rel=0.0, what=f"FlashAttention traffic at T={T}")
        ratios[T] = std / fa
    # the saving tends to 2x (4T^2 vs 2T^2 d/B with d = B) ...
    assert_scalar(ratios[32768], 2.0, rel=0.02, what="traffic saving at T=32K, d=B=128")
    # ... while the intermediate memory drops from O(T^2) to O(T): its ratio grows linearly in T
    mem = {T: ref.score_matrix_bytes(T, 2) / ref.flash_score_bytes(T, B, 2) for T in (1024, 4096, 32768)}
    assert_scalar(mem[32768] / mem[1024], 32.0, rel=0.0, what="score-memory ratio grows as T")
    results.record("FA-4", measured=round(ratios[32768], 3), lecture="about 2x (d = B = 128)", unit="x less HBM traffic",
                   rule="(4Td + 4T^2) / (2Td(T/B) + 2Td), counted by walking the loops",
                   per_T={str(t): round(r, 4) for t, r in ratios.items()},
                   score_memory_ratio={str(t): m for t, m in mem.items()})


@pytest.mark.claim("FA-5")
def test_fa5_exercise4_score_memory():
    T, heads, fp16 = 32 * 1024, 32, 2
    GiB, MiB = 2 ** 30, 2 ** 20
    per_head = ref.score_matrix_bytes(T, fp16)
    flash_head = ref.flash_score_bytes(T, 128, fp16)
    assert_scalar(per_head / GiB, 2.0, rel=0.0, what="S per head (GiB)")
    assert_scalar(per_head * heads / GiB, 64.0, rel=0.0, what="S per layer (GiB)")
    assert_scalar(flash_head / MiB, 8.0, rel=0.0, what="FlashAttention scores per head (MiB)")
    assert_scalar(flash_head * heads / MiB, 256.0, rel=0.0, what="FlashAttention scores per layer (MiB)")
    results.record("FA-5", measured={"S per head GB": per_head / GiB, "S per layer GB": per_head * heads / GiB,
                                     "flash per head MB": flash_head / MiB, "flash per layer MB": flash_head * heads / MiB},
                   lecture={"S per head GB": 2, "S per layer GB": 64, "flash per head MB": 8, "flash per layer MB": 256},
                   unit="bytes (GB = 2^30, MB = 2^20)", rule="T=32K, 32 heads, fp16, blocks of 128")


# ----------------------------------------------------------------------------------------------
# FA-6: memory linear in T (measured on GPU)
# ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.claim("FA-6")
@pytest.mark.parametrize("name", ["triton", "triton_splitkv", "torch"])
def test_fa6_peak_extra_memory_linear_in_T(name, device):
    from conformance import registry

    impl = {i.name: i for i in registry.builtins("attention", device)}[name]
    if impl.unavailable:
        pytest.skip(impl.unavailable)
    B, H, D = 1, 8, 64
    lengths, extra = (1024, 2048, 4096, 8192), {}
    for T in lengths:
        q, k, v = (S.randn((B, H, T, D), s, dtype=torch.bfloat16, device=device) for s in (1, 2, 3))
        impl(q, k, v, causal=True, scale=D ** -0.5)  # compile / autotune outside the measurement
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = impl(q, k, v, causal=True, scale=D ** -0.5)
        torch.cuda.synchronize()
        extra[T] = torch.cuda.max_memory_allocated() - base
        del out, q, k, v
    growth = extra[lengths[-1]] / max(extra[lengths[0]], 1)
    t_ratio = lengths[-1] / lengths[0]
    naive_scores = {T: B * H * T * T * 2 for T in lengths}
    results.record("FA-6", measured=round(growth, 2), lecture="linear in T (not T^2)",
                   bound=2 * t_ratio, unit=f"peak extra memory growth, T {lengths[0]} -> {lengths[-1]}",
                   rule=f"growth <= 2 x T ratio ({t_ratio:g}); T^2 would give {t_ratio ** 2:g}",
                   implementation_name=name, bytes={str(t): b for t, b in extra.items()},
                   naive_score_bytes={str(t): b for t, b in naive_scores.items()})
    assert growth <= 2 * t_ratio, f"peak extra memory grew {growth:.1f}x for {t_ratio:g}x longer T: {extra}"


