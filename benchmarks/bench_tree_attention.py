"""Tree attention against attention with a materialised tree mask (claim SD-10): time per call of
each tree_attention built-in beside the way a tree is often scored without a tree kernel, in one
run.

Each test scores a tree of ``nodes`` draft tokens (SpecInfer's wide-then-narrow shape: a wide
root level, then chains) after a cached prefix of ``context`` tokens per sequence, Hq = 32 query
heads over Hkv = 8 (GQA), D = 128, and times, with synchronised medians: the backend, and
PyTorch's ``scaled_dot_product_attention`` over each sequence's prefix and tree with the tree's
boolean mask materialised as (nodes, context + nodes) (``reference_median_s``). It records the
ratio backend / masked SDPA (``over_reference``), bytes read (the prefix and tree keys and values
once) and FLOPs (every node against every visible key, as the masked computation pays). On the
CPU the Triton row is skipped (the interpreter's timings mean nothing) and the torch row runs one
small size as a smoke test. With ``--impl tree_attention=module:attr`` the rows ``impl``,
``impl2``, ... time the outside implementations.

Goal for the report (not asserted; GPU, bfloat16): the Triton tree kernel within 1.5x of masked
SDPA's time (it reads the same keys once per query head and builds the mask in registers).
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.benchmarks.timing import median_seconds, rounds
from inference_conformance.conformance import results
from inference_conformance.conformance.bench_rows import bench_backends, bench_implementation, outside_info, outside_refusals
from inference_conformance.properties.strategies import randn

#: (B, context, nodes) per device.
SIZES = {"cuda": ((1, 4096, 64), (8, 2048, 32), (32, 1024, 16)), "cpu": ((2, 256, 16),)}
HQ, HKV, D = 32, 8, 128

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def pytest_generate_tests(metafunc):
    from inference_conformance.conformance.device import current_device

    if metafunc.definition.name == "test_bench_tree_attention":
        sizes = SIZES[current_device()]
        metafunc.parametrize("B,context,nodes", sizes, ids=[f"B{b}-T{t}-N{n}" for b, t, n in sizes])


def wide_then_narrow(nodes: int) -> list[int]:
    """Parent pointers of ``nodes`` nodes: a quarter of them (at least 1) at the root level, the
    rest chains below them in turn."""
    width = max(1, nodes // 4)
    parents = [-1] * width
    for i in range(width, nodes):
        parents.append(i - width)
    return parents


def _fn(backend: str, device: str):
    if backend == "triton" and device != "cuda":
        pytest.skip("Triton runs under the interpreter on the CPU: its timings mean nothing (use --device cuda)")
    return bench_implementation("tree_attention", backend, device)


def masked_sdpa(q, k, v, parents, context: int):
    """A zero-argument call of SDPA with the tree's mask materialised, every sequence at prefix
    ``context`` (the batch in one call: one mask for all)."""
    from inference_conformance.optimized.tree_attention.vectorized import ancestor_mask

    n = q.shape[2]
    mask = torch.cat([torch.ones(n, context, dtype=torch.bool, device=q.device), ancestor_mask(parents)], 1)
    kk, vv = k[:, :, :context + n], v[:, :, :context + n]
    return lambda: torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, enable_gqa=True)


@pytest.mark.parametrize("backend", bench_backends("tree_attention", ("triton", "torch")))
def test_bench_tree_attention(benchmark, device, backend, B, context, nodes):
    fn = _fn(backend, device)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q = randn((B, HQ, nodes, D), 1, dtype=dtype, device=device)
    k = randn((B, HKV, context + nodes, D), 2, dtype=dtype, device=device)
    v = randn((B, HKV, context + nodes, D), 3, dtype=dtype, device=device)
    parents = torch.tensor(wide_then_narrow(nodes), dtype=torch.int64, device=device)
    lens = torch.full((B,), context, dtype=torch.int64, device=device)
    repeats = 3 if benchmark.disabled else 20

    def run():
        return fn(q, k, v, parents, lens, scale=D ** -0.5)

    with outside_refusals("tree_attention", backend):
        t = median_seconds(run, device, repeats)
    t_ref = median_seconds(masked_sdpa(q, k, v, parents, context), device, repeats)
    nbytes = 2 * B * HKV * (context + nodes) * D * dtype.itemsize + 2 * B * HQ * nodes * D * dtype.itemsize
    info = dict(technique="tree_attention", backend=backend, device=device, dtype=str(dtype).replace("torch.", ""),
                B=B, context=context, nodes=nodes, Hq=HQ, Hkv=HKV, D=D, bytes=nbytes,
                flops=4.0 * B * HQ * nodes * (context + nodes) * D, median_s=t, gbytes_per_s=nbytes / t / 1e9,
                reference_median_s=t_ref, over_reference=t / t_ref, **outside_info("tree_attention", backend))
    if backend == "triton":
        info["goal"] = "bfloat16: over_reference (masked SDPA) <= 1.5"
    results.bench_info(benchmark, **info)
    benchmark.pedantic(run, rounds=rounds(benchmark, t, repeats), warmup_rounds=0)
