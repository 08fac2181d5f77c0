"""Paged decode timings: the Triton paged kernel vs the contiguous split-KV decode kernel on the
same K/V (blocks of 16 and of 1), the reference gather-then-attention, and the
continuous-batching engine's throughput (tokens/s) against its batch.

Each test builds one decode step: B sequences of ``context`` tokens, K/V cut into blocks placed
by a random permutation of the pool, and the same K/V contiguous (B, Hkv, context, D). It times
the paged backend and, in the same run, the contiguous decode (``optimized.flash_decoding`` on
CUDA, standard attention on the CPU) with synchronised medians, so the ratio is recorded even
when pytest-benchmark is disabled. extra_info: median latency, KV bytes read per call
(``bytes``: 2·B·context·Hkv·D·bytes per value), GB/s, paged / contiguous latency, and the goal
text. On the CPU the Triton rows are skipped (the interpreter's timings mean nothing) and the
reference runs one small size as a smoke test.

Goals for the report (not asserted; GPU): KV-read GB/s >= 85% of the measured copy bandwidth
when the read is >= 256 MB; paged / contiguous latency <= 1.10 at blocks of 16; GQA-8 >= 75%.
"""
from __future__ import annotations

import pytest
import torch

from benchmarks.timing import median_seconds, rounds
from conformance import results
from conformance.contracts.paged_attention import kv_bytes
from properties.strategies import randn

#: (B, context) per device; GPU sizes keep one call's K/V under MAX_KV_BYTES.
SIZES = {"cuda": ((1, 32768), (16, 4096), (64, 4096), (256, 1024), (64, 32768)), "cpu": ((2, 128),)}
MAX_KV_BYTES = 16 * 2 ** 30
#: (Hq, Hkv): multi-head and GQA-8 (Llama-3-8B's heads).
HEADS = {"mha": (32, 32), "gqa8": (32, 4)}
D = 128

#: small CPU tensors: one intra-op thread (no OpenMP spin-waits between xdist workers)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def pytest_generate_tests(metafunc):
    from conformance.device import current_device

    device = current_device()
    if metafunc.definition.name == "test_bench_paged_decode":
        metafunc.parametrize("B,context", SIZES[device], ids=[f"B{b}-T{t}" for b, t in SIZES[device]])
    elif metafunc.definition.name == "test_bench_engine_throughput":
        metafunc.parametrize("batch", ENGINE_BATCH[device], ids=[f"batch{b}" for b in ENGINE_BATCH[device]])


def _paged_inputs(B, context, Hq, Hkv, block_size, dtype, device, seed=0):
    """q (B, Hq, D); contiguous k, v (B, Hkv, context, D); the same K/V in randomly placed blocks."""
    q = randn((B, Hq, D), seed, dtype=dtype, device=device)
    k = randn((B, Hkv, context, D), seed + 1, dtype=dtype, device=device)
    v = randn((B, Hkv, context, D), seed + 2, dtype=dtype, device=device)
    nb = -(-context // block_size)
    pad = nb * block_size - context
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(B * nb, generator=g).to(device)
    table = perm.view(B, nb).to(torch.int32)

    def pages(x):
        x = torch.nn.functional.pad(x, (0, 0, 0, pad))                        # (B, Hkv, nb*bs, D)
        x = x.view(B, Hkv, nb, block_size, D).permute(0, 2, 3, 1, 4).reshape(B * nb, block_size, Hkv, D)
        cache = torch.empty_like(x)
        cache[perm] = x
        return cache

    lens = torch.full((B,), context, dtype=torch.int32, device=device)
    return q, k, v, pages(k), pages(v), table, lens


@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("block_size", [16, 1])
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_bench_paged_decode(benchmark, device, backend, block_size, heads, B, context):
    Hq, Hkv = HEADS[heads]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    nbytes = kv_bytes([context] * B, Hkv, D, dtype.itemsize)
    if nbytes > MAX_KV_BYTES:
        pytest.skip(f"{nbytes / 2 ** 30:.0f} GiB of K/V per call")
    if backend == "triton" and device != "cuda":
        pytest.skip("Triton runs under the interpreter on the CPU: its timings mean nothing (use --device cuda)")
    if backend == "reference" and device == "cuda" and B * context > 16 * 4096:
        pytest.skip("the reference gathers per sequence in Python: GPU smoke size only")
    if backend == "triton":
        from optimized.paged_attention import paged_attention as fn
    else:
        from reference.paged_attention import paged_attention as fn
    q, k, v, kc, vc, table, lens = _paged_inputs(B, context, Hq, Hkv, block_size, dtype, device)
    scale = D ** -0.5
    repeats = 3 if benchmark.disabled else 20

    def run():
        return fn(q, kc, vc, table, lens, scale=scale)

    t = median_seconds(run, device, repeats)
    q4 = q[:, :, None, :]
    if device == "cuda":
        from optimized.flash_decoding import flash_decoding

        def contiguous():
            return flash_decoding(q4, k, v, causal=False, scale=scale)
    else:
        from reference.attention import attention_naive

        def contiguous():
            return attention_naive(q4, k, v, causal=False, scale=scale)
    t_contig = median_seconds(contiguous, device, repeats)
    flops = 4.0 * B * Hq * context * D
    info = dict(technique="paged_attention", backend=backend, device=device, dtype=str(dtype).replace("torch.", ""),
                B=B, context=context, Hq=Hq, Hkv=Hkv, D=D, block_size=block_size, heads=heads,
                bytes=nbytes, flops=flops, median_s=t, gbytes_per_s=nbytes / t / 1e9,
                contiguous_median_s=t_contig, paged_over_contiguous=t / t_contig)
    if backend == "triton":
        goals = []
        if nbytes >= 256 * 2 ** 20:
            goals.append("GB/s >= 85% of copy bandwidth" + (" (GQA-8: 75%)" if heads == "gqa8" else ""))
        if block_size == 16:
            goals.append("paged_over_contiguous <= 1.10")
        info["goal"] = "; ".join(goals)
    results.bench_info(benchmark, **info)
    benchmark.pedantic(run, rounds=rounds(benchmark, t, repeats), warmup_rounds=0)


# ------------------------------------------------------------------ engine throughput vs batch
#: Concurrent requests per device (the engine's batch); tokens generated per request.
ENGINE_BATCH = {"cuda": (1, 8, 32, 128), "cpu": (1, 4)}
ENGINE_NEW = {"cuda": 32, "cpu": 4}


def test_bench_engine_throughput(benchmark, device, batch):
    """The continuous-batching engine (``optimized/paged_engine.py``) over a small reference
    transformer: ``batch`` requests of 32-token prompts generating ENGINE_NEW tokens each, all
    admitted at once; tokens/s = generated tokens / wall time of the whole run (prefill
    included). On CUDA attention and writes are the Triton kernels; on the CPU the reference
    attention (the interpreter's timings mean nothing)."""
    from optimized.paged_engine import PagedEngine
    from reference.transformer import TransformerConfig, build

    cfg = TransformerConfig(vocab_size=96, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=344,
                            max_seq_len=128)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = build(cfg, seed=0, dtype=dtype, device=device)
    kw = {}
    if device == "cuda":
        from optimized.paged_attention import paged_attention, write_kv_cache

        kw = dict(attention=paged_attention, write=write_kv_cache)
    n_new, prompt_len, bs = ENGINE_NEW[device], 32, 16
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, cfg.vocab_size, (batch, prompt_len), generator=g).tolist()
    blocks = batch * -(-(prompt_len + n_new) // bs)

    def run():
        e = PagedEngine(model, num_blocks=blocks, block_size=bs, max_batch=batch, **kw)
        for i, p in enumerate(prompts):
            e.add_request(i, p, n_new)
        return e.run()

    repeats = 1 if benchmark.disabled else 5
    t = median_seconds(run, device, repeats)
    results.bench_info(benchmark, technique="paged_attention", implementation="paged_engine", device=device,
                       dtype=str(dtype).replace("torch.", ""), batch=batch, new_tokens=n_new,
                       prompt_len=prompt_len, block_size=bs, median_s=t, tokens_per_s=batch * n_new / t)
    benchmark.pedantic(run, rounds=rounds(benchmark, t, repeats), warmup_rounds=0)
