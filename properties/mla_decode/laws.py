"""The law of MLA decode over the latent cache (claim KV-12; DeepSeek-V2 §2.1, CS336 lecture 10
part 3), over every registered implementation of the ``mla_decode`` contract
(``conformance/contracts/mla_decode.py``) in every dtype, on the drawn and pinned cases of
``cases.py`` that reach the contract's boundary classes.

Its zoo tests reject every known-bad MLA decode implementation (``zoo.py``) by the law's own
comparison with the float64 reference over the materialised keys: the query's RoPE part rotated at
the wrong position, the cached RoPE keys rotated again, the no-RoPE query not absorbed or absorbed
with another head's up-projection, the split merge without rescale, a paged cache read without its
block table or through sequence 0's row, and query heads past 16 reading those of the first head
tile (in float64); the RoPE, absorption and merge bugs in bfloat16 too, by the contract's 16-bit
rule.
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.conformance.contracts.mla_decode import COVERAGE
from inference_conformance.conformance.laws import Kills, Law
from inference_conformance.properties import strategies
from inference_conformance.properties.kernel_law import kernel_law
from inference_conformance.properties.mla_decode.cases import (
    EXAMPLES,
    call,
    check_against_materialised,
    fit_budget,
    make_inputs,
    mla_cases,
)

#: tiny tensors: one intra-op thread is fastest and avoids OpenMP spin-waits between xdist workers
pytestmark = pytest.mark.usefixtures("one_torch_thread")

law_matches_materialised = kernel_law(
    "law_matches_materialised",
    """KV-12: mla_decode over the latent cache (contiguous or paged, any split) equals attention
    over the materialised keys and latent values (float64 reference), by the tolerance policy.""",
    fit=fit_budget, inputs=make_inputs, call=call, check=check_against_materialised)

#: The conformance test's docstring.
TEST_DOC = """KV-12 for every implementation and dtype: MLA decode over the latent cache (contiguous and
    paged, any split) equals the float64 reference over the materialised keys."""

#: The known-bad implementations KV-12's law rejects in float64 (properties/mla_decode/zoo.py).
ZOO = ("query_rope_position_off_by_one", "cached_rope_rotated_again", "nope_not_absorbed",
       "absorbed_with_head0_projection", "split_merge_without_rescale", "block_table_ignored",
       "head_tile_wraps_at_16", "block_table_row_of_sequence_0")

#: The entries KV-12's law also rejects in bfloat16, by the contract's 16-bit rule.
ZOO_16BIT = ("query_rope_position_off_by_one", "nope_not_absorbed", "split_merge_without_rescale")

#: KV-12's law over every implementation and dtype; a Triton kernel under the interpreter gets
#: a third of the drawn examples (the pinned ones always run).
KV12 = Law(
    claim="KV-12", technique="mla_decode", body=law_matches_materialised,
    given={"case": mla_cases(), "seed": strategies.seeds},
    examples=tuple(dict(case=c, seed=i + 1) for i, c in enumerate(EXAMPLES)),
    dtypes=strategies.FLOAT_DTYPES,
    kills=(Kills(ZOO, (torch.float64,)),
           Kills(ZOO_16BIT, (torch.bfloat16,), doc="The 16-bit rule (mla-decode-16bit) sees the RoPE, absorption "
                                                     "and merge bugs in bfloat16 too.")),
    coverage=COVERAGE,
    interpreted_examples=lambda n: max(4, n // 3),
    test="test_kv12_matches_materialised", doc=TEST_DOC,
    zoo_tests=("test_kv12_zoo_rejected", "test_kv12_zoo_rejected_bfloat16"))
