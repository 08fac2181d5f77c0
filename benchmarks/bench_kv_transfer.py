"""Moving one request's KV cache between a prefill and a decode engine (``kv_transfer``, PA-9):
time per transfer and the bytes it moves, every transfer in one run.

Each row times round trips of one ready request of ``context`` tokens between two paged engines
(``optimized/paged_attention/engine.py``) of Llama-3-8B's cache shape (32 layers, 8 KV heads of
D = 128), the prefill engine in blocks of 16 and the decode engine in blocks of 32, both pools
shuffled: ``send`` on one engine then ``receive`` on the other, and back, so that the request
ends where it started; a transfer is half a round trip. The request is admitted with random K/V
(no forward runs: only the transfer is timed). ``bytes``: the K/V of its tokens read once and
written once (2 · 2 · L · context · Hkv · D · bytes per value). ``over_reference``: the time
over the reference transfer's in the same run. On the CPU one small size runs (a smoke test of
the row). With ``--impl kv_transfer=module:attr`` the rows ``impl``, ``impl2``, ... time outside
transfers. Figures only: no speed is asserted.
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.benchmarks.timing import median_seconds, rounds
from inference_conformance.conformance import results
from inference_conformance.conformance.bench_rows import bench_backends, bench_implementation, outside_info, outside_refusals
from inference_conformance.optimized.paged_attention.engine import PagedEngine
from inference_conformance.optimized.paged_attention.engine_state import RequestState
from inference_conformance.reference.transformer import Transformer, TransformerConfig

#: Tokens of the transferred request, per device.
CONTEXTS = {"cuda": (512, 4096, 32768), "cpu": (64,)}
#: Llama-3-8B's cache shape (the model's width is irrelevant to a transfer: kept small).
LAYERS, HKV, D = 32, 8, 128
BS_PREFILL, BS_DECODE = 16, 32

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def pytest_generate_tests(metafunc):
    from inference_conformance.conformance.device import current_device

    if metafunc.definition.name == "test_bench_kv_transfer":
        contexts = CONTEXTS[current_device()]
        metafunc.parametrize("context", contexts, ids=[f"T{t}" for t in contexts])


def _transfer(backend: str, device: str):
    return bench_implementation("kv_transfer", backend, device)


def _engines(context: int, dtype, device: str):
    """(prefill engine holding request 0 ready with random K/V, an empty decode engine)."""
    cfg = TransformerConfig(vocab_size=32, d_model=16, n_layers=LAYERS, n_heads=HKV, n_kv_heads=HKV, d_ff=16,
                            max_seq_len=context + 2, head_dim=D)
    model = Transformer(cfg).to(device=device, dtype=dtype).eval()
    engines = []
    for salt, bs in enumerate((BS_PREFILL, BS_DECODE)):
        e = PagedEngine(model, num_blocks=-(-(context + 1) // bs) + 4, block_size=bs)
        e.book.allocator.shuffle_free(torch.Generator().manual_seed(salt))
        for c in e.k + e.v:
            c.copy_(torch.randn(c.shape, generator=torch.Generator().manual_seed(salt + 7)).to(dtype))
        engines.append(e)
    engines[0].admit(RequestState(0, [1] * context, [2], 2, 0.0, None, context))
    return engines


@pytest.mark.parametrize("backend", bench_backends("kv_transfer", ("reference", "packed_tokens")))
def test_bench_kv_transfer(benchmark, device, backend, context):
    transfer = _transfer(backend, device)
    reference = _transfer("reference", device)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    repeats = 3 if benchmark.disabled else 10

    def round_trip(t, pre, dec):
        t.receive(dec, t.send(pre, 0))
        t.receive(pre, t.send(dec, 0))

    pre, dec = _engines(context, dtype, device)
    with outside_refusals("kv_transfer", backend):
        t = median_seconds(lambda: round_trip(transfer, pre, dec), device, repeats) / 2
    ref_pre, ref_dec = _engines(context, dtype, device)
    t_ref = median_seconds(lambda: round_trip(reference, ref_pre, ref_dec), device, repeats) / 2
    nbytes = 2 * 2 * LAYERS * context * HKV * D * dtype.itemsize
    results.bench_info(benchmark, technique="kv_transfer", backend=backend, device=device,
                       dtype=str(dtype).replace("torch.", ""), context=context, layers=LAYERS, Hkv=HKV, D=D,
                       what=f"one transfer, blocks of {BS_PREFILL} -> {BS_DECODE}", bytes=nbytes, median_s=t,
                       gbytes_per_s=nbytes / t / 1e9, reference_median_s=t_ref, over_reference=t / t_ref,
                       **outside_info("kv_transfer", backend))
    benchmark.pedantic(lambda: round_trip(transfer, pre, dec), rounds=rounds(benchmark, 2 * t, repeats),
                       warmup_rounds=0)
