"""The laws of paged attention (claim PA-1; lecture 001 §4.2, Kwon et al. 2023). The mixed batch
(PA-8) is in ``prefill.py``, the options (FA-8) in ``options.py``.

PA-1: attention through a block table over non-contiguous blocks equals attention over the
contiguous cache, for any block size and any placement of blocks. Every law is written against
the ``paged_attention`` contract (``conformance/contracts/paged_attention/contract.py``) and runs over
every registered implementation; blocks are placed by random permutations over a pool larger
than needed, unused table entries are out of range and unused slots NaN (``cases.py``). The
known-bad implementations (``zoo.py``) are each shown rejected. Strided inputs (a column slice of
a wider block table, K/V caches as views of one (num_blocks, 2, block_size, Hkv, D) tensor) and
block offsets past 2^31 are checked for every implementation too.
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from inference_conformance.conformance.contracts.paged_attention import COVERAGE
from inference_conformance.conformance.laws import Kills, Law
from inference_conformance.properties import strategies
from inference_conformance.properties.kernel_law import kernel_law
from inference_conformance.properties.paged_attention.cases import (
    call,
    check_against_contiguous,
    fit_budget,
    make_inputs,
    paged_case,
    paged_cases,
)

TECH = "paged_attention"
ZOO_ALL = ("ignores_partial_block", "reads_nan_slots", "identity_table", "off_by_one_length", "gqa_modulo",
           "walk_capped_64_blocks", "tiles_of_128_skip_block_tail")
#: Bugs only 16-bit inputs show: rejected in bfloat16.
ZOO_16BIT = ("scale_folded_in_16bit",)

#: tiny tensors: one intra-op thread is fastest and avoids OpenMP spin-waits between xdist workers
pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: Pinned: together they reject every zoo entry and reach every boundary class in every profile.
EXAMPLES = (
    paged_case((17, 130), 6, 2, 59, 2),                      # group 3, partial block, 65 blocks: kills all six
    paged_case((1, 32, 31, 33), 24, 1, 72, 16),              # length 1, multiples and one off, group 24
    paged_case((258,), 4, 2, 64, 1, spare_cols=0),           # block size 1, more than 128 blocks
    paged_case((64, 63), 8, 8, 192, 32, magnitude="large", amp=12.0, c=0.0625 * math.sqrt(192)),
    paged_case((300, 5), 8, 2, 256, 256, spare_blocks=0),    # block of 256, a sequence over two of them
    paged_case((10, 7, 1), 40, 2, 80, 5),                    # odd block, group 20
    paged_case((49, 2), 9, 3, 96, 7),
    paged_case((3, 193), 3, 1, 128, 3),                      # 65 blocks of 3
    # large logits (~1e2) with a scale that is not a power of two: a scale folded into q in 16
    # bits (q * scale rounded to bfloat16 / float16) moves them; the contract scales in float32
    paged_case((40, 23), 6, 2, 16, 5, magnitude="large", amp=12.0, c=0.3 * math.sqrt(16)),
    # blocks above 128 slots that are not multiples of 128, each length class over three blocks
    # (a multiple, one short, one past): a walk in tiles of 128 slots skips slots 128.. of each
    paged_case((432, 431, 289), 2, 1, 8, 144),
    paged_case((400, 599, 201), 3, 1, 16, 200),
)


law_paged_equals_contiguous = kernel_law(
    "law_paged_equals_contiguous",
    """PA-1: paged_attention over randomly placed blocks equals dense attention over the
    contiguous K/V (float64 reference), by the tolerance policy.""",
    fit=fit_budget, inputs=make_inputs, call=call, check=check_against_contiguous)


#: PA-1's law: every implementation and dtype; the cases a run ran must reach every boundary
#: class of the contract (unless the implementation refused some). A Triton kernel under the
#: interpreter gets half the drawn examples (the pinned ones always run).
PA1 = Law(
    claim="PA-1", technique=TECH, body=law_paged_equals_contiguous,
    given={"case": paged_cases(), "seed": strategies.seeds},
    examples=tuple(dict(case=c, seed=i + 1) for i, c in enumerate(EXAMPLES)),
    dtypes=strategies.FLOAT_DTYPES,
    kills=(Kills(ZOO_ALL, (torch.float64,)), Kills(ZOO_16BIT, (torch.bfloat16,))),
    coverage=COVERAGE, require_coverage=True,
    interpreted_examples=lambda n: max(5, n // 2),
    test="test_pa1_paged_equals_contiguous",
    doc="""PA-1 for every implementation and dtype; the cases the law ran must reach every boundary
    class of the contract (unless the implementation refused some).""",
    zoo_tests=("test_pa1_zoo_rejected", "test_pa1_zoo_rejected_bfloat16"))


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
STRIDED_CASE = paged_case((37, 20, 9), 4, 2, 16, 4, spare_blocks=2, spare_cols=1)


def law_strided_inputs(run, device, dtype=torch.float32):
    """PA-1 with strided inputs (:func:`strided_inputs`): the same result as the contiguous
    tensors (kernels must use the strides they are given, not ones computed from the shape)."""
    inp = strided_inputs(make_inputs(STRIDED_CASE, 31, dtype, device))
    check_against_contiguous(call(run.impl, inp, STRIDED_CASE, run=run), inp, STRIDED_CASE,
                             what="paged attention, strided block table, caches, q and seq_lens")


#: PA-1 on one pinned strided call (no drawn arguments), float32.
PA1_STRIDED = Law(claim="PA-1", technique=TECH, body=law_strided_inputs, params=("device",),
                  kills=(Kills(("table_stride_from_shape", "cache_strides_from_shape")),),
    test="test_pa1_noncontiguous_inputs", zoo_tests=("test_pa1_noncontiguous_zoo_rejected",))



# ------------------------------------------------------------ element offsets past 2^31
#: Two sequences whose blocks all lie past element 2^31 of the caches (kv[:, 0] and kv[:, 1] of one
#: lazily allocated tensor: block stride 512 elements, the pool from block 4,194,304 on; only the
#: pool's pages are touched), bfloat16.
FAR_CASE = paged_case((37, 20), 4, 2, 8, 16, far_blocks=True)


def law_offsets_past_2_31(run, device, dtype=torch.bfloat16):
    """PA-1 with every live block past element 2^31 of the caches: block id x block stride must
    not be computed in 32 bits."""
    inp = make_inputs(FAR_CASE, 41, dtype, device)
    check_against_contiguous(call(run.impl, inp, FAR_CASE, run=run), inp, FAR_CASE,
                             what="paged attention, blocks past element 2^31")


#: PA-1 on one pinned call with offsets past 2^31 (no drawn arguments), bfloat16.
PA1_FAR = Law(claim="PA-1", technique=TECH, body=law_offsets_past_2_31, params=("device",),
              kills=(Kills(("block_offsets_in_int32",)),),
    test="test_pa1_offsets_past_2_31", zoo_tests=("test_pa1_offsets_past_2_31_zoo_rejected",))
