"""Laws of paged attention (claim PA-1; lecture 001 §4.2, Kwon et al. 2023). The mixed batch
(PA-8) is in ``properties/paged_attention/test_paged_attention_prefill.py``.

PA-1: attention through a block table over non-contiguous blocks equals attention over the
contiguous cache, for any block size and any placement of blocks. Every law is written against
the ``paged_attention`` contract (``conformance/contracts/paged_attention.py``) and runs over
every registered implementation; blocks are placed by random permutations over a pool larger
than needed, unused table entries are out of range and unused slots NaN
(``properties/paged_attention/cases.py``). The known-bad implementations (``properties/paged_attention/zoo.py``)
are each shown rejected, and the ``ci`` profile is shown to reach the contract's boundary
classes (block sizes 1, odd, 16, 32, 256; lengths at block multiples and one off; more than 64
and 128 blocks; different lengths in a batch; groups above 16 that are not multiples of 16;
head dims 64..256; large logits with a scale that is not a power of two). Strided inputs (a
column slice of a wider block table, K/V caches as views of one (num_blocks, 2, block_size,
Hkv, D) tensor) are checked for every implementation too.
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import example, given, note, settings
from hypothesis import strategies as st

from inference_conformance.conformance.contracts.paged_attention import COVERAGE
from inference_conformance.conformance.device import triton_interpreted
from inference_conformance.conformance.laws import Kills, Law
from inference_conformance.conformance.tolerance import assert_exact
from inference_conformance.properties import strategies as S
from inference_conformance.properties.paged_attention.cases import (
    PagedCase,
    call,
    check_against_contiguous,
    fit_budget,
    make_inputs,
    paged_cases,
)
from inference_conformance.properties.strategies import KernelLaunchCapture

TECH = "paged_attention"
ZOO_ALL = ("ignores_partial_block", "reads_nan_slots", "identity_table", "off_by_one_length", "gqa_modulo",
           "walk_capped_64_blocks", "tiles_of_128_skip_block_tail")
#: Bugs only 16-bit inputs show: rejected in bfloat16.
ZOO_16BIT = ("scale_folded_in_16bit",)

#: tiny tensors: one intra-op thread is fastest and avoids OpenMP spin-waits between xdist workers
pytestmark = pytest.mark.usefixtures("one_torch_thread")

def _c(lens, Hq, Hkv, D, bs, c=0.7, **kw) -> PagedCase:
    return PagedCase(tuple(lens), Hq, Hkv, D, bs, c / math.sqrt(D), **kw)


#: Pinned: together they reject every zoo entry and reach every boundary class in every profile.
EXAMPLES = (
    _c((17, 130), 6, 2, 59, 2),                      # group 3, partial block, 65 blocks: kills all six
    _c((1, 32, 31, 33), 24, 1, 72, 16),              # length 1, multiples and one off, group 24
    _c((258,), 4, 2, 64, 1, spare_cols=0),           # block size 1, more than 128 blocks
    _c((64, 63), 8, 8, 192, 32, magnitude="large", amp=12.0, c=0.0625 * math.sqrt(192)),
    _c((300, 5), 8, 2, 256, 256, spare_blocks=0),    # block of 256, a sequence over two of them
    _c((10, 7, 1), 40, 2, 80, 5),                    # odd block, group 20
    _c((49, 2), 9, 3, 96, 7),
    _c((3, 193), 3, 1, 128, 3),                      # 65 blocks of 3
    # large logits (~1e2) with a scale that is not a power of two: a scale folded into q in 16
    # bits (q * scale rounded to bfloat16 / float16) moves them; the contract scales in float32
    _c((40, 23), 6, 2, 16, 5, magnitude="large", amp=12.0, c=0.3 * math.sqrt(16)),
    # blocks above 128 slots that are not multiples of 128, each length class over three blocks
    # (a multiple, one short, one past): a walk in tiles of 128 slots skips slots 128.. of each
    _c((432, 431, 289), 2, 1, 8, 144),
    _c((400, 599, 201), 3, 1, 16, 200),
)


def law_paged_equals_contiguous(run, device, dtype, case, seed):
    """PA-1: paged_attention over randomly placed blocks equals dense attention over the
    contiguous K/V (float64 reference), by the tolerance policy."""
    if run.interpreted:
        case = fit_budget(case)
    note(f"{case}")
    inp = make_inputs(case, seed, dtype, device)
    out = call(run.impl, inp, case, run=run)
    check_against_contiguous(out, inp, case)


#: PA-1's law: every implementation and dtype; the cases a run ran must reach every boundary
#: class of the contract (unless the implementation refused some). A Triton kernel under the
#: interpreter gets half the drawn examples (the pinned ones always run).
PA1 = Law(
    claim="PA-1", technique=TECH, body=law_paged_equals_contiguous,
    given={"case": paged_cases(), "seed": S.seeds},
    examples=tuple(dict(case=c, seed=i + 1) for i, c in enumerate(EXAMPLES)),
    dtypes=S.FLOAT_DTYPES,
    kills=(Kills(ZOO_ALL, (torch.float64,)), Kills(ZOO_16BIT, (torch.bfloat16,))),
    coverage=COVERAGE, require_coverage=True,
    interpreted_examples=lambda n: max(5, n // 2))

test_pa1_paged_equals_contiguous = PA1.conformance_test(
    "test_pa1_paged_equals_contiguous",
    doc="""PA-1 for every implementation and dtype; the cases the law ran must reach every boundary
    class of the contract (unless the implementation refused some).""")
test_pa1_zoo_rejected, test_pa1_zoo_rejected_bfloat16 = PA1.make_zoo_tests("test_pa1_zoo_rejected",
                                                                      "test_pa1_zoo_rejected_bfloat16")


@pytest.mark.claim("PA-1")
@pytest.mark.suite_own("the suite's pinned examples reach every boundary class")
def test_pa1_coverage_table():
    """The boundary classes each pinned example and the ``ci`` draws reach (reported)."""
    PA1.record_pinned_coverage("every class of the contract is reached in every Hypothesis profile")


# ----------------------------------------------- production-sized shapes, beyond the drawn ones
#: Shapes that the interpreter budget keeps out of the drawn cases, or that deserve a name.
PRODUCTION_CASES = {
    "bs16-B3-mixed-group8-D128": _c((1, 16, 47), 16, 2, 128, 16),
    "bs1-Tk200-group4-D64": _c((200, 9), 8, 2, 64, 1),
    "bs5-group24-D72": _c((26, 9, 5), 24, 1, 72, 5),
    "bs32-group20-D80": _c((65, 31), 40, 2, 80, 32),
    "bs256-D192": _c((257, 255), 4, 1, 192, 256, spare_blocks=1),
    "bs16-D96-Hkv8": _c((48, 17), 8, 8, 96, 16),
    "bs3-129-blocks-D256": _c((387,), 2, 1, 256, 3),
    # past 1024 tokens (a split dropped past the first 1024), a batch of five (rows from 4 on),
    # a long and a one-token sequence side by side (a split with no tokens: 0/0)
    "bs16-1025-tokens": _c((1025,), 1, 1, 1, 16),
    "B5-bs4-group2": _c((3, 7, 2, 9, 5), 4, 2, 16, 4),
    "bs16-513-and-1": _c((513, 1), 2, 1, 8, 16),
    # large logits with a scale that is not a power of two (0.09)
    "bs16-large-scale0.09-group4": _c((70, 33), 8, 2, 64, 16, magnitude="large", amp=12.0, c=0.09 * 8),
}


@pytest.mark.technique(TECH)
@pytest.mark.claim("PA-1")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", list(PRODUCTION_CASES))
def test_pa1_production_shapes(impl, device, dtype, name):
    case = PRODUCTION_CASES[name]
    inp = make_inputs(case, 17, dtype, device)
    check_against_contiguous(call(impl, inp, case), inp, case, what=f"paged attention at {name}")


# ------------------------------------------------------------------ strided (non-contiguous) inputs
def strided_inputs(inp, extra_cols: int = 3):
    """The same call with every input a strided view: the block table a column slice
    ``wide[:, :n]`` of a wider table (whose extra columns hold valid block ids, so a wrong row
    stride reads wrong blocks rather than out-of-range ones), k_cache / v_cache ``kv[:, 0]`` /
    ``kv[:, 1]`` of one (num_blocks, 2, block_size, Hkv, D) tensor (vLLM's layout), q a
    transposed view of (Hq, B, D) storage and seq_lens every other element of a longer tensor."""
    bt, kc = inp.block_table, inp.k_cache
    B, n = bt.shape
    ids = torch.arange(B * extra_cols, dtype=bt.dtype, device=bt.device).reshape(B, extra_cols)
    wide = torch.cat([bt, (kc.shape[0] - 1 - ids) % kc.shape[0]], dim=1)
    table = wide[:, :n]
    kv = torch.stack([kc, inp.v_cache], dim=1)                       # (num_blocks, 2, bs, Hkv, D)
    q = inp.q.transpose(0, 1).contiguous().transpose(0, 1)
    lens = torch.stack([inp.seq_lens, torch.full_like(inp.seq_lens, -5)], dim=1).reshape(-1)[::2]
    out = dataclasses.replace(inp, q=q, k_cache=kv[:, 0], v_cache=kv[:, 1], block_table=table, seq_lens=lens)
    assert not any(t.is_contiguous() for t in (out.k_cache, out.v_cache, out.block_table, out.seq_lens))
    assert not q.is_contiguous() or B == 1
    return out


#: Three sequences (one over a partial block), GQA group 2, blocks of 4 in a pool with spares.
STRIDED_CASE = _c((37, 20, 9), 4, 2, 16, 4, spare_blocks=2, spare_cols=1)


def law_strided_inputs(run, device, dtype=torch.float32):
    """PA-1 with strided inputs (:func:`strided_inputs`): the same result as the contiguous
    tensors (kernels must use the strides they are given, not ones computed from the shape)."""
    inp = strided_inputs(make_inputs(STRIDED_CASE, 31, dtype, device))
    check_against_contiguous(call(run.impl, inp, STRIDED_CASE, run=run), inp, STRIDED_CASE,
                             what="paged attention, strided block table, caches, q and seq_lens")


#: PA-1 on one pinned strided call (no drawn arguments), float32.
PA1_STRIDED = Law(claim="PA-1", technique=TECH, body=law_strided_inputs, params=("device",),
                  kills=(Kills(("table_stride_from_shape", "cache_strides_from_shape")),))

test_pa1_noncontiguous_inputs = PA1_STRIDED.conformance_test("test_pa1_noncontiguous_inputs", doc="")
(test_pa1_noncontiguous_zoo_rejected,) = PA1_STRIDED.make_zoo_tests("test_pa1_noncontiguous_zoo_rejected")


# ------------------------------------------------------------ element offsets past 2^31
#: Two sequences whose blocks all lie past element 2^31 of the caches (kv[:, 0] and kv[:, 1] of one
#: lazily allocated tensor: block stride 512 elements, the pool from block 4,194,304 on; only the
#: pool's pages are touched), bfloat16.
FAR_CASE = _c((37, 20), 4, 2, 8, 16, far_blocks=True)


def law_offsets_past_2_31(run, device, dtype=torch.bfloat16):
    """PA-1 with every live block past element 2^31 of the caches: block id x block stride must
    not be computed in 32 bits."""
    inp = make_inputs(FAR_CASE, 41, dtype, device)
    check_against_contiguous(call(run.impl, inp, FAR_CASE, run=run), inp, FAR_CASE,
                             what="paged attention, blocks past element 2^31")


#: PA-1 on one pinned call with offsets past 2^31 (no drawn arguments), bfloat16.
PA1_FAR = Law(claim="PA-1", technique=TECH, body=law_offsets_past_2_31, params=("device",),
              kills=(Kills(("block_offsets_in_int32",)),))

test_pa1_offsets_past_2_31 = PA1_FAR.conformance_test("test_pa1_offsets_past_2_31", doc="")
(test_pa1_offsets_past_2_31_zoo_rejected,) = PA1_FAR.make_zoo_tests("test_pa1_offsets_past_2_31_zoo_rejected")


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
    k = S.randn((3, FAR_CASE.Hkv, FAR_CASE.D), 5, dtype=torch.bfloat16, device=device)
    v = S.randn((3, FAR_CASE.Hkv, FAR_CASE.D), 6, dtype=torch.bfloat16, device=device)
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
@given(case=paged_cases(), seed=S.seeds, num_splits=st.integers(1, 4),
       dtype=st.sampled_from([torch.float64, torch.float32, torch.float16]))
@example(case=_c((130, 17), 6, 2, 59, 2), seed=1, num_splits=3, dtype=torch.float32)
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
       D=st.sampled_from([1, 8, 72]), seed=S.seeds,
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
    k = S.randn((n, hkv, D), seed, dtype=dtype, device=device)
    v = S.randn((n, hkv, D), seed + 1, dtype=dtype, device=device)
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
            ks.append(S.randn((Hkv, D), seed + 2 * i, dtype=dt, device=device))
            vs.append(S.randn((Hkv, D), seed + 2 * i + 1, dtype=dt, device=device))
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
    q = S.randn((2, Hq, D), 7, dtype=dt, device=device)
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
    case = _c((5, 3), 2, 1, 4, 2, spare_blocks=0)
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
    case = _c((40, 9), 4, 2, 16, 4, c=0.3)
    inp = make_inputs(case, 29, torch.float64, device)
    check_against_contiguous(pa.paged_attention(*inp.args(), scale=case.scale, num_splits=2), inp, case,
                             what="float64 Triton paged attention")
    floats = [a for a in seen if isinstance(a, float)]
    assert floats, "no float argument recorded"
    rounded = [a for a in floats if float(torch.tensor(a, dtype=torch.float32)) != a]
    assert not rounded, f"the float64 paged kernel was handed floats that float32 rounds: {rounded}"
