"""A declared quantization scheme is verified, not trusted (QT-1; ``quantization_bounds.SCHEMES``):
it is accepted only for the bits and group sizes it defines and only from an implementation that
hands back its stored codes and scales, which must follow the scheme's formula and the own-scale
law (each code round-to-nearest of w / stored scale, dequantize = code x stored scale).

One-bug implementations (``tests/one_bug_impls.py``): Q4_0 whatever ``bits`` it is asked
(declaring ``gguf-q4_0``) fails QT-1 on the pinned int8 groups of 32, 30 contract half-steps
off; Q4_0 with codes rounded from a bfloat16 w / d fails the own-scale law; the correct Q4_0
passes both.
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.conformance import registry
from inference_conformance.conformance.contracts.quantization import bounds as qb
from inference_conformance.conformance.failures import LawFailure
from inference_conformance.properties.quantization.cases import QCase, accepted_scheme, check_own_scale, make_weight
from inference_conformance.properties.quantization.laws.integer import QT1

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: Cases inside gguf-q4_0 (4 bits, blocks of 32): every kind of group, one and several blocks per row.
Q4_EXAMPLES = tuple(dict(case=c, seed=s) for c, s in (
    (QCase(3, 64, 4, 32, ("normal", "zero", "pos", "neg", "subnormal")), 1),      # an outlier overflows float16
    (QCase(2, 32, 4, 32, ("normal",)), 2),
    (QCase(4, 128, 4, 32, ("neg", "normal", "pos")), 3),
))


def _impl(name: str):
    return registry.load_outside("quantization", f"tests.one_bug_impls:{name}")


def test_q4_0_at_any_bits_fails_qt1_outside_its_scheme():
    """Declaring gguf-q4_0 excuses nothing at 8 bits: the contract's own step judges the result."""
    with pytest.raises(LawFailure, match=r"bits=8 granularity=32.*\n.*\n.*EXCEEDS bound.*QT-1 half step"):
        QT1(_impl("q4_0_any_bits"), "cpu", torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_q4_0_passes_inside_its_scheme(dtype):
    """The correct Q4_0 holds QT-1 with its scheme's bound and the own-scale law."""
    run = QT1.with_examples(Q4_EXAMPLES)(_impl("q4_0"), "cpu", dtype)
    assert run.ran == len(Q4_EXAMPLES) and not run.refused


def test_codes_off_their_own_stored_scale_fail():
    """Codes rounded from w / d formed in bfloat16: in bfloat16 within QT-1's bound (the
    output's own rounding allows it) but not round-to-nearest of the stored scale, which the
    own-scale law rejects (1.024 of its bound at the second pinned case)."""
    with pytest.raises(LawFailure, match=r"codes vs round\(w / stored scale\).*EXCEEDS bound.*own-scale law"):
        QT1.with_examples(Q4_EXAMPLES)(_impl("q4_0_bf16_codes"), "cpu", torch.bfloat16)   # within QT-1's bound
    case = Q4_EXAMPLES[1]["case"]
    impl = _impl("q4_0_bf16_codes")
    w = make_weight(case, 2, torch.float32, "cpu")
    qw = impl.quantize(w, bits=4, granularity=32)
    with pytest.raises(AssertionError, match="own-scale law: round to nearest"):
        check_own_scale(impl, qw, w, impl.dequantize(qw), case, "gguf-q4_0")


def test_a_stored_scale_off_the_formula_fails():
    """A stored scale that is not the scheme's formula (d = max|w| / 8, unsigned) is rejected by
    the formula check even where the codes follow it."""
    impl = _impl("q4_0")
    case = Q4_EXAMPLES[1]["case"]
    w = make_weight(case, 2, torch.float32, "cpu")
    qw = impl.quantize(w, bits=4, granularity=32)
    qw["d"] = -qw["d"]                                      # the formula's d is the signed extreme / -8
    qw["codes"] = (16 - qw["codes"].long()).clamp(0, 15).to(torch.uint8)
    with pytest.raises(AssertionError, match="declared scheme's scale formula"):
        check_own_scale(impl, qw, w, impl.dequantize(qw), case, "gguf-q4_0")


def test_a_declaration_is_accepted_only_where_the_scheme_defines_it():
    """Only the bits and group sizes a scheme defines, and only with ``stored``."""
    q4 = _impl("q4_0")
    assert accepted_scheme(q4, QCase(2, 64, 4, 32)) == "gguf-q4_0"
    assert accepted_scheme(q4, QCase(2, 64, 8, 32)) is None
    assert accepted_scheme(q4, QCase(2, 64, 4, 64)) is None
    unverifiable = type("Declared", (), {"scheme": "gguf-q4_0"})()
    assert accepted_scheme(unverifiable, QCase(2, 64, 4, 32)) is None
    assert qb.scheme_defines("absmax-full-range", 3, "channel") and qb.scheme_defines("gguf-q8_0", 8, 32)
    assert not qb.scheme_defines("gguf-q8_0", 8, "channel")
    with pytest.raises(ValueError, match="scheme"):
        qb.scheme_defines("nf4", 4, 64)
