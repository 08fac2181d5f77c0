"""KV-12's law rejects every known-bad MLA decode implementation (``properties/mla_decode/zoo.py``)
by its own comparison with the float64 reference over the materialised keys: the query's RoPE
part rotated at the wrong position, the cached RoPE keys rotated again, the no-RoPE query not
absorbed or absorbed with another head's up-projection, the split merge without rescale, a
paged cache read without its block table or through sequence 0's row, and query heads past 16
reading those of the first head tile (in float64); the RoPE, absorption and merge bugs in
bfloat16 too, by the contract's 16-bit rule."""
from __future__ import annotations

import pytest

from inference_conformance.properties.mla_decode.cases import KV12

pytestmark = pytest.mark.usefixtures("one_torch_thread")

test_kv12_zoo_rejected, test_kv12_zoo_rejected_bfloat16 = KV12.make_zoo_tests("test_kv12_zoo_rejected",
                                                                        "test_kv12_zoo_rejected_bfloat16")
