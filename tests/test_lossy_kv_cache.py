"""A lossy KV cache is held to the per-value error it declares, never excused (KV-1, KV-4;
``properties/kv_cache/lossy.py``): one-bug FP8 caches (``tests/one_bug_impls.py``) on the pinned
batch (different lengths, GQA group 3, head dim 6, two layers).

- ``fp8_kv`` (correct, 2^-4 declared) passes KV-1 within the derived bound and KV-4's values at
  every layer;
- ``fp8_kv_layer0`` (every layer's attention reads layer 0's keys and values) fails KV-1 (5.7 x
  the derived bound), where before it read "unsupported: differs by design";
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
from inference_conformance.properties.kv_cache.test_kv_cache import KV1, KV4, KV10

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ONE = (dict(case=PINNED),)


def _impl(name: str):
    return registry.load_outside("kv_cache", f"tests.one_bug_impls:{name}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_correct_fp8_cache_holds_its_declared_bound(dtype):
    """KV-1 (logits within the derived bound) and KV-4 (values at every layer) hold."""
    for law in (KV1, KV4):
        run = law.with_examples(ONE)(_impl("fp8_kv"), "cpu", dtype)
        assert run.ran == 1 and not run.refused


def test_every_layer_reading_layer_0_fails_kv1():
    with pytest.raises(LawFailure, match=r"prefill \+ decode logits.*lossy cache.*EXCEEDS bound.*KV-1 lossy"):
        KV1.with_examples(ONE)(_impl("fp8_kv_layer0"), "cpu", torch.float64)


@pytest.mark.parametrize("law, check", [(KV1, "KV-1 lossy"), (KV4, "KV-4 lossy")])
def test_codes_read_without_their_scale_fail(law, check):
    with pytest.raises(LawFailure, match=rf"EXCEEDS bound.*{check}"):
        law.with_examples(ONE)(_impl("fp8_kv_codes"), "cpu", torch.float64)


@pytest.mark.parametrize("law", [KV1, KV4, KV10])
def test_an_undeclared_bound_fails(law):
    with pytest.raises(LawFailure, match="must declare its per-value error"):
        law.with_examples(ONE)(_impl("fp8_kv_undeclared"), "cpu", torch.float64)
