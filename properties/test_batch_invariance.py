"""Batch invariance of every implementation of the contracts that take a batch (``attention``,
``paged_attention``, ``mla_decode``, ``tree_attention``): a request's output bitwise the same alone and inside
batches of drawn sizes, at drawn indices, among drawn other requests
(:mod:`inference_conformance.properties.batch_invariance`).

``test_batch_invariance`` runs for every registered implementation (or the ``--impl`` ones) over
the technique's pinned cases and records the property in its row: ``batch_invariant`` (True /
False), ``max_batch_diff`` (the largest absolute difference of the request's rows, 0.0 where
invariant), ``declared`` (whether the registration declares ``batch_invariant=True``) and
``worst`` (the batch that showed the difference). Every output of the request, alone and in each
batch, is judged against the float64 reference of the request alone by the tolerance rule of the
case's dtype: one outside the bound is a wrong answer and fails the test for every implementation,
declared or not. Where the implementation declares batch invariance any difference fails the
test, with the measured difference; where it does not, differences within the bound are measured
and recorded (a pass whose row shows the property, never a hidden one). An implementation that
refuses every case is "unsupported". ``test_batch_invariance_zoo_rejected`` shows the enforcement
rejecting a declared-invariant implementation whose key reduction is chunked by the batch size,
and an undeclared one whose prefill mask is aligned top-left in batches of 5 or more; ``test_invariant_mode_where_the_default_is_not`` shows
the suite's
Triton kernels' defaults measured not invariant where their split choice follows the batch and
their batch-invariant modes (``triton_splitkv_invariant``, ``triton_invariant`` of paged_attention
and of mla_decode) invariant.
"""
from __future__ import annotations

import types

import pytest

from inference_conformance.conformance import registry, results
from inference_conformance.conformance.outcomes import unsupported
from inference_conformance.conformance.plugin_state import state
from inference_conformance.conformance.zoo import expect_rejected
from inference_conformance.properties.batch_invariance import (CASES, GPU_POLICY_CASE, TECHNIQUES, ZOO, Case,
                                                              Measurement, measure, splitkv_at_gpu_policy)


def _impls(config, device: str) -> list:
    out = []
    for t in TECHNIQUES:
        outside = state(config).outside.get(t)
        for i in outside if outside else registry.builtins(t, device):
            marks = [pytest.mark.technique(t)]
            if i.unavailable:
                marks.append(pytest.mark.skip(reason=i.unavailable))
            out.append(pytest.param(i, id=f"{t}-{i.name}", marks=marks))
    return out


def pytest_generate_tests(metafunc):
    if "impl" in metafunc.fixturenames:
        metafunc.parametrize("impl", _impls(metafunc.config, state(metafunc.config).device))


def law_batch_invariance(impl, technique: str, device: str, declared: bool) -> dict[str, Measurement]:
    """Measure ``impl`` on every pinned case of ``technique``; assert every output within the
    tolerance bound of the float64 reference (a wrong answer fails, declared or not: the failure
    states the error, the bound and the rule) and, where ``declared``, each case bitwise
    invariant (the failure names the case, the batch and the largest difference). Returns case
    name -> measurement (refused cases left out)."""
    seen: dict[str, Measurement] = {}
    for case in (c for c in CASES if c.technique == technique):
        try:
            seen[case.name] = measure(impl, case, device)
        except NotImplementedError:
            continue
    wrong = [m for m in seen.values() if m.wrong]
    if wrong:
        worst = max(wrong, key=lambda m: m.max_diff)
        raise AssertionError(f"a wrong answer, not a rounding difference, in {len(wrong)} of {len(seen)} cases: "
                             f"{worst.wrong}; largest |difference| from the request alone {worst.max_diff:.3g} "
                             f"({worst.worst})")
    bad = {n: m for n, m in seen.items() if not m.invariant}
    if declared and bad:
        worst = max(bad.values(), key=lambda m: m.max_diff)
        raise AssertionError(f"declared batch-invariant, but the request's rows differ from its rows alone in "
                             f"{len(bad)} of {len(seen)} cases: largest |difference| {worst.max_diff:.3g} "
                             f"({worst.worst}); bound: bitwise equality")
    return seen


def test_batch_invariance(impl, device):
    """The request's rows alone and in every drawn batch, bitwise; enforced where declared."""
    seen = law_batch_invariance(impl, impl.technique, device, impl.batch_invariant)
    if not seen:
        unsupported(f"{impl.name} refused every batch-invariance case")
    invariant = all(m.invariant for m in seen.values())
    diff = max(m.max_diff for m in seen.values())
    worst = max(seen.values(), key=lambda m: m.max_diff)
    results.record("", measured=diff, bound=0.0, unit="max |difference|, request alone vs in a batch",
                   rule="bitwise equality" + (" (declared)" if impl.batch_invariant else " (measured only)")
                   + f"; every output within its dtype's tolerance bound ({worst.bound:.3g} in {worst.worst or 'every case'})",
                   batch_invariant=invariant, max_batch_diff=diff, declared=impl.batch_invariant,
                   cases=len(seen), worst=worst.worst)


def _zoo_params() -> list:
    out = []
    for (technique, name), (fn, _, declared) in sorted(ZOO.items()):
        bad = types.SimpleNamespace(name=name, technique=technique, fn=fn, target=f"{fn.__module__}:{fn.__name__}",
                                    declared=declared)
        out.append(pytest.param(bad, id=f"{technique}-zoo-{name}", marks=pytest.mark.technique(technique)))
    return out


@pytest.mark.parametrize("bad_impl", _zoo_params())
def test_batch_invariance_zoo_rejected(bad_impl, device):
    """Each known-bad implementation is rejected by the law's own comparison: bitwise where it
    declares batch invariance, by the tolerance bound (a wrong answer in a batch) where it does not."""
    text = expect_rejected(lambda bad: law_batch_invariance(bad.fn, bad.technique, device, bad.declared), bad_impl)
    assert "largest |difference|" in text and (bad_impl.declared or "EXCEEDS bound" in text), text
    results.record("", measured="rejected", unit="known-bad implementation" + (" declared batch-invariant" if
                   bad_impl.declared else ", undeclared"), rule="bitwise equality" if bad_impl.declared else
                   "the tolerance bound of its dtype", what=f"{bad_impl.name}: {text[:160]}")


#: An MLA decode case of several splits in the invariant mode (150 tokens: 2 splits of 128 under
#: the interpreter), paged in blocks of 16, whose batch of 5 holds longer sequences (up to 477: 4
#: splits, the request's last 2 empty).
MLA_LONG_CASE = Case("mla_decode", "long-paged",
                     dict(Hq=2, D=8, C=16, R=4, block_size=16, L=150, Lmax=500, paged=True))
#: An MLA decode case long enough (L = 2 x MIN_TOKENS_PER_SPLIT) for the kernel's GPU split policy
#: to choose by B: 2 splits alone, 1 in a batch of 2, on a GPU of 1 multiprocessor.
MLA_GPU_POLICY_CASE = Case("mla_decode", "gpu-policy",
                           dict(Hq=1, D=8, C=16, R=4, block_size=0, L=512, Lmax=512, paged=False))


def mla_at_gpu_policy(q_nope, q_rope, w_uk, cache, block_table, seq_lens, *, scale, rope_theta, sms=1):
    """The "triton" MLA kernel at the split count its GPU policy (``split_kv.gpu_num_splits``) picks
    for this batch on a GPU of ``sms`` multiprocessors: the default mode on such a GPU, on any device."""
    import triton

    from inference_conformance.optimized.mla_decode import split_kv

    tiles = triton.cdiv(q_nope.shape[1], split_kv.blocks(q_nope.dtype, w_uk.shape[1], q_rope.shape[2])[0])
    splits = split_kv.gpu_num_splits(q_nope.shape[0], tiles, int(seq_lens.max()), sms)
    return split_kv.mla_decode(q_nope, q_rope, w_uk, cache, block_table, seq_lens, scale=scale,
                               rope_theta=rope_theta, num_splits=splits)


#: (technique, default, invariant mode, case, the batches compared): a case where the default's
#: split choice follows the batch (paged: the batch's longest sequence sets the split size;
#: dense: the GPU policy's split count by B; MLA: the batched absorption einsum, whose rounding
#: follows B, and on a GPU its split count by B), each batch one that changes it.
MODES = (("paged_attention", "triton", "triton_invariant", next(c for c in CASES if c.name == "mha-bs16"), ((2, 11),)),
         ("attention", splitkv_at_gpu_policy, "triton_splitkv_invariant", GPU_POLICY_CASE, ((2, 11),)),
         ("mla_decode", "triton", "triton_invariant", next(c for c in CASES if c.name == "contiguous"), ((8, 14),)),
         ("mla_decode", "triton", "triton_invariant", MLA_LONG_CASE, ((5, 13),)),
         ("mla_decode", mla_at_gpu_policy, "triton_invariant", MLA_GPU_POLICY_CASE, ((2, 11),)))


@pytest.mark.parametrize("mode", MODES, ids=[f"{m[0]}-{m[2]}" + (f"-{m[3].name}" if m[0] == "mla_decode" else "")
                                             for m in MODES])
def test_invariant_mode_where_the_default_is_not(mode, device):
    """The suite's Triton kernels: the default measured NOT batch-invariant on a case where its
    split choice follows the batch, the batch-invariant mode (declared) invariant on the same
    batches, bitwise."""
    technique, default, name, case, batches = mode
    impls = {i.name: i for i in registry.builtins(technique, device)}
    if impls[name].unavailable:
        pytest.skip(impls[name].unavailable)
    base = measure(impls[default] if isinstance(default, str) else default, case, device, batches)
    mine = measure(impls[name], case, device, batches)
    assert not base.invariant and base.max_diff > 0, f"the default mode was invariant on {case.name}: {base}"
    assert impls[name].batch_invariant and mine.invariant, (
        f"{name}: largest |difference| {mine.max_diff:.3g} ({mine.worst}); bound: bitwise equality")
    results.record("", measured=base.max_diff, bound=0.0, unit="max |difference| of the default mode",
                   rule="bitwise equality", max_batch_diff=base.max_diff, batch_invariant=mine.invariant,
                   worst=base.worst, what=f"{name} invariant where the default differs by {base.max_diff:.3g}")


def test_declaration_reaches_the_implementation():
    """``builtin(batch_invariant=True)`` reaches the loaded implementation (what the law
    enforces by); anything but a bool is a TypeError naming it."""
    declared = {(i.technique, i.name) for t in TECHNIQUES for i in registry.builtins(t) if i.batch_invariant}
    assert {(t, "reference") for t in TECHNIQUES} <= declared
    with pytest.raises(TypeError, match="batch_invariant"):
        registry.builtin("attention", "x", lambda *a, **k: None, batch_invariant="yes")


def test_mla_default_differs_by_its_gpu_split_choice(device):
    """Control for the MLA GPU-policy mode above: the same kernel at a split count fixed for every
    batch (2) is bitwise invariant on the same batch, so the difference there is the split choice's."""
    from inference_conformance.optimized.mla_decode import split_kv

    def fixed(*args, **kwargs):
        return split_kv.mla_decode(*args, num_splits=2, **kwargs)

    control = measure(fixed, MLA_GPU_POLICY_CASE, device, ((2, 11),))
    policy = measure(mla_at_gpu_policy, MLA_GPU_POLICY_CASE, device, ((2, 11),))
    assert control.invariant, f"fixed 2 splits differ by {control.max_diff:.3g} ({control.worst}); bound: bitwise"
    assert not policy.invariant and policy.max_diff > 0, f"the GPU policy's split choice was invariant: {policy}"
    results.record("", measured=policy.max_diff, bound=0.0, unit="max |difference| at the GPU policy's split count",
                   rule="bitwise equality", max_batch_diff=policy.max_diff, worst=policy.worst,
                   what="fixed splits invariant; the GPU policy's choice by B is not")
