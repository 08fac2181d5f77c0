"""Attention timings: prefill (Triton FlashAttention vs standard attention vs PyTorch SDPA) and
decode (split-KV vs unsplit Triton kernels, SDPA, standard attention).

Each test times its backend and, in the same run, PyTorch's ``scaled_dot_product_attention``
(and for Triton decode the unsplit kernel) with ``time.perf_counter`` medians, the device
synchronised, so the ratios are recorded even when pytest-benchmark is disabled (the default
run); the ``benchmark`` fixture times the backend for the history. extra_info carries the
median latency, TFLOP/s (4·B·Hq·Tq·Tk·D, halved when causal: ``flops`` per call), the ratio to
SDPA and the claim id. On the CPU, Triton rows are skipped (the interpreter is for correctness,
its timings mean nothing) and the others run small. With ``--impl attention=module:attr`` the
rows ``impl``, ``impl2``, ... time the outside implementations instead (extra_info
``implementation``: the target; ``inference_conformance.conformance.plugin.bench_backends``).

Goals for the report (not asserted): prefill bf16, head dim 128, T >= 1k: Triton >= 1.0x SDPA;
decode with B·Hq <= 32 and Tk >= 16k: split-KV >= 3x the unsplit kernel (claim FA-7). Lecture
001 §3.4: FlashAttention measured 2-4x faster than standard attention (claim FA-4's context).
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.benchmarks.timing import median_seconds, paired_ratios, ratio_estimate, rounds, trend_fields
from inference_conformance.conformance import registry, results
from inference_conformance.conformance.contracts.attention import flops
from inference_conformance.conformance.bench_rows import bench_backends, outside_backends, outside_info, outside_refusals
from inference_conformance.properties.strategies import randn
from inference_conformance.reference.attention import attention_naive

BACKENDS = ("naive", "torch", "triton")
#: Prefill lengths: GPU (the FlashAttention papers' range) and CPU (small, CI smoke).
PREFILL_T = {"cuda": (512, 1024, 2048, 4096, 8192, 16384), "cpu": (128, 512)}
#: Standard attention materialises B·Hq·T² scores: skip it past this many score bytes.
NAIVE_MAX_SCORE_BYTES = 8 * 2 ** 30
DECODE_TK = {"cuda": (4096, 16384, 65536), "cpu": (2048,)}
DECODE_BH = {"cuda": ((1, 8), (1, 32), (8, 32)), "cpu": ((1, 8),)}




def _attention_fn(backend: str, device: str):
    outside = outside_backends("attention")
    if backend in outside:
        return outside[backend]
    if backend == "naive":
        return attention_naive
    if backend.startswith("triton") and device != "cuda":
        pytest.skip("Triton runs under the interpreter on the CPU: its timings mean nothing (use --device cuda)")
    impl = {i.name: i for i in registry.builtins("attention", device)}[backend]
    if impl.unavailable:
        pytest.skip(impl.unavailable)
    return impl


def _inputs(B, Hq, Tq, Tk, D, dtype, device):
    q = randn((B, Hq, Tq, D), 1, dtype=dtype, device=device)
    k = randn((B, Hq, Tk, D), 2, dtype=dtype, device=device)
    v = randn((B, Hq, Tk, D), 3, dtype=dtype, device=device)
    return q, k, v


def pytest_generate_tests(metafunc):
    """Sizes per device (chosen by --device, known only after the plugin's configure)."""
    from inference_conformance.conformance.device import current_device

    device = current_device()
    name = metafunc.definition.name
    if name == "test_bench_prefill":
        metafunc.parametrize("T", PREFILL_T[device])
    elif name == "test_bench_decode":
        metafunc.parametrize("Tk", DECODE_TK[device])
        metafunc.parametrize("BH", DECODE_BH[device], ids=[f"B{b}H{h}" for b, h in DECODE_BH[device]])


def _dtype(device):
    return torch.bfloat16 if device == "cuda" else torch.float32


# ----------------------------------------------------------------------------------- prefill
@pytest.mark.claim("FA-4")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("backend", bench_backends("attention", BACKENDS))
def test_bench_prefill(benchmark, device, backend, T, D, causal):
    fn = _attention_fn(backend, device)
    dtype = _dtype(device)
    # the FlashAttention papers' setting: 16k tokens per batch, hidden 2048 (CPU: one small batch)
    B, Hq = (max(1, 16384 // T), 2048 // D) if device == "cuda" else (1, 4)
    if backend == "naive" and B * Hq * T * T * dtype.itemsize > NAIVE_MAX_SCORE_BYTES:
        pytest.skip(f"standard attention would materialise {B * Hq * T * T * dtype.itemsize / 2 ** 30:.0f} GiB of scores")
    q, k, v = _inputs(B, Hq, T, T, D, dtype, device)
    scale = D ** -0.5
    sdpa = _attention_fn("torch", device)
    repeats = 3 if benchmark.disabled else 10

    def run():
        return fn(q, k, v, causal=causal, scale=scale)

    with outside_refusals("attention", backend):  # an outside refusal is "unsupported"
        t = median_seconds(run, device, repeats)
    t_sdpa = t if backend == "torch" else median_seconds(lambda: sdpa(q, k, v, causal=causal, scale=scale),
                                                           device, repeats)
    f = flops(B, Hq, T, T, D, causal)
    info = dict(claim="FA-4", technique="attention", backend=backend, device=device, dtype=str(dtype).replace("torch.", ""),
                B=B, Hq=Hq, T=T, D=D, causal=causal, flops=f, median_s=t, tflops=f / t / 1e12,
                sdpa_median_s=t_sdpa, speed_vs_sdpa=t_sdpa / t, **outside_info("attention", backend))
    if backend == "triton" and device == "cuda":
        info["goal"] = "bf16, D=128, T>=1k: speed_vs_sdpa >= 1.0" if D == 128 and T >= 1024 else ""
    results.bench_info(benchmark, **info)
    benchmark.pedantic(run, rounds=rounds(benchmark, t, repeats), warmup_rounds=0)
    if backend == "triton":
        # the lecture compares with standard attention: time the naive backend in the same run
        if B * Hq * T * T * dtype.itemsize > NAIVE_MAX_SCORE_BYTES:
            return
        naive = _attention_fn("naive", device)
        t_naive = median_seconds(lambda: naive(q, k, v, causal=causal, scale=scale), device, repeats)
        results.record("FA-4", measured=round(t_naive / t, 3), lecture="FlashAttention 2-4x faster than standard",
                       unit="speed relative to standard (naive) attention, same run",
                       rule=f"prefill {dtype}, B={B}, Hq={Hq}, T={T}, D={D}, causal={causal}",
                       tflops=f / t / 1e12, naive_tflops=f / t_naive / 1e12, speed_vs_sdpa=round(t_sdpa / t, 3))


# ------------------------------------------------------------------------------------ decode
@pytest.mark.claim("FA-7")
@pytest.mark.parametrize("backend", bench_backends("attention", BACKENDS))
def test_bench_decode(benchmark, device, backend, Tk, BH):
    """One query token over a cache of Tk keys (Tq = 1). The Triton backend dispatches to the
    split-KV kernel; the unsplit FlashAttention kernel is timed in the same run for the ratio."""
    fn = _attention_fn(backend, device)
    dtype, D = _dtype(device), 128
    B, Hq = BH
    q, k, v = _inputs(B, Hq, 1, Tk, D, dtype, device)
    scale = D ** -0.5
    sdpa = _attention_fn("torch", device)
    repeats = 5 if benchmark.disabled else 50

    def run():
        return fn(q, k, v, causal=True, scale=scale)

    with outside_refusals("attention", backend):  # an outside refusal is "unsupported"
        t = median_seconds(run, device, repeats)
    t_sdpa = t if backend == "torch" else median_seconds(lambda: sdpa(q, k, v, causal=True, scale=scale),
                                                           device, repeats)
    f = flops(B, Hq, 1, Tk, D, False)
    kv_bytes = 2 * B * Hq * Tk * D * dtype.itemsize
    info = dict(claim="FA-7", technique="attention", backend=backend, device=device,
                dtype=str(dtype).replace("torch.", ""), B=B, Hq=Hq, Tq=1, Tk=Tk, D=D, flops=f, bytes=kv_bytes,
                median_s=t, tflops=f / t / 1e12, gbytes_per_s=kv_bytes / t / 1e9, sdpa_median_s=t_sdpa,
                speed_vs_sdpa=t_sdpa / t, **outside_info("attention", backend))
    if backend == "triton":
        from inference_conformance.optimized.attention.flash_attention import flash_attention

        t_unsplit = median_seconds(lambda: flash_attention(q, k, v, causal=True, scale=scale), device, repeats)
        split = ratio_estimate(paired_ratios(lambda: flash_attention(q, k, v, causal=True, scale=scale), run, device,
                                             repeats))
        info.update(unsplit_median_s=t_unsplit, split_speedup=t_unsplit / t,
                    goal="B·Hq <= 32, Tk >= 16k: split_speedup >= 3" if B * Hq <= 32 and Tk >= 16384 else "")
        results.record("FA-7", measured=round(split.estimate, 3), lecture="split-KV faster than unsplit when B·Hq is small",
                       **(trend_fields(split, ">", 1, "split-KV faster than unsplit where B·Hq <= 32")
                          if B * Hq <= 32 else dict(ci_low=split.low, ci_high=split.high, pairs=split.pairs)),
                       # the claim speaks of small B·Hq only
                       unit="unsplit / split-KV latency (same run)", rule=f"decode {dtype}, B={B}, Hq={Hq}, Tk={Tk}, D={D}",
                       split_ms=1e3 * t, unsplit_ms=1e3 * t_unsplit, sdpa_ms=1e3 * t_sdpa)
    results.bench_info(benchmark, **info)
    benchmark.pedantic(run, rounds=rounds(benchmark, t, repeats), warmup_rounds=0)


# ----------------------------------------------------------------- FA-8: the options' overhead
#: (B, Hq, Tq, W, D) of the options' benchmark: Tq queries with a window of W keys over
#: Tk = Tq + W keys (every row sees exactly W keys), against plain attention of the same Tq
#: queries over W keys without a mask (every row sees the same W).
OPTIONS_SIZES = {"cuda": ((1, 32, 4096, 1024, 128), (1, 32, 8192, 512, 128)), "cpu": ((1, 4, 256, 64, 64),)}


@pytest.mark.claim("FA-8")
@pytest.mark.parametrize("backend", bench_backends("attention", ("torch", "triton")))
def test_bench_window_and_sinks_overhead(benchmark, device, backend):
    """FA-8's options at equal visible keys, in one run: a window of W over Tq + W keys against
    plain attention over W keys (the ratio is the window's cost: the key tiles the kernel reads
    past the W each row sees, the band's masks), and sinks against none at the same shape. A
    kernel that streamed every key and masked would show Tk / W (9x, 17x) here, not ~1."""
    fn = _attention_fn(backend, device)
    dtype = _dtype(device)
    repeats = 3 if benchmark.disabled else 10
    for B, Hq, Tq, W, D in OPTIONS_SIZES[device]:
        q, k, v = _inputs(B, Hq, Tq, Tq + W, D, dtype, device)
        kw, vw = k[:, :, -W:].contiguous(), v[:, :, -W:].contiguous()
        sinks = torch.linspace(-1.0, 1.0, Hq, device=device)
        scale = D ** -0.5

        def windowed():
            return fn(q, k, v, causal=True, scale=scale, window=W)

        def plain():
            return fn(q, kw, vw, causal=False, scale=scale)

        def with_sinks():
            return fn(q, kw, vw, causal=False, scale=scale, sinks=sinks)

        with outside_refusals("attention", backend):
            window_ratio = ratio_estimate(paired_ratios(windowed, plain, device, repeats))
            sink_ratio = ratio_estimate(paired_ratios(with_sinks, plain, device, repeats))
        t = median_seconds(windowed, device, repeats)
        results.record("FA-8", measured=round(window_ratio.estimate, 3),
                       unit="windowed / plain attention latency at equal visible keys (same run)",
                       rule=f"{backend} {dtype}, B={B}, Hq={Hq}, Tq={Tq}, W={W}, Tk={Tq + W}, D={D}",
                       ci_low=window_ratio.low, ci_high=window_ratio.high, sinks_ratio=round(sink_ratio.estimate, 3),
                       keys_ratio=(Tq + W) / W)
    results.bench_info(benchmark, claim="FA-8", technique="attention", backend=backend, device=device,
                       dtype=str(dtype).replace("torch.", ""), B=B, Hq=Hq, Tq=Tq, W=W, D=D, median_s=t,
                       window_overhead=window_ratio.estimate, sinks_overhead=sink_ratio.estimate,
                       **outside_info("attention", backend))
    benchmark.pedantic(windowed, rounds=rounds(benchmark, t, repeats), warmup_rounds=0)


# ----------------------------------------------------------------- the batch-invariant mode's cost
#: (B, Hq, Tk, D) of the invariant mode's benchmark: decode (Tq = 1) at batch sizes where the
#: default's GPU policy picks many splits (B·Hq small) and one (B·Hq large).
INVARIANT_SIZES = {"cuda": ((1, 32, 16384, 128), (8, 32, 4096, 128), (64, 32, 4096, 128), (256, 32, 1024, 128)),
                   "cpu": ((2, 4, 512, 64),)}


def test_bench_batch_invariant_mode(benchmark, device):
    """The split-KV decode kernel in its batch-invariant mode ("triton_splitkv_invariant": a
    fixed split size, the ordered merge) against its default ("triton_splitkv": splits chosen from
    B·Hq), in one run, interleaved: ratio invariant / default latency per size (the mode's cost;
    goal: <= 1.10 where the default picks one split, B·Hq >= 2 x the SMs). Triton on CUDA only."""
    default, mode = _attention_fn("triton_splitkv", device), _attention_fn("triton_splitkv_invariant", device)
    dtype = _dtype(device)
    repeats = 3 if benchmark.disabled else 20
    for B, Hq, Tk, D in INVARIANT_SIZES[device]:
        q, k, v = _inputs(B, Hq, 1, Tk, D, dtype, device)
        scale = D ** -0.5

        def run():
            return mode(q, k, v, causal=False, scale=scale)

        cost = ratio_estimate(paired_ratios(run, lambda: default(q, k, v, causal=False, scale=scale), device, repeats))
        t = median_seconds(run, device, repeats)
        results.record("", measured=round(cost.estimate, 3), unit="batch-invariant / default split-KV latency (same run)",
                       rule=f"decode {dtype}, B={B}, Hq={Hq}, Tk={Tk}, D={D}", ci_low=cost.low, ci_high=cost.high,
                       invariant_ms=1e3 * t)
    results.bench_info(benchmark, technique="attention", implementation="triton_splitkv_invariant", device=device,
                       dtype=str(dtype).replace("torch.", ""), B=B, Hq=Hq, Tk=Tk, D=D, median_s=t,
                       invariant_over_default=cost.estimate, goal="invariant_over_default <= 1.10")
    benchmark.pedantic(run, rounds=rounds(benchmark, t, repeats), warmup_rounds=0)
