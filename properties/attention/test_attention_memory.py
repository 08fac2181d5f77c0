"""FlashAttention's memory: the HBM-traffic and score-memory model (claims FA-4, FA-5; lecture
001 §3, exercise 4) and the measured peak memory, linear in T (claim FA-6, on a GPU)."""
from __future__ import annotations

import pytest
import torch

from inference_conformance.conformance import results
from inference_conformance.properties import strategies
from inference_conformance.properties.attention.flash_cases import check_fa4, check_fa5, check_fa6
from inference_conformance.reference import attention as ref

pytestmark = pytest.mark.suite_own("the lecture's memory model (FA-4, FA-5: arithmetic) and the suite's kernel's measured peak memory "
                                   "(FA-6)")

# ----------------------------------------------------------------------------------------------
# FA-4, FA-5: the traffic and memory model (analytic)
# ----------------------------------------------------------------------------------------------


@pytest.mark.claim("FA-4")
def test_fa4_traffic_model():
    ratios, mem = check_fa4(ref.standard_attention_traffic, ref.flash_attention_traffic, ref.score_matrix_bytes,
                            ref.flash_score_bytes)
    results.record("FA-4", measured=round(ratios[32768], 3), lecture="about 2x (d = B = 128)", unit="x less HBM traffic",
                   rule="(4Td + 4T^2) / (2Td(T/B) + 2Td), counted by walking the loops",
                   per_T={str(t): round(r, 4) for t, r in ratios.items()},
                   score_memory_ratio={str(t): m for t, m in mem.items()})


@pytest.mark.claim("FA-5")
def test_fa5_exercise4_score_memory():
    figures = check_fa5(ref.score_matrix_bytes, ref.flash_score_bytes)
    results.record("FA-5", measured=figures,
                   lecture={"S per head GB": 2, "S per layer GB": 64, "flash per head MB": 8, "flash per layer MB": 256},
                   unit="bytes (GB = 2^30, MB = 2^20)", rule="T=32K, 32 heads, fp16, blocks of 128")


# ----------------------------------------------------------------------------------------------
# FA-6: memory linear in T (measured on GPU)
# ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.claim("FA-6")
@pytest.mark.parametrize("name", ["triton", "triton_splitkv", "torch"])
def test_fa6_peak_extra_memory_linear_in_T(name, device):
    from inference_conformance.conformance import registry

    impl = {i.name: i for i in registry.builtins("attention", device)}[name]
    if impl.unavailable:
        pytest.skip(impl.unavailable)
    B, H, D = 1, 8, 64
    lengths, extra = (1024, 2048, 4096, 8192), {}
    for T in lengths:
        q, k, v = (strategies.randn((B, H, T, D), s, dtype=torch.bfloat16, device=device) for s in (1, 2, 3))
        impl(q, k, v, causal=True, scale=D ** -0.5)  # compile / autotune outside the measurement
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = impl(q, k, v, causal=True, scale=D ** -0.5)
        torch.cuda.synchronize()
        extra[T] = torch.cuda.max_memory_allocated() - base
        del out, q, k, v
    t_ratio = lengths[-1] / lengths[0]
    naive_scores = {T: B * H * T * T * 2 for T in lengths}
    growth = extra[lengths[-1]] / max(extra[lengths[0]], 1)
    results.record("FA-6", measured=round(growth, 2), lecture="linear in T (not T^2)",
                   bound=2 * t_ratio, unit=f"peak extra memory growth, T {lengths[0]} -> {lengths[-1]}",
                   rule=f"growth <= 2 x T ratio ({t_ratio:g}); T^2 would give {t_ratio ** 2:g}",
                   implementation_name=name, bytes={str(t): b for t, b in extra.items()},
                   naive_score_bytes={str(t): b for t, b in naive_scores.items()})
    check_fa6(extra)
