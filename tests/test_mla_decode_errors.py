"""What only the suite's own MLA decode built-ins promise about bad input (the contract's documented
bad calls run on every implementation in ``properties/test_contract_generic.py``): the Triton
kernel's host wrapper refuses a bad ``num_splits`` and names the argument, and every built-in
(reference, torch, Triton) raises the contract's errors with their exact wording before anything
runs: a live block-table entry out of range names the entry and the sequence, an odd RoPE dim
names R, a contiguous cache of another batch names its expected shape."""
from __future__ import annotations

import pytest
import torch

from inference_conformance.conformance.contracts.mla_decode import _inputs
from inference_conformance.optimized.mla_decode import split_kv, vectorized
from inference_conformance.reference import mla_decode as ref

BUILTINS = [pytest.param(ref.mla_decode, id="reference"), pytest.param(vectorized.mla_decode, id="torch"),
            pytest.param(split_kv.mla_decode, id="triton")]
KW = {"scale": 0.3, "rope_theta": 10000.0}


def _args(block_size=4):
    return list(_inputs(torch.Generator().manual_seed(0), (5, 3), 4, 8, 12, 4, block_size))


@pytest.mark.parametrize("num_splits", [0, -1, 2.0, True, "2"])
def test_triton_rejects_a_bad_num_splits(num_splits):
    with pytest.raises(ValueError, match="num_splits must be an int >= 1 or None"):
        split_kv.mla_decode(*_args(), num_splits=num_splits, **KW)


@pytest.mark.parametrize("fn", BUILTINS)
def test_live_block_out_of_range_names_the_entry(fn):
    args = _args()
    args[4][1, 0] = args[3].shape[0]
    with pytest.raises(ValueError, match=r"block_table\[1, 0\] = \d+ is a live block of sequence 1"):
        fn(*args, **KW)


@pytest.mark.parametrize("fn", BUILTINS)
def test_dead_table_entries_out_of_range_are_not_an_error(fn):
    """Entries past a sequence's blocks may hold anything (the contract): -1 and 2**31 - 1 pass."""
    args = _args()
    args[4][0, 2:] = -1
    args[4][1, 1:] = 2**31 - 1
    out = fn(*args, **KW)
    assert out.shape == (2, 4, 12) and bool(torch.isfinite(out).all())


@pytest.mark.parametrize("fn", BUILTINS)
def test_odd_rope_dim_names_r(fn):
    args = _args()
    args[1] = args[1][..., :3]
    args[3] = args[3][..., :15]
    with pytest.raises(ValueError, match="q_rope's RoPE dim R must be even"):
        fn(*args, **KW)


@pytest.mark.parametrize("fn", BUILTINS)
def test_contiguous_cache_of_another_batch(fn):
    args = _args(block_size=None)
    args[3] = args[3][:1]
    with pytest.raises(ValueError, match=r"contiguous cache \(block_table None\) must have shape \(B, T_max, C \+ R\)"):
        fn(*args, **KW)


@pytest.mark.parametrize("fn", BUILTINS)
def test_w_uk_of_the_wrong_layout_names_it(fn):
    """w_uk is (Hq, C, D): a (Hq, D, C) weight (the transposed up-projection) is refused."""
    args = _args()
    args[2] = args[2].transpose(1, 2)
    with pytest.raises(ValueError, match=r"w_uk must have shape \(Hq, C, D\)"):
        fn(*args, **KW)
