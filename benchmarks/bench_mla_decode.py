"""MLA decode against MHA decode at an equal cache budget (the point of MLA, claims KV-7 and KV-12):
bytes read and time per decode step, in one run.

DeepSeek-V2/V3's attention at one tensor-parallel rank of 8: Hq = 16 heads of D = 128. Uncompressed
(MHA) they cache 2 · 16 · 128 = 4096 values per token; MLA caches C + R = 512 + 64 = 576. A cache
budget that holds ``context`` MLA tokens per sequence holds context · 576 / 4096 MHA tokens, so
each test times, in the same run and with synchronised medians: the MLA decode backend over
``context`` tokens (paged, blocks of 64) and MHA decode over the tokens the same bytes hold
(paged, blocks of 16: the Triton paged-attention kernel on CUDA; standard attention over the
contiguous K/V on the CPU), and records bytes read by each, the time ratio MLA / MHA
(``over_reference``, MHA's time in ``reference_median_s``) and the bytes ratio at an equal
context (576 / 4096 = 0.14). On the CPU the Triton row is skipped (the interpreter's timings mean
nothing) and the torch row runs one small size as a smoke test. With ``--impl mla_decode=module:attr``
the rows ``impl``, ``impl2``, ... time the outside implementations.

Goal for the report (not asserted; GPU, bfloat16): the Triton MLA decode at an equal budget within
2x of MHA's time (it reads the same bytes and does 4.25x the FLOPs per byte: 16 heads score
576 values and sum 512 per token against MHA's 2 x 128 per head and token).
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.benchmarks.timing import median_seconds, rounds
from inference_conformance.conformance import results
from inference_conformance.conformance.contracts.mla_decode import cache_bytes, flops
from inference_conformance.conformance.contracts.paged_attention import kv_bytes
from inference_conformance.conformance.bench_rows import bench_backends, bench_implementation, outside_info, outside_refusals
from inference_conformance.properties.strategies import randn

#: (B, context) per device: context is MLA's tokens per sequence.
SIZES = {"cuda": ((1, 8192), (16, 8192), (64, 4096), (1, 131072)), "cpu": ((2, 512),)}
#: DeepSeek-V2/V3 at one rank of 8: heads, no-RoPE head dim, latent dim, RoPE dim.
HQ, D, C, R = 16, 128, 512, 64
MLA_BLOCK, MHA_BLOCK = 64, 16

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def pytest_generate_tests(metafunc):
    from inference_conformance.conformance.device import current_device

    if metafunc.definition.name == "test_bench_mla_vs_mha_decode":
        sizes = SIZES[current_device()]
        metafunc.parametrize("B,context", sizes, ids=[f"B{b}-T{t}" for b, t in sizes])


def _mla_fn(backend: str, device: str):
    if backend == "triton" and device != "cuda":
        pytest.skip("Triton runs under the interpreter on the CPU: its timings mean nothing (use --device cuda)")
    return bench_implementation("mla_decode", backend, device)


def _paged_table(B: int, n: int, block_size: int, device: str):
    """(block_table (B, blocks) int32 of a random permutation, blocks per sequence)."""
    nb = -(-n // block_size)
    perm = torch.randperm(B * nb, generator=torch.Generator().manual_seed(0))
    return perm.view(B, nb).to(torch.int32).to(device), nb


def _mha_decode(B: int, context: int, dtype, device: str):
    """A zero-argument MHA decode step over ``context`` tokens of Hq = Hkv = 16 heads of D = 128."""
    q = randn((B, HQ, D), 11, dtype=dtype, device=device)
    scale = D ** -0.5
    if device == "cuda":
        from inference_conformance.optimized.paged_attention import paged_attention

        table, nb = _paged_table(B, context, MHA_BLOCK, device)
        kc = randn((B * nb, MHA_BLOCK, HQ, D), 12, dtype=dtype, device=device)
        vc = randn((B * nb, MHA_BLOCK, HQ, D), 13, dtype=dtype, device=device)
        lens = torch.full((B,), context, dtype=torch.int32, device=device)
        return lambda: paged_attention(q, kc, vc, table, lens, scale=scale)
    from inference_conformance.reference.attention import attention_naive

    k = randn((B, HQ, context, D), 12, dtype=dtype, device=device)
    v = randn((B, HQ, context, D), 13, dtype=dtype, device=device)
    return lambda: attention_naive(q[:, :, None], k, v, causal=False, scale=scale)


@pytest.mark.parametrize("backend", bench_backends("mla_decode", ("triton", "torch")))
def test_bench_mla_vs_mha_decode(benchmark, device, backend, B, context):
    fn = _mla_fn(backend, device)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    table, nb = _paged_table(B, context, MLA_BLOCK, device)
    q_nope = randn((B, HQ, D), 1, dtype=dtype, device=device)
    q_rope = randn((B, HQ, R), 2, dtype=dtype, device=device)
    w_uk = randn((HQ, C, D), 3, dtype=dtype, device=device, scale=C ** -0.5)
    cache = randn((B * nb, MLA_BLOCK, C + R), 4, dtype=dtype, device=device)
    lens = torch.full((B,), context, dtype=torch.int32, device=device)
    kw = {"scale": (D + R) ** -0.5, "rope_theta": 10000.0}
    repeats = 3 if benchmark.disabled else 20

    def run():
        return fn(q_nope, q_rope, w_uk, cache, table, lens, **kw)

    with outside_refusals("mla_decode", backend):
        t = median_seconds(run, device, repeats)
    mha_context = max(1, context * (C + R) // (2 * HQ * D))        # the tokens the same bytes hold
    t_mha = median_seconds(_mha_decode(B, mha_context, dtype, device), device, repeats)
    nbytes = cache_bytes(B, context, C, R, dtype.itemsize)
    mha_bytes = kv_bytes([mha_context] * B, HQ, D, dtype.itemsize)
    info = dict(technique="mla_decode", backend=backend, device=device, dtype=str(dtype).replace("torch.", ""),
                B=B, context=context, Hq=HQ, D=D, C=C, R=R, block_size=MLA_BLOCK, bytes=nbytes,
                flops=flops(B, HQ, C, R, context, D), median_s=t, gbytes_per_s=nbytes / t / 1e9,
                mha_context=mha_context, mha_bytes=mha_bytes, reference_median_s=t_mha, over_reference=t / t_mha,
                bytes_ratio_equal_context=(C + R) / (2 * HQ * D), **outside_info("mla_decode", backend))
    if backend == "triton":
        info["goal"] = "bfloat16, equal cache budget: over_reference <= 2.0"
    results.bench_info(benchmark, **info)
    benchmark.pedantic(run, rounds=rounds(benchmark, t, repeats), warmup_rounds=0)
