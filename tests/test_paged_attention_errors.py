"""Bad input to paged attention and to the paged cache write: a clear TypeError / ValueError
that names the argument, raised before any kernel launch (the cache stays unchanged)."""
from __future__ import annotations

import pytest
import torch

from inference_conformance.properties.paged_attention.cases import PagedCase, make_inputs
from inference_conformance.reference import paged_attention as paged

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _impls():
    out = {"reference": "inference_conformance.reference.paged_attention:paged_attention"}
    try:
        import inference_conformance.optimized.paged_attention  # noqa: F401
        out["triton"] = "inference_conformance.optimized.paged_attention:paged_attention"
    except ImportError:
        pass
    return out


IMPLS = _impls()


def _load(target):
    from inference_conformance.conformance.registry import _resolve

    return _resolve(target)


@pytest.fixture
def call_args(device):
    """A valid call: two sequences (lengths 5 and 3), blocks of 2, Hq 4, Hkv 2, D 16."""
    case = PagedCase((5, 3), 4, 2, 16, 2, 0.25)
    return make_inputs(case, 3, torch.float32, device).args()


def _i32(x, device):
    return torch.tensor(x, dtype=torch.int32, device=device)


CASES = {
    "q not a tensor": (lambda a, d: (a[0].tolist(),) + a[1:], TypeError, "q must be a torch.Tensor"),
    "q rank": (lambda a, d: (a[0][None],) + a[1:], ValueError, r"q must have 3 dimensions"),
    "int64 block_table": (lambda a, d: a[:3] + (a[3].long(), a[4]), TypeError, "block_table must be int32"),
    "int64 seq_lens": (lambda a, d: a[:4] + (a[4].long(),), TypeError, "seq_lens must be int32"),
    "mixed dtypes": (lambda a, d: (a[0], a[1].double(), a[2].double()) + a[3:], TypeError, "must share one dtype"),
    "integer caches": (lambda a, d: (a[0], a[1].int(), a[2].int()) + a[3:], TypeError, "k_cache has dtype"),
    "block sizes differ": (lambda a, d: (a[0], a[1], a[2][:, :1]) + a[3:], ValueError, "same shape"),
    "head dims differ": (lambda a, d: (a[0][..., :8],) + a[1:], ValueError, "head dim"),
    "Hq not a multiple of Hkv": (lambda a, d: (a[0][:, :3],) + a[1:], ValueError, r"multiple of the caches' KV heads"),
    "seq_lens 0": (lambda a, d: a[:4] + (_i32([5, 0], d),), ValueError, r"seq_lens\[1\] = 0"),
    "seq_lens above capacity": (lambda a, d: a[:4] + (_i32([5, 2 * a[3].shape[1] + 1], d),), ValueError,
                                r"seq_lens must lie in \[1, max_blocks \* block_size\]"),
    "seq_lens shape": (lambda a, d: a[:4] + (_i32([5], d),), ValueError, r"seq_lens must have shape \(B,\)"),
    "block_table rows": (lambda a, d: a[:3] + (a[3][:1], a[4]), ValueError, r"block_table must have shape \(B=2"),
    "live entry out of range": (lambda a, d: a[:3] + (_with(a[3], (1, 1), a[1].shape[0]), a[4]), ValueError,
                                r"block_table\[1, 1\] = \d+ is a live block"),
    "live entry negative": (lambda a, d: a[:3] + (_with(a[3], (0, 2), -1), a[4]), ValueError,
                            r"block_table\[0, 2\] = -1 is a live block"),
    "scale not a number": (lambda a, d: a, TypeError, "scale must be a real number"),
    # float32 inputs: scores are computed in float32, where 1e40 is inf (the kernel gave all NaN)
    "scale past float32": (lambda a, d: a, ValueError, "scale must be representable in float32"),
}
#: The scale each case passes (the others: 0.25).
BAD_SCALES = {"scale not a number": "0.25", "scale past float32": 1e40}


def _with(t, idx, value):
    t = t.clone()
    t[idx] = value
    return t


@pytest.mark.parametrize("which", list(IMPLS))
@pytest.mark.parametrize("what", list(CASES))
def test_paged_attention_rejects_bad_input(which, what, call_args, device):
    fn = _load(IMPLS[which])
    make, error, match = CASES[what]
    args = make(call_args, device)
    scale = BAD_SCALES.get(what, 0.25)
    with pytest.raises(error, match=match):
        fn(*args, scale=scale)


@pytest.mark.parametrize("which", list(IMPLS))
def test_unused_entries_and_slots_are_not_errors(which, call_args):
    """Entries past a sequence's blocks may hold anything (out of range included): no error."""
    fn = _load(IMPLS[which])
    q, kc, vc, bt, sl = call_args
    bt = bt.clone()
    bt[1, 2:] = 10**6
    out = fn(q, kc, vc, bt, sl, scale=0.25)
    assert torch.isfinite(out).all()


def test_allocator_rejects_double_free_and_bad_ids():
    a = paged.BlockAllocator(4, 16)
    b = a.allocate()
    a.free(b)
    with pytest.raises(ValueError, match="double free"):
        a.free(b)
    with pytest.raises(ValueError, match=r"outside \[0, num_blocks\)"):
        a.free(9)
    with pytest.raises(ValueError, match="is free"):
        a.share(b)
    with pytest.raises(ValueError, match="num_blocks must be an int >= 1"):
        paged.BlockAllocator(0, 16)
    with pytest.raises(ValueError, match="block_size must be an int >= 1"):
        paged.BlockAllocator(4, 0)
    for _ in range(4):
        a.allocate()
    with pytest.raises(paged.OutOfBlocks):
        a.allocate()


def test_cache_rejects_bad_positions_and_unknown_sequences():
    c = paged.PagedKVCache(4, 2, kv_shape=(1, 3))
    c.new_sequence("a")
    c.append("a", torch.ones(1, 3), torch.ones(1, 3))
    with pytest.raises(ValueError, match="unknown sequence"):
        c.append("b", torch.ones(1, 3), torch.ones(1, 3))
    with pytest.raises(ValueError, match=r"position 1 outside \[0, 1\)"):
        c.write("a", 1, torch.ones(1, 3), torch.ones(1, 3))
    with pytest.raises(ValueError, match=r"k must be a tensor of shape \(Hkv, D\) = \(1, 3\)"):
        c.append("a", torch.ones(3), torch.ones(1, 3))
    assert c.length("a") == 1, "a rejected append must not change the length"
    with pytest.raises(ValueError, match="already exists"):
        c.fork("a", "a")


def _write_args(device):
    kc = torch.full((3, 2, 2, 4), float("nan"), device=device)
    vc = kc.clone()
    k = torch.ones(2, 2, 4, device=device)
    return kc, vc, k, k.clone(), torch.tensor([0, 5], dtype=torch.int32, device=device)


WRITE_CASES = {
    "slot out of range": (lambda a: a[:4] + (torch.tensor([0, 6], dtype=torch.int32, device=a[0].device),),
                          ValueError, r"slot_mapping\[1\] = 6 outside \[0, num_blocks \* block_size\) = \[0, 6\)"),
    "negative slot": (lambda a: a[:4] + (torch.tensor([-1, 2], dtype=torch.int32, device=a[0].device),),
                      ValueError, r"slot_mapping\[0\] = -1"),
    "slot twice": (lambda a: a[:4] + (torch.tensor([3, 3], dtype=torch.int32, device=a[0].device),),
                   ValueError, "names a slot twice"),
    "float slots": (lambda a: a[:4] + (a[4].float(),), TypeError, "slot_mapping must be int32 or int64"),
    "slot count": (lambda a: a[:4] + (a[4][:1],), ValueError, r"slot_mapping must have shape \(N,\) = \(2,\)"),
    "k dtype": (lambda a: (a[0], a[1], a[2].double(), a[3], a[4]), TypeError, "k has dtype"),
    "k heads": (lambda a: (a[0], a[1], a[2][:, :1], a[3][:, :1], a[4]), ValueError, r"k must have shape \(N, Hkv, D\)"),
    "caches differ": (lambda a: (a[0], a[1][:, :1], a[2], a[3], a[4]), ValueError, "must have one shape"),
    "k_cache is v_cache": (lambda a: (a[0], a[0]) + a[2:], ValueError, "v_cache must be a separate buffer"),
    # one block of slots expanded over all blocks: a write to block 0 would show in every block
    "k_cache expanded over blocks": (lambda a: (a[0][:1].expand_as(a[0]),) + a[1:], ValueError,
                                     r"k_cache has stride 0 along dimension 0"),
    "v_cache expanded over blocks": (lambda a: (a[0], a[1][:1].expand_as(a[1])) + a[2:], ValueError,
                                     r"v_cache has stride 0 along dimension 0"),
}


@pytest.mark.parametrize("what", list(WRITE_CASES))
def test_write_kv_cache_rejects_bad_input_and_writes_nothing(what, device):
    pa = pytest.importorskip("inference_conformance.optimized.paged_attention")
    make, error, match = WRITE_CASES[what]
    args = make(_write_args(device))
    kc0 = args[0].clone()
    with pytest.raises(error, match=match):
        pa.write_kv_cache(*args)
    assert torch.isnan(args[0]).all() and torch.isnan(kc0).all(), "a rejected write changed the cache"


def test_paged_attention_rejects_bad_num_splits(call_args):
    pa = pytest.importorskip("inference_conformance.optimized.paged_attention")
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="num_splits must be an int >= 1"):
            pa.paged_attention(*call_args, scale=0.25, num_splits=bad)


# ------------------------------------------------------------------ the mixed batch (paged_prefill)
PREFILL_IMPLS = {"reference": "inference_conformance.reference.paged_attention:paged_prefill"}
if "triton" in IMPLS:
    PREFILL_IMPLS["triton"] = "inference_conformance.optimized.paged_attention.prefill:paged_prefill"


@pytest.fixture
def prefill_args(device):
    """A valid mixed batch: sequences of 5 and 3 tokens, chunks of 4 and 1 query tokens
    (query_start_loc [0, 4, 5]), blocks of 2, Hq 4, Hkv 2, D 16."""
    from inference_conformance.properties.paged_attention.cases import PrefillCase, make_prefill_inputs

    return make_prefill_inputs(PrefillCase((5, 3), (4, 1), 4, 2, 16, 2, 0.25), 3, torch.float32, device).args()


PREFILL_CASES = {
    "query_start_loc not a tensor": (lambda a, d: a[:5] + ([0, 4, 5],), TypeError, "query_start_loc must be a torch.Tensor"),
    "int64 query_start_loc": (lambda a, d: a[:5] + (a[5].long(),), TypeError, "query_start_loc must be int32"),
    "query_start_loc shape": (lambda a, d: a[:5] + (_i32([0, 5], d),), ValueError,
                              r"query_start_loc must have shape \(B \+ 1,\) = \(3,\)"),
    "query_start_loc from 1": (lambda a, d: a[:5] + (_i32([1, 4, 5], d),), ValueError, "must start at 0"),
    "an empty chunk": (lambda a, d: a[:5] + (_i32([0, 0, 5], d),), ValueError, "strictly increasing"),
    "not ending at N": (lambda a, d: a[:5] + (_i32([0, 3, 4], d),), ValueError, r"must end at N = q.shape\[0\] = 5"),
    "chunk longer than the sequence": (lambda a, d: (torch.cat([a[0], a[0][:1]]),) + a[1:5] + (_i32([0, 2, 6], d),),
                                       ValueError, r"sequence 1 4 query tokens, more than its seq_lens\[1\] = 3"),
    "q rank": (lambda a, d: (a[0][:, 0],) + a[1:], ValueError, r"q must have 3 dimensions \(N, Hq, D\)"),
    "seq_lens shape": (lambda a, d: a[:4] + (_i32([[5, 3]], d), a[5]), ValueError, r"seq_lens must have shape \(B,\)"),
    "live entry out of range": (lambda a, d: a[:3] + (_with(a[3], (1, 1), a[1].shape[0]),) + a[4:], ValueError,
                                r"block_table\[1, 1\] = \d+ is a live block"),
}


@pytest.mark.parametrize("which", list(PREFILL_IMPLS))
@pytest.mark.parametrize("what", list(PREFILL_CASES))
def test_paged_prefill_rejects_bad_input(which, what, prefill_args, device):
    fn = _load(PREFILL_IMPLS[which])
    make, error, match = PREFILL_CASES[what]
    with pytest.raises(error, match=match):
        fn(*make(prefill_args, device), scale=0.25)


def test_paged_prefill_rejects_bad_num_splits(prefill_args):
    pp = pytest.importorskip("inference_conformance.optimized.paged_attention.prefill")
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="num_splits must be an int >= 1"):
            pp.paged_prefill(*prefill_args, scale=0.25, num_splits=bad)


def test_batch_invariant_mode_rejects_num_splits(call_args, prefill_args):
    """The batch-invariant mode ("triton_invariant") fixes its split size: a ``num_splits`` with
    it is a ValueError naming it, in the decode and the mixed-batch kernel."""
    pa = pytest.importorskip("inference_conformance.optimized.paged_attention")
    pp = pytest.importorskip("inference_conformance.optimized.paged_attention.prefill")
    with pytest.raises(ValueError, match="num_splits must be None with batch_invariant"):
        pa.paged_attention(*call_args, scale=0.25, num_splits=2, batch_invariant=True)
    with pytest.raises(ValueError, match="num_splits must be None with batch_invariant"):
        pp.paged_prefill(*prefill_args, scale=0.25, num_splits=2, batch_invariant=True)
