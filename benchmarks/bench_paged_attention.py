"""Paged decode timings: the Triton paged kernel vs the contiguous split-KV decode kernel on the
same K/V (blocks of 16 and of 1), the reference gather-then-attention, and the
continuous-batching engine's throughput (tokens/s) against its batch; the mixed batch of chunked
prefill (PA-8: one ``paged_prefill`` launch against the paged decode plus a separate prefill of
the same tokens) and the engine's step times with and without a token budget.

Each test builds one decode step: B sequences of ``context`` tokens, K/V cut into blocks placed
by a random permutation of the pool, and the same K/V contiguous (B, Hkv, context, D). It times
the paged backend and, in the same run, the contiguous decode (``inference_conformance.optimized.attention.flash_decoding`` on
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

from inference_conformance.benchmarks.timing import median_seconds, rounds
from inference_conformance.conformance import results
from inference_conformance.conformance.contracts.paged_attention import kv_bytes
from inference_conformance.properties.strategies import randn

#: (B, context) per device; GPU sizes keep one call's K/V under MAX_KV_BYTES.
SIZES = {"cuda": ((1, 32768), (16, 4096), (64, 4096), (256, 1024), (64, 32768)), "cpu": ((2, 128),)}
MAX_KV_BYTES = 16 * 2 ** 30
#: (Hq, Hkv): multi-head and GQA-8 (Llama-3-8B's heads).
HEADS = {"mha": (32, 32), "gqa8": (32, 4)}
D = 128

#: small CPU tensors: one intra-op thread (no OpenMP spin-waits between xdist workers)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def pytest_generate_tests(metafunc):
    from inference_conformance.conformance.device import current_device

    device = current_device()
    if metafunc.definition.name == "test_bench_paged_decode":
        metafunc.parametrize("B,context", SIZES[device], ids=[f"B{b}-T{t}" for b, t in SIZES[device]])
    elif metafunc.definition.name == "test_bench_mixed_batch":
        metafunc.parametrize("n_dec,context,chunk,prefix", MIXED[device],
                             ids=[f"dec{n}x{t}-chunk{c}+{p}" for n, t, c, p in MIXED[device]])
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
        from inference_conformance.optimized.paged_attention import paged_attention as fn
    else:
        from inference_conformance.reference.paged_attention import paged_attention as fn
    q, k, v, kc, vc, table, lens = _paged_inputs(B, context, Hq, Hkv, block_size, dtype, device)
    scale = D ** -0.5
    repeats = 3 if benchmark.disabled else 20

    def run():
        return fn(q, kc, vc, table, lens, scale=scale)

    t = median_seconds(run, device, repeats)
    q4 = q[:, :, None, :]
    if device == "cuda":
        from inference_conformance.optimized.attention.flash_decoding import flash_decoding

        def contiguous():
            return flash_decoding(q4, k, v, causal=False, scale=scale)
    else:
        from inference_conformance.reference.attention import attention_naive

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


# ------------------------------------------------------------------ the batch-invariant mode's cost
#: (B, context) of the invariant mode's benchmark: one long sequence beside B - 1 short ones
#: (the default sizes every sequence's splits by the longest; the invariant mode by a fixed size).
INVARIANT_SIZES = {"cuda": ((1, 32768), (16, 8192), (128, 4096)), "cpu": ((2, 256),)}


def test_bench_batch_invariant_mode(benchmark, device):
    """The paged decode kernel in its batch-invariant mode ("triton_invariant": a fixed split
    size, always merged, in split order) against its default ("triton"), in one run, interleaved:
    ratio invariant / default latency per size, GQA-8, blocks of 16 (the mode's cost; goal:
    <= 1.10). Triton on CUDA only."""
    if device != "cuda":
        pytest.skip("Triton runs under the interpreter on the CPU: its timings mean nothing (use --device cuda)")
    from inference_conformance.benchmarks.timing import paired_ratios, ratio_estimate
    from inference_conformance.optimized.paged_attention import paged_attention, paged_attention_invariant

    Hq, Hkv = HEADS["gqa8"]
    dtype = torch.bfloat16
    repeats = 3 if benchmark.disabled else 20
    for B, context in INVARIANT_SIZES[device]:
        q, _, _, kc, vc, table, lens = _paged_inputs(B, context, Hq, Hkv, 16, dtype, device)
        lens = torch.where(torch.arange(B, device=device) == 0, lens, lens // 8)   # one long, the rest short
        scale = D ** -0.5

        def run():
            return paged_attention_invariant(q, kc, vc, table, lens, scale=scale)

        cost = ratio_estimate(paired_ratios(run, lambda: paged_attention(q, kc, vc, table, lens, scale=scale), device,
                                            repeats))
        t = median_seconds(run, device, repeats)
        results.record("", measured=round(cost.estimate, 3), unit="batch-invariant / default paged decode latency "
                       "(same run)", rule=f"paged decode {dtype}, B={B}, context={context} (1 long, the rest "
                       f"{context // 8}), Hq={Hq}, Hkv={Hkv}, D={D}", ci_low=cost.low, ci_high=cost.high,
                       invariant_ms=1e3 * t)
    results.bench_info(benchmark, technique="paged_attention", implementation="triton_invariant", device=device,
                       dtype="bfloat16", B=B, context=context, Hq=Hq, Hkv=Hkv, D=D, block_size=16, median_s=t,
                       invariant_over_default=cost.estimate, goal="invariant_over_default <= 1.10")
    benchmark.pedantic(run, rounds=rounds(benchmark, t, repeats), warmup_rounds=0)


# ------------------------------------------------------------------ engine throughput vs batch
#: Concurrent requests per device (the engine's batch); tokens generated per request.
ENGINE_BATCH = {"cuda": (1, 8, 32, 128), "cpu": (1, 4)}
ENGINE_NEW = {"cuda": 32, "cpu": 4}


def test_bench_engine_throughput(benchmark, device, batch):
    """The continuous-batching engine (``optimized/paged_attention/engine.py``) over a small reference
    transformer: ``batch`` requests of 32-token prompts generating ENGINE_NEW tokens each, all
    admitted at once; tokens/s = generated tokens / wall time of the whole run (prefill
    included). On CUDA attention and writes are the Triton kernels; on the CPU the reference
    attention (the interpreter's timings mean nothing)."""
    from inference_conformance.optimized.paged_attention.engine import PagedEngine
    from inference_conformance.reference.transformer import TransformerConfig, build

    cfg = TransformerConfig(vocab_size=96, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=344,
                            max_seq_len=128)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = build(cfg, seed=0, dtype=dtype, device=device)
    kw = {}
    if device == "cuda":
        from inference_conformance.optimized.paged_attention import paged_attention, write_kv_cache

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


# ------------------------------------------------------------------ the mixed batch (PA-8)
#: (decode sequences, their context, chunk tokens, the chunk's cached prefix) per device.
MIXED = {"cuda": ((8, 4096, 512, 2048), (32, 2048, 1024, 0), (1, 8192, 2048, 6144)), "cpu": ((2, 48, 16, 16),)}


def _mixed_inputs(n_dec, context, chunk, prefix, Hq, Hkv, dtype, device, block_size=16, seed=0):
    """A mixed batch: n_dec decode sequences of ``context`` tokens and one sequence of prefix +
    chunk tokens whose last ``chunk`` are queries, in randomly placed blocks; also the contiguous
    K/V of the chunk's sequence (1, Hkv, prefix + chunk, D) for the separate prefill."""
    lens = [context] * n_dec + [prefix + chunk]
    qlens = [1] * n_dec + [chunk]
    need = [-(-n // block_size) for n in lens]
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(sum(need), generator=g)
    table = torch.zeros(len(lens), max(need), dtype=torch.int32)
    used = 0
    for b, nb in enumerate(need):
        table[b, :nb] = perm[used:used + nb].to(torch.int32)
        used += nb
    kc = randn((sum(need), block_size, Hkv, D), seed + 1, dtype=dtype, device=device)
    vc = randn((sum(need), block_size, Hkv, D), seed + 2, dtype=dtype, device=device)
    q = randn((sum(qlens), Hq, D), seed + 3, dtype=dtype, device=device)
    loc = torch.tensor([0] + [sum(qlens[:i + 1]) for i in range(len(qlens))], dtype=torch.int32, device=device)
    from inference_conformance.reference.paged_attention import gather

    k_last = gather(kc, table[-1].to(device), lens[-1])[None]                 # (1, Hkv, prefix + chunk, D)
    v_last = gather(vc, table[-1].to(device), lens[-1])[None]
    return (q, kc, vc, table.to(device), torch.tensor(lens, dtype=torch.int32, device=device), loc,
            k_last.contiguous(), v_last.contiguous())


@pytest.mark.parametrize("heads", ["gqa8"])
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_bench_mixed_batch(benchmark, device, backend, heads, n_dec, context, chunk, prefix):
    """PA-8's kernel: one mixed-batch launch (``paged_prefill``: the decode tokens and the chunk
    together) against the same tokens as two calls, the paged decode of the decode sequences and
    a separate causal prefill of the chunk (contiguous: the Triton FlashAttention kernel on CUDA,
    the reference on the CPU). extra_info: both medians and mixed / separate. The GPU rows are
    the point; on the CPU the reference runs one small size as a smoke test (the interpreter's
    timings mean nothing)."""
    if backend == "triton" and device != "cuda":
        pytest.skip("Triton runs under the interpreter on the CPU: its timings mean nothing (use --device cuda)")
    if backend == "reference" and device == "cuda" and (n_dec, context, chunk, prefix) != MIXED[device][0]:
        pytest.skip("the reference gathers per sequence in Python: GPU smoke size only")
    Hq, Hkv = HEADS[heads]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q, kc, vc, table, lens, loc, k_last, v_last = _mixed_inputs(n_dec, context, chunk, prefix, Hq, Hkv, dtype, device)
    scale = D ** -0.5
    if backend == "triton":
        from inference_conformance.optimized.attention.flash_attention import flash_attention as dense_prefill
        from inference_conformance.optimized.paged_attention import paged_attention as decode
        from inference_conformance.optimized.paged_attention.prefill import paged_prefill as mixed
    else:
        from inference_conformance.reference.attention import attention_naive as dense_prefill
        from inference_conformance.reference.paged_attention import paged_attention as decode
        from inference_conformance.reference.paged_attention import paged_prefill as mixed
    q_dec, q_chunk = q[:n_dec], q[n_dec:].transpose(0, 1)[None].contiguous()   # (n_dec, Hq, D), (1, Hq, C, D)

    def run():
        return mixed(q, kc, vc, table, lens, loc, scale=scale)

    def separate():
        decode(q_dec, kc, vc, table[:n_dec], lens[:n_dec], scale=scale)
        return dense_prefill(q_chunk, k_last, v_last, causal=True, scale=scale)

    repeats = 3 if benchmark.disabled else 20
    t = median_seconds(run, device, repeats)
    t_sep = median_seconds(separate, device, repeats)
    nbytes = kv_bytes([int(x) for x in lens], Hkv, D, dtype.itemsize)
    flops = 4.0 * Hq * D * (n_dec * context + chunk * prefix + chunk * (chunk + 1) / 2)
    results.bench_info(benchmark, technique="paged_attention", backend=backend, device=device,
                       dtype=str(dtype).replace("torch.", ""), Hq=Hq, Hkv=Hkv, D=D, block_size=16,
                       decode_sequences=n_dec, context=context, chunk=chunk, prefix=prefix, bytes=nbytes,
                       flops=flops, median_s=t, separate_median_s=t_sep, mixed_over_separate=t / t_sep,
                       goal="mixed_over_separate <= 1.0 (one launch instead of two)" if backend == "triton" else "")
    benchmark.pedantic(run, rounds=rounds(benchmark, t, repeats), warmup_rounds=0)


# ------------------------------------------------------------------ chunked vs unchunked steps (PA-8)
#: (decoding requests, their new tokens, the long prompt, the token budget) per device.
CHUNKED = {"cuda": (16, 64, 1536, 256), "cpu": (3, 8, 48, 12)}


@pytest.mark.parametrize("chunked", [False, True], ids=["unchunked", "chunked"])
def test_bench_engine_chunked_steps(benchmark, device, chunked):
    """The engine's step-time distribution with a long prompt arriving among decoding requests,
    without and with a token budget: wall time of each step, the longest gap between two tokens
    of a decoding request (seconds) and the steps taken. On CUDA attention is the Triton
    mixed-batch kernel and writes the Triton slot write; on the CPU the reference."""
    import statistics
    import time

    from inference_conformance.benchmarks.timing import sync
    from inference_conformance.optimized.paged_attention.engine import PagedEngine
    from inference_conformance.reference.transformer import TransformerConfig, build

    n_dec, n_new, long_prompt, budget = CHUNKED[device]
    cfg = TransformerConfig(vocab_size=96, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=344,
                            max_seq_len=2048)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = build(cfg, seed=0, dtype=dtype, device=device)
    kw = {}
    if device == "cuda":
        from inference_conformance.optimized.paged_attention import write_kv_cache
        from inference_conformance.optimized.paged_attention.prefill import paged_prefill

        kw = dict(prefill=paged_prefill, write=write_kv_cache)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, cfg.vocab_size, (16,), generator=g).tolist() for _ in range(n_dec)]
    long = torch.randint(0, cfg.vocab_size, (long_prompt,), generator=g).tolist()
    bs = 16
    blocks = n_dec * -(-(16 + n_new) // bs) + -(-(long_prompt + 2) // bs) + 2

    def run():
        e = PagedEngine(model, num_blocks=blocks, block_size=bs, max_num_batched_tokens=budget if chunked else None,
                        **kw)
        for i, p in enumerate(prompts):
            e.add_request(i, p, n_new)
        times, clock, seen = [], 0.0, {i: [] for i in range(n_dec)}
        step = 0
        while e.has_work():
            if step == 2:
                e.add_request("long", long, 2)
            sync(device)
            t0 = time.perf_counter()
            produced = e.step()
            sync(device)
            times.append(time.perf_counter() - t0)
            clock += times[-1]
            for rid in produced:
                if rid in seen:
                    seen[rid].append(clock)
            step += 1
        gaps = [b - a for ts in seen.values() for a, b in zip(ts, ts[1:])]
        return times, max(gaps, default=0.0), e.stats["steps"]

    run()                                                                    # warm-up (compile)
    times, max_gap, steps = run()
    results.bench_info(benchmark, technique="paged_attention", implementation="paged_engine", device=device,
                       dtype=str(dtype).replace("torch.", ""), token_budget=budget if chunked else None,
                       median_s=statistics.median(times), max_step_s=max(times), max_token_gap=max_gap,
                       total_steps=steps, step_s=[round(t, 6) for t in times])
    benchmark.pedantic(run, rounds=1 if benchmark.disabled else 3, warmup_rounds=0)
