"""What only the suite's own tree-attention built-ins promise about bad input (the contract's
documented bad calls run on every implementation in ``properties/test_contract_generic.py``): the
Triton kernel's host wrapper and the torch built-in raise TypeError / ValueError naming the
argument before any launch, in the contract's wording; the kernel refuses a tree of more nodes than
one tile holds with NotImplementedError ("unsupported"), never a wrong answer."""
from __future__ import annotations

import pytest
import torch

from inference_conformance.optimized.tree_attention import fused, vectorized


def _args():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 3, 8, generator=g)
    k = torch.randn(2, 2, 10, 8, generator=g)
    v = torch.randn(2, 2, 10, 8, generator=g)
    return q, k, v, torch.tensor([-1, 0, 0]), torch.tensor([4, 7])


BAD = {  # what -> (argument index, replacement, exception, the message's words)
    "q-not-a-tensor": (0, [[0.0]], TypeError, "q must be a torch.Tensor"),
    "k-cache-3-d": (1, torch.zeros(2, 10, 8), ValueError, "k_cache must have 4 dimensions"),
    "v-cache-dtype": (2, torch.zeros(2, 2, 10, 8, dtype=torch.float64), TypeError, "v_cache has dtype"),
    "heads-not-divisible": (1, torch.zeros(2, 3, 10, 8), ValueError, "k_cache must have shape"),
    "parent-after-child": (3, torch.tensor([-1, 2, 0]), ValueError, r"parents\[1\] = 2 must lie in \[-1, 1\)"),
    "parents-float": (3, torch.tensor([-1.0, 0.0, 0.0]), TypeError, "parents must be int32 or int64"),
    "tree-past-the-cache": (4, torch.tensor([4, 8]), ValueError, r"prefix_lens\[1\] = 8 must lie in \[0, S_max"),
    "prefix-lens-shape": (4, torch.tensor([4]), ValueError, "prefix_lens must have shape"),
}


@pytest.mark.parametrize("fn", [fused.tree_attention, vectorized.tree_attention], ids=["triton", "torch"])
@pytest.mark.parametrize("what", sorted(BAD))
def test_tree_attention_rejects_bad_input_naming_the_argument(fn, what):
    i, value, exc, words = BAD[what]
    args = list(_args())
    args[i] = value
    with pytest.raises(exc, match=words):
        fn(*args, scale=0.3)


def test_triton_kernel_refuses_more_nodes_than_one_tile():
    q, k, v, _, lens = _args()
    n = fused.MAX_NODES + 1
    q = torch.randn(2, 4, n, 8)
    k = v = torch.zeros(2, 2, 8 + n, 8)
    with pytest.raises(NotImplementedError, match=f"at most {fused.MAX_NODES} nodes"):
        fused.tree_attention(q, k, v, torch.arange(-1, n - 1), lens, scale=0.3)
