"""The checks of the analytic claims AI-1..AI-7, KV-5 and KV-6's cache ratio, each a function of
the formula or model it judges, so that the same comparison that gives the claim its verdict
(``properties/roofline/test_roofline.py``, with :mod:`inference_conformance.reference.roofline` and
:data:`inference_conformance.reference.roofline.perf_model.CS336`)
can be fed a known-bad formula and shown to reject it (``properties/roofline/test_roofline_rejections.py``).

Every check raises AssertionError (the tolerance policy's message, naming the figure) when the
formula misses the lecture's figure, and records the figures it compared
(:func:`inference_conformance.conformance.results.record`) when it passes. Bands are the lectures' rounding, stated at
each comparison; none is derived from the formula under test.
"""
from __future__ import annotations

import math
from typing import Callable

from inference_conformance.conformance import results
from inference_conformance.conformance.tolerance import assert_scalar
from inference_conformance.reference.roofline import perf_model
from inference_conformance.reference import roofline as rl

GIB = 2**30
KIB = 2**10
H100, A100 = rl.ACCELERATORS["H100"], rl.ACCELERATORS["A100"]


# ------------------------------------------------------------------------- AI-1 .. AI-4: formulas
def check_ai1(matmul_intensity: Callable = rl.matmul_intensity) -> float:
    """AI-1 on ``matmul_intensity(B, D, F)`` (FLOP/byte, bf16): B = 1 with Llama 2 13B's sizes
    gives about 1 (band 0.1%: B/(1 + B/F + B/D)), CS336's 2BDF/(2BD+2DF+2BF) exactly, and at
    B = 64 with D, F = 10^6 the intensity is within B(B/D + B/F) of B, from below."""
    B, D, F = 1, 5120, 13824
    got = matmul_intensity(B, D, F)
    assert_scalar(got, 1.0, rel=1e-3, what="AI-1: B=1 matvec intensity (lecture: 1)")
    assert_scalar(got, 2 * B * D * F / (2 * B * D + 2 * D * F + 2 * B * F), rel=1e-12,
                  what="AI-1: intensity vs 2BDF/(2BD+2DF+2BF)")
    big = matmul_intensity(64, 10**6, 10**6)
    assert 64 - 64 * (64 / 10**6 + 64 / 10**6) * (1 + 1e-12) <= big < 64, \
        f"AI-1: intensity at B=64, D=F=1e6 is {big}, not just below B=64"
    results.record("AI-1", measured=got, lecture=1, unit="FLOP/byte", rule="B=1, D=5120, F=13824, bf16")
    return got


def check_ai2(gated_mlp_intensity: Callable, B: int, T: int, D0: int, F0: int) -> None:
    """AI-2 on ``gated_mlp_intensity(B, T, D, F)``: CS336's 6BTDF/(4BTD+4BTF+6DF) at (D0, F0),
    and rising towards BT, from below, as D, F grow to 10^6 x (D0, F0)."""
    lecture_form = 6 * B * T * D0 * F0 / (4 * B * T * D0 + 4 * B * T * F0 + 6 * D0 * F0)
    assert_scalar(gated_mlp_intensity(B, T, D0, F0), lecture_form, rel=1e-12,
                  what="AI-2: gated MLP intensity vs 6BTDF/(4BTD+4BTF+6DF)")
    prev = 0.0
    for c in (1, 100, 10_000, 1_000_000):
        i = gated_mlp_intensity(B, T, c * D0, c * F0)
        assert prev < i < B * T, f"AI-2: intensity {i} at D, F = {c} x ({D0}, {F0}) not rising below BT = {B * T}"
        prev = i
    assert_scalar(prev, B * T, rel=B * T / min(D0, F0) * 2e-6 + 1e-12, what="AI-2: MLP intensity -> BT")


def check_ai3(attention_intensity: Callable, S: int, B: int, D: int) -> None:
    """AI-3 on ``attention_intensity(S, T, B, D)``: S/(S+1) < 1 at generation (T = 1), S/2 at
    prefill (T = S), and the same at batch B and feature dim D as at B = D = 1."""
    gen = attention_intensity(S, 1, B, D)
    assert gen < 1, f"AI-3: generation intensity {gen} >= 1 at S={S}"
    assert_scalar(gen, S / (S + 1), rel=1e-12, what="AI-3: generation intensity vs S/(S+1)")
    assert_scalar(attention_intensity(S, S, B, D), S / 2, rel=1e-12, what="AI-3: prefill intensity vs S/2")
    assert_scalar(attention_intensity(S, 7, B, D), attention_intensity(S, 7, 1, 1), rel=1e-12,
                  what="AI-3: attention intensity independent of B, D")


def check_ai4(accelerator_intensity: Callable = rl.accelerator_intensity) -> tuple[float, float]:
    """AI-4 on ``accelerator_intensity(peak FLOP/s, bytes/s)``: H100 about 295 (989/3.35 = 295.2;
    band 0.1%, the lecture rounds to an integer), A100 156 exactly."""
    h100 = accelerator_intensity(989e12, 3.35e12)
    a100 = accelerator_intensity(312e12, 2.0e12)
    assert_scalar(h100, 295, rel=1e-3, what="AI-4: H100 accelerator intensity (lecture: 295)")
    assert_scalar(a100, 156, rel=1e-12, what="AI-4: A100 accelerator intensity (lecture: 156)")
    results.record("AI-4", measured=h100, lecture=295, unit="FLOP/byte", rule="989 TFLOP/s / 3.35 TB/s")
    results.record("AI-4", measured=a100, lecture=156, unit="FLOP/byte", rule="312 TFLOP/s / 2 TB/s")
    return h100, a100


# ---------------------------------------------------------------- AI-5 .. AI-7, KV-5, KV-6: models
def check_ai5(model: perf_model.PerfModel = perf_model.CS336) -> None:
    """AI-5 on a performance model: Llama 2 13B on an H100 against CS336's figures (parameters,
    KV bytes per sequence, B = 1 latency and throughput, the batch table's shape, B = 256 not
    fitting in 80 GB)."""
    m, bw, cap = perf_model.LLAMA2_13B, H100.bandwidth, H100.memory_bytes
    params = model.num_params(m)
    # "about 13 billion" (13,015,449,600): band 1%, the lecture gives two significant figures.
    assert_scalar(params, 13e9, rel=0.01, what="AI-5: Llama 2 13B parameters")
    kv = model.kv_bytes_per_sequence(m)
    assert_scalar(kv, 838_860_800, rel=0, what="AI-5: KV cache bytes per sequence (S=1024)")
    lat1, thr1 = model.latency_s(m, 1, bw), model.throughput(m, 1, bw)
    # "0.008 s/token": 0.0080208; band 1% (the lecture keeps one significant figure).
    assert_scalar(lat1, 0.008, rel=0.01, what="AI-5: B=1 latency")
    # "124 tokens/s": the formula gives 124.68, which rounds to 125; the lecture truncates.
    # Band 1% (0.55% off); the truncation itself is checked exactly.
    assert_scalar(thr1, 124, rel=0.01, what="AI-5: B=1 throughput")
    assert math.floor(thr1) == 124 and round(thr1) == 125, f"AI-5: B=1 throughput {thr1} is not 124.x rounding to 125"

    table = model.performance(m, [1, 16, 64, 256], H100)
    lats, thrs = [p.latency_s for p in table], [p.throughput for p in table]
    assert lats == sorted(lats) and thrs == sorted(thrs), f"AI-5: latency {lats} and throughput {thrs} must rise with B"
    gains = [(thrs[i + 1] - thrs[i]) / (table[i + 1].B - table[i].B) for i in range(len(table) - 1)]
    assert gains == sorted(gains, reverse=True), f"AI-5: throughput gains per sequence {gains} do not diminish"
    assert thrs[-1] < model.throughput_limit(m, bw), "AI-5: throughput at B=256 above its limit"
    assert all(p.bound == "memory" for p in table), "AI-5: a batch size is not memory-bound"
    p64, p256 = table[2], table[3]
    assert p64.fits and not p256.fits, f"AI-5: B=64 fits {p64.fits}, B=256 fits {p256.fits} (lecture: True, False)"
    # the verdicts do not depend on reading "80 GB" as 80e9 or 80 GiB
    assert model.fits(m, 64, 80 * GIB) and not model.fits(m, 256, 80 * GIB), "AI-5: fits in 80 GiB"
    assert model.max_batch(m, cap) == 64, f"AI-5: largest batch in 80 GB {model.max_batch(m, cap)}, not 64"

    results.record("AI-5", measured=params, lecture=13e9, unit="parameters")
    results.record("AI-5", measured=kv, lecture=838_860_800, unit="bytes/sequence")
    results.record("AI-5", measured=model.parameter_bytes(m), lecture=26e9, unit="bytes (bf16 parameters)")
    results.record("AI-5", measured=lat1, lecture=0.008, unit="s/token", rule="B=1, memory/bandwidth")
    results.record("AI-5", measured=thr1, lecture=124, unit="tokens/s",
                   rule="B=1; formula 124.68 rounds to 125, lecture truncates to 124")
    for p in table:
        results.record("AI-5", measured={"latency_s": p.latency_s, "tokens_per_s": p.throughput,
                                         "memory_GB": p.memory_bytes / 1e9, "fits_80GB": p.fits},
                       lecture={1: "0.008 s, 124 tok/s", 16: None, 64: "latency up, throughput up",
                                256: "does not fit 80 GB"}[p.B], unit="per batch size", B=p.B)


def check_ai6(model: perf_model.PerfModel = perf_model.CS336) -> None:
    """AI-6 on a performance model: Llama 2 13B with GQA K = 8 has a 5x smaller KV cache, better
    latency and throughput at B = 64, and fits B = 256 in 80 GB where MHA does not."""
    mha, bw, cap = perf_model.LLAMA2_13B, H100.bandwidth, H100.memory_bytes
    gqa = mha.with_(K=8)
    ratio = model.kv_bytes_per_sequence(mha) / model.kv_bytes_per_sequence(gqa)
    assert_scalar(ratio, 5, rel=0, what="AI-6: KV cache MHA / GQA(K=8)")
    lat_mha, lat_gqa = model.latency_s(mha, 64, bw), model.latency_s(gqa, 64, bw)
    thr_mha, thr_gqa = model.throughput(mha, 64, bw), model.throughput(gqa, 64, bw)
    assert lat_gqa < lat_mha and thr_gqa > thr_mha, "AI-6: GQA does not improve latency and throughput at B=64"
    assert model.fits(gqa, 256, cap) and not model.fits(mha, 256, cap), "AI-6: B=256 must fit with GQA only"
    results.record("AI-6", measured=ratio, lecture=5, unit="x smaller KV cache")
    results.record("AI-6", measured={"latency_s": lat_gqa, "tokens_per_s": thr_gqa},
                   lecture="better latency and throughput than MHA", unit="B=64",
                   mha={"latency_s": lat_mha, "tokens_per_s": thr_mha})
    results.record("AI-6", measured=model.memory_bytes(gqa, 256) / 1e9, lecture="B=256 fits in 80 GB",
                   bound=cap / 1e9, unit="GB at B=256", fits=True)


def check_ai7(model: perf_model.PerfModel = perf_model.CS336) -> None:
    """AI-7 (lecture 001, exercise 1) on a performance model's ``decode_bound``: 7B in fp16 on an
    A100 reads its weights in 7 ms, computes in 0.045 ms, gives about 140 tokens/s at B = 1 and
    turns compute-bound near B = 150."""
    d = model.decode_bound(7e9, A100, B=1)
    assert_scalar(d.weight_read_s, 7e-3, rel=1e-12, what="AI-7: 14 GB / 2 TB/s")
    # "0.045 ms": 1.4e10 / 312e12 = 0.04487 ms; band 1% (two significant figures).
    assert_scalar(d.compute_s, 0.045e-3, rel=0.01, what="AI-7: 2 x 7e9 / 312 TFLOP/s")
    # "about 140 tokens/s": 1 / 7 ms = 142.9; band 3% (the lecture rounds down to 140).
    assert_scalar(d.tokens_per_s, 140, rel=0.03, what="AI-7: B=1 tokens/s")
    assert d.memory_over_compute > 150, f"AI-7: memory / compute time {d.memory_over_compute} (lecture: > 150)"
    # "compute becomes the bound near B = 150": ridge 156; band 5% (the lecture says "about 150").
    assert_scalar(d.compute_bound_batch, 150, rel=0.05, what="AI-7: B where compute takes over")
    b = math.ceil(d.compute_bound_batch)
    below, above = model.decode_bound(7e9, A100, B=b - 1), model.decode_bound(7e9, A100, B=b)
    assert below.compute_s < below.weight_read_s <= above.compute_s, f"AI-7: compute does not take over at B={b}"
    results.record("AI-7", measured=d.weight_read_s * 1e3, lecture=7, unit="ms/token (weights)")
    results.record("AI-7", measured=d.compute_s * 1e3, lecture=0.045, unit="ms/token (compute)")
    results.record("AI-7", measured=d.tokens_per_s, lecture=140, unit="tokens/s at B=1")
    results.record("AI-7", measured=d.memory_over_compute, lecture="> 150", unit="memory time / compute time")
    results.record("AI-7", measured=d.compute_bound_batch, lecture=150, unit="B where compute-bound")


def check_kv5(model: perf_model.PerfModel = perf_model.CS336) -> None:
    """KV-5 (lecture 001, exercise 2) on a performance model: 60 GB of KV budget at 4K context
    serves 30 (Llama-2-7B), 120 (Llama-3-8B), 240 (Llama-3-8B, 8-bit KV) requests. The
    lecture's "60 GB" and "2 GB per request" are binary (512 KiB x 4096 = 2 GiB); with a budget
    of 60 x 10^9 bytes the answers would be 27 / 111 / 223 (recorded beside)."""
    budget = 60 * GIB
    models = {"Llama-2-7B": (perf_model.LLAMA2_7B, 30), "Llama-3-8B": (perf_model.LLAMA3_8B, 120),
              "Llama-3-8B 8-bit KV": (perf_model.LLAMA3_8B.with_(kv_bytes_per_value=1), 240)}
    for name, (m, lecture) in models.items():
        n = model.concurrent_requests(budget, m, context=4096)
        assert_scalar(n, lecture, rel=0, what=f"KV-5: {name}: requests in 60 GiB at 4K context")
        results.record("KV-5", measured=n, lecture=lecture, unit="requests", rule=name,
                       per_request_GiB=model.kv_bytes_per_sequence(m, 4096) / GIB,
                       with_60e9_bytes=model.concurrent_requests(60e9, m, context=4096))


def check_kv6_ratio(model: perf_model.PerfModel, K: int, group: int, L: int, H: int, bpv: int) -> None:
    """KV-6's cache part on a performance model: a model of N = K x group query heads stores
    ``group`` = N/K times more KV cache as MHA than with K KV heads (GQA), and N times more than
    MQA (K = 1)."""
    N = K * group
    mha = perf_model.ModelShape(S=64, D=N * H, F=4, N=N, K=N, H=H, L=L, V=8, bytes_per_value=bpv)
    gqa = mha.with_(K=K)
    assert_scalar(model.kv_bytes_per_token(mha) / model.kv_bytes_per_token(gqa), group, rel=1e-12,
                  what=f"KV-6: MHA / GQA cache (N={N}, K={K})")
    assert_scalar(model.kv_cache_ratio(N, K), group, rel=0, what="KV-6: kv_cache_ratio(N, K) vs N/K")
    assert_scalar(model.kv_bytes_per_token(mha), model.kv_bytes_per_token(mha.with_(K=1)) * N, rel=0,
                  what=f"KV-6: MHA cache vs N={N} x MQA cache")
