"""Tests of paged attention beside its laws (claim PA-1; lecture 001 §4.2, Kwon et al. 2023; the
laws, with their zoo tests, in ``laws/decode.py``, the mixed batch's in ``laws/prefill.py``): the
coverage table of PA-1's pinned examples, production-sized shapes, the Triton kernel's own paths
(split-KV, the slot write, past 2^31), a decode loop through block tables and block ids past int16.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from inference_conformance.conformance.device import triton_interpreted
from inference_conformance.conformance.tolerance import assert_exact
from inference_conformance.properties import strategies
from inference_conformance.properties.paged_attention.laws.decode import FAR_CASE, PA1
from inference_conformance.properties.paged_attention.cases import (
    paged_case,
    PagedCase,
    call,
    check_against_contiguous,
    fit_budget,
    make_inputs,
    paged_cases,
)
from inference_conformance.properties.strategies import KernelLaunchCapture

TECH = "paged_attention"
#: tiny tensors: one intra-op thread is fastest and avoids OpenMP spin-waits between xdist workers
pytestmark = pytest.mark.usefixtures("one_torch_thread")

@pytest.mark.claim("PA-1")
@pytest.mark.suite_own("the suite's pinned examples reach every boundary class")
def test_pa1_coverage_table():
    """The boundary classes each pinned example and the ``ci`` draws reach (reported)."""
    PA1.record_pinned_coverage("every class of the contract is reached in every Hypothesis profile")


# ----------------------------------------------- production-sized shapes, beyond the drawn ones
#: Shapes that the interpreter budget keeps out of the drawn cases, or that deserve a name.
PRODUCTION_CASES = {
    "bs16-B3-mixed-group8-D128": paged_case((1, 16, 47), 16, 2, 128, 16),
    "bs1-Tk200-group4-D64": paged_case((200, 9), 8, 2, 64, 1),
    "bs5-group24-D72": paged_case((26, 9, 5), 24, 1, 72, 5),
    "bs32-group20-D80": paged_case((65, 31), 40, 2, 80, 32),
    "bs256-D192": paged_case((257, 255), 4, 1, 192, 256, spare_blocks=1),
    "bs16-D96-Hkv8": paged_case((48, 17), 8, 8, 96, 16),
    "bs3-129-blocks-D256": paged_case((387,), 2, 1, 256, 3),
    # past 1024 tokens (a split dropped past the first 1024), a batch of five (rows from 4 on),
    # a long and a one-token sequence side by side (a split with no tokens: 0/0)
    "bs16-1025-tokens": paged_case((1025,), 1, 1, 1, 16),
    "B5-bs4-group2": paged_case((3, 7, 2, 9, 5), 4, 2, 16, 4),
    "bs16-513-and-1": paged_case((513, 1), 2, 1, 8, 16),
    # large logits with a scale that is not a power of two (0.09)
    "bs16-large-scale0.09-group4": paged_case((70, 33), 8, 2, 64, 16, magnitude="large", amp=12.0, c=0.09 * 8),
}


@pytest.mark.technique(TECH)
@pytest.mark.claim("PA-1")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", list(PRODUCTION_CASES))
def test_pa1_production_shapes(impl, device, dtype, name):
    case = PRODUCTION_CASES[name]
    inp = make_inputs(case, 17, dtype, device)
    check_against_contiguous(call(impl, inp, case), inp, case, what=f"paged attention at {name}")


@pytest.mark.claim("PA-1")
@pytest.mark.suite_own("the suite's Triton slot write at offsets past 2^31")
def test_triton_slot_write_past_2_31(device):
    """write_kv_cache into slots past element 2^31 of FAR_CASE's caches: each token lands in its
    slot, bit for bit, and the other slots of its block stay NaN."""
    pa = pytest.importorskip("inference_conformance.optimized.paged_attention")
    inp = make_inputs(FAR_CASE, 43, torch.bfloat16, device)
    kc, vc = inp.k_cache, inp.v_cache
    bs, last = FAR_CASE.block_size, kc.shape[0] - 1
    slots = torch.tensor([last * bs + bs - 1, (last - 1) * bs, last * bs], device=device)
    k = strategies.randn((3, FAR_CASE.Hkv, FAR_CASE.D), 5, dtype=torch.bfloat16, device=device)
    v = strategies.randn((3, FAR_CASE.Hkv, FAR_CASE.D), 6, dtype=torch.bfloat16, device=device)
    kc[last - 1:] = float("nan")
    vc[last - 1:] = float("nan")
    pa.write_kv_cache(kc, vc, k, v, slots)
    for cache, new in ((kc, k), (vc, v)):
        assert_exact(cache[last, bs - 1], new[0], what="slot write past 2^31")
        assert_exact(cache[last - 1, 0], new[1], what="slot write past 2^31")
        assert_exact(cache[last, 0], new[2], what="slot write past 2^31")
        assert torch.isnan(cache[last, 1:bs - 1]).all() and torch.isnan(cache[last - 1, 1:]).all(), "a write hit another slot"


# ------------------------------------------------ the Triton kernel's own paths (split, write)
@pytest.mark.claim("PA-1")
@settings(max_examples=5)
@given(case=paged_cases(), seed=strategies.seeds, num_splits=st.integers(1, 4),
       dtype=st.sampled_from([torch.float64, torch.float32, torch.float16]))
@example(case=paged_case((130, 17), 6, 2, 59, 2), seed=1, num_splits=3, dtype=torch.float32)
@pytest.mark.suite_own("the suite's Triton kernel's split paths (its internals)")
def test_pa1_triton_split_kv_paths(device, case, seed, num_splits, dtype):
    """The Triton kernel with its tokens split into 1..4 ranges (partial outputs merged by
    log-sum-exp) equals the contiguous reference: the path long contexts take on a GPU."""
    pa = pytest.importorskip("inference_conformance.optimized.paged_attention")
    if triton_interpreted():
        case = fit_budget(case, budget=12)
    inp = make_inputs(case, seed, dtype, device)
    out = pa.paged_attention(*inp.args(), scale=case.scale, num_splits=num_splits)
    check_against_contiguous(out, inp, case, what=f"Triton paged attention, {num_splits} splits")


@pytest.mark.claim("PA-1")
@settings(max_examples=5)
@given(bs=st.sampled_from([1, 3, 16, 256]), n=st.integers(1, 12), hkv=st.integers(1, 3),
       D=st.sampled_from([1, 8, 72]), seed=strategies.seeds,
       dtype=st.sampled_from([torch.float64, torch.float32, torch.bfloat16]),
       index_dtype=st.sampled_from([torch.int32, torch.int64]))
@pytest.mark.suite_own("the suite's Triton slot-mapping write")
def test_slot_mapping_write_matches_index_copy(device, bs, n, hkv, D, seed, dtype, index_dtype):
    """write_kv_cache scatters token n into slot slot_mapping[n] and nowhere else: equal, bit for
    bit (unwritten slots stay NaN), to PyTorch's index_copy_ on the flattened cache."""
    pa = pytest.importorskip("inference_conformance.optimized.paged_attention")
    num_blocks = -(-n // bs) + 2
    g = torch.Generator().manual_seed(seed)
    slots = torch.randperm(num_blocks * bs, generator=g)[:n].to(device=device, dtype=index_dtype)
    k = strategies.randn((n, hkv, D), seed, dtype=dtype, device=device)
    v = strategies.randn((n, hkv, D), seed + 1, dtype=dtype, device=device)
    kc = torch.full((num_blocks, bs, hkv, D), float("nan"), dtype=dtype, device=device)
    vc = kc.clone()
    kc_ref, vc_ref = kc.clone(), vc.clone()
    pa.write_kv_cache(kc, vc, k, v, slots)
    pa.write_kv_cache_torch(kc_ref, vc_ref, k, v, slots)
    assert_exact(kc, kc_ref, what="K cache after the slot-mapping write")
    assert_exact(vc, vc_ref, what="V cache after the slot-mapping write")


@pytest.mark.claim("PA-1", "PA-4")
@pytest.mark.suite_own("the suite's block tables, slot write and kernel in one decode loop")
def test_pa1_decode_loop_through_block_tables(device):
    """A decode loop as a server runs it: the reference PagedKVCache hands out blocks (two
    sequences, the second forked from the first while its last block is partly filled, blocks
    of 3), the copies its copy-on-write asks for are made on the kernel's caches, each step's new
    K/V go in through write_kv_cache by the slot mapping, and the Triton kernel's output over the
    block tables equals dense attention over each sequence's own tokens."""
    pa = pytest.importorskip("inference_conformance.optimized.paged_attention")
    from inference_conformance.properties.paged_attention.cases import PagedInputs
    from inference_conformance.reference.paged_attention import PagedKVCache

    Hq, Hkv, D, bs, dt = 4, 2, 16, 3, torch.float32
    book = PagedKVCache(24, bs)
    kc = torch.full((24, bs, Hkv, D), float("nan"), dtype=dt, device=device)
    vc = kc.clone()
    dense = {"a": [torch.empty(Hkv, 0, D, dtype=dt, device=device)] * 2}

    def step(seqs, seed):
        slots, ks, vs = [], [], []
        for i, s in enumerate(seqs):
            done = len(book.copy_log)
            book.append_tokens(s, 1)
            for src, dst in book.copy_log[done:]:      # copy-on-write: the server copies the block
                kc[dst], vc[dst] = kc[src], vc[src]
            slots.append(book.slot(s, book.length(s) - 1))
            ks.append(strategies.randn((Hkv, D), seed + 2 * i, dtype=dt, device=device))
            vs.append(strategies.randn((Hkv, D), seed + 2 * i + 1, dtype=dt, device=device))
            dense[s] = [torch.cat([dense[s][0], ks[-1][:, None]], dim=1), torch.cat([dense[s][1], vs[-1][:, None]], dim=1)]
        pa.write_kv_cache(kc, vc, torch.stack(ks), torch.stack(vs), torch.tensor(slots, device=device))

    book.new_sequence("a")
    for t in range(5):
        step(["a"], 100 + 10 * t)
    book.fork("a", "b")
    dense["b"] = [x.clone() for x in dense["a"]]
    for t in range(4):
        step(["a", "b"], 500 + 10 * t)
    assert book.copies == 1, f"one copy-on-write expected (the shared partial block), got {book.copies}"
    seqs = ["a", "b"]
    table = book.block_table(seqs, fill=-1, device=device)
    lens = torch.tensor([book.length(s) for s in seqs], dtype=torch.int32, device=device)
    q = strategies.randn((2, Hq, D), 7, dtype=dt, device=device)
    out = pa.paged_attention(q, kc, vc, table, lens, scale=0.3)
    case = PagedCase(tuple(int(x) for x in lens), Hq, Hkv, D, bs, 0.3)
    inp = PagedInputs(q, kc, vc, table, lens, [dense[s][0][None] for s in seqs], [dense[s][1][None] for s in seqs])
    check_against_contiguous(out, inp, case, what="Triton paged attention after a decode loop with a fork")


# ------------------------------------------- block ids past int16 and a float64 scale, pinned
@pytest.mark.technique(TECH)
@pytest.mark.claim("PA-1")
def test_pa1_block_ids_past_int16(impl, device):
    """PA-1 with every live block id above 32767 (a pool of 32,800 blocks): an implementation
    that narrows block ids to int16 (or reads them through a 16-bit index) gathers the wrong
    blocks here."""
    case = paged_case((5, 3), 2, 1, 4, 2, spare_blocks=0)
    inp = make_inputs(case, 23, torch.float32, device)
    pool = 32_800
    k_cache = torch.full((pool, *inp.k_cache.shape[1:]), float("nan"), dtype=inp.k_cache.dtype, device=device)
    v_cache = torch.full_like(k_cache, float("nan"))
    table = inp.block_table.clone()
    table[(table >= 0) & (table < pool)] = pool + 7                          # unused entries: out of range
    live = []
    for b, nb in enumerate(case.blocks()):
        for i in range(nb):
            old = int(inp.block_table[b, i])
            new = pool - 1 - old                                             # ids 32,795 .. 32,799
            k_cache[new], v_cache[new] = inp.k_cache[old], inp.v_cache[old]
            table[b, i] = new
            live.append(new)
    assert min(live) > 32767
    moved = dataclasses.replace(inp, k_cache=k_cache, v_cache=v_cache, block_table=table)
    check_against_contiguous(call(impl, moved, case), moved, case, what="paged attention, block ids past int16")


@pytest.mark.technique(TECH)
@pytest.mark.claim("PA-1")
@pytest.mark.suite_own("the suite's float64 paged kernel's launch arguments")
def test_float64_paged_kernel_hands_no_float_that_float32_rounds(device, monkeypatch):
    """Compiled Triton types a Python float kernel argument as float32, so a float64 call folds
    the scale into q on the host (``inference_conformance.optimized.attention.tiles.fold_scale``); the interpreter keeps
    the Python float, so only the launch arguments show it. The output is exact too."""
    pa = pytest.importorskip("inference_conformance.optimized.paged_attention")
    seen = []
    for name in ("_paged_decode_kernel", "_paged_merge_kernel"):
        monkeypatch.setattr(pa, name, KernelLaunchCapture(getattr(pa, name), seen))
    case = paged_case((40, 9), 4, 2, 16, 4, c=0.3)
    inp = make_inputs(case, 29, torch.float64, device)
    check_against_contiguous(pa.paged_attention(*inp.args(), scale=case.scale, num_splits=2), inp, case,
                             what="float64 Triton paged attention")
    floats = [a for a in seen if isinstance(a, float)]
    assert floats, "no float argument recorded"
    rounded = [a for a in floats if float(torch.tensor(a, dtype=torch.float32)) != a]
    assert not rounded, f"the float64 paged kernel was handed floats that float32 rounds: {rounded}"
