"""A lossy KV cache is held to the per-value error it declares, never excused (KV-1, KV-4;
``properties/kv_cache/lossy.py``): one-bug FP8 caches (``tests/one_bug_impls.py``) on the pinned
batch (different lengths, GQA group 3, head dim 6, two layers).

- ``fp8_kv`` (correct: float8_e4m3fn codes, 1 byte, 2^-4 declared) passes KV-1 within the
  derived bound, KV-4's values at every layer, KV-10 (batched and lone logits within the bound)
  and KV-2 (each sampled token one the reference could sample from logits within the bound),
  where KV-2 and KV-10 read "unsupported: differs by design" before;
- the same cache declaring more error than its bytes can make (8 on 4-byte values: the zoo's
  ``rope_off_after_64_declared_lossy``; 2^-4 on values held in float32) fails every law on its
  declaration, never "unsupported";
- ``fp8_kv_layer0`` (every layer's attention reads layer 0's keys and values) fails KV-1 (5.7 x
  the derived bound), KV-10 (5.7 x) and KV-2 (a token that needs 2.2 x the bound's logit shift),
  where KV-2 and KV-10 read "unsupported: differs by design" before;
- ``fp8_kv_codes`` (attention reads the FP8 codes without their scale) fails KV-1 and KV-4;
- ``fp8_kv_undeclared`` (no per-value error declared) fails KV-1, KV-4 and KV-10: never
  "unsupported".
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.conformance import registry
from inference_conformance.conformance.failures import LawFailure
from inference_conformance.properties.kv_cache.cases import PINNED
from inference_conformance.properties.kv_cache.laws import KV1, KV1_LONG, KV2, KV4, KV10

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ONE = (dict(case=PINNED),)


def _impl(name: str):
    return registry.load_outside("kv_cache", f"tests.one_bug_impls:{name}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_correct_fp8_cache_holds_its_declared_bound(dtype):
    """KV-1 (logits within the derived bound), KV-4 (values at every layer), KV-10 and KV-2 hold."""
    for law, examples in ((KV1, ONE), (KV4, ONE), (KV10, ONE), (KV2, KV2.examples)):
        run = law.with_examples(examples)(_impl("fp8_kv"), "cpu", dtype)
        assert run.ran == 1 and not run.refused, law.claim


@pytest.mark.parametrize("law, what, check", [(KV1, r"prefill \+ decode logits", "KV-1 lossy"),
                                              (KV10, "batched logits", "KV-10 lossy"),
                                              (KV2, "tokens sampled", "KV-2 lossy")])
def test_every_layer_reading_layer_0_fails(law, what, check):
    with pytest.raises(LawFailure, match=rf"{what}.*lossy cache.*EXCEEDS bound.*{check}"):
        law.with_examples(KV2.examples if law is KV2 else ONE)(_impl("fp8_kv_layer0"), "cpu", torch.float64)


def test_an_error_its_bytes_cannot_make_fails_on_its_declaration():
    """8 declared on 4-byte values (the zoo's RoPE off by one past 64) fails even the long law
    its bound would excuse; 2^-4 on values held in the model's float32 fails KV-10."""
    bad = next(i for i in registry.zoo("kv_cache") if i.name == "rope_off_after_64_declared_lossy")
    bad = next(i for i in registry.zoo("kv_cache") if i.name == "rope_off_after_64_declared_lossy")
    with pytest.raises(AssertionError, match=r"declared per-value error 8 EXCEEDS bound 2.38e-07.*KV lossy declaration"):
        KV1_LONG(bad, "cpu", torch.float32)
    fp8_in_float32 = registry.load_outside("kv_cache", "tests.one_bug_impls:fp8_kv_in_model_dtype")
    with pytest.raises(LawFailure, match=r"declared per-value error 0.0625 EXCEEDS bound 2.38e-07"):
        KV10.with_examples(ONE)(fp8_in_float32, "cpu", torch.float32)


@pytest.mark.parametrize("law, check", [(KV1, "KV-1 lossy"), (KV4, "KV-4 lossy")])
def test_codes_read_without_their_scale_fail(law, check):
    with pytest.raises(LawFailure, match=rf"EXCEEDS bound.*{check}"):
        law.with_examples(ONE)(_impl("fp8_kv_codes"), "cpu", torch.float64)


@pytest.mark.parametrize("law", [KV1, KV4, KV10])
def test_an_undeclared_bound_fails(law):
    with pytest.raises(LawFailure, match="must declare its per-value error"):
        law.with_examples(ONE)(_impl("fp8_kv_undeclared"), "cpu", torch.float64)
