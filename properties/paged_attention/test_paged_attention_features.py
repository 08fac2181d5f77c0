"""Tests of FA-8 in the paged kernels beside its laws (``laws/options.py``): the zoo entries are
right without the option, the decode kernel never reads what a window hides, and the laws'
coverage requirement sees a missing class.
"""
from __future__ import annotations


import pytest
import torch

from inference_conformance.conformance.tolerance import assert_close
from inference_conformance.properties.paged_attention.cases import (
    PagedCase,
    make_inputs,
    make_prefill_inputs,
)
from inference_conformance.properties.paged_attention.laws.options import DECODE_PINNED, FA8_PAGED, PREFILL_PINNED
from inference_conformance.properties.paged_attention.options_cases import Options, check_with_options, make_sinks


@pytest.mark.claim("FA-8")
def test_fa8_paged_zoo_entries_are_right_without_the_option():
    """Each paged FA-8 zoo entry equals the reference when its option is off (the bug is the
    option's), and the law's comparison rejects it with the option on."""
    from inference_conformance.properties.paged_attention import zoo
    from inference_conformance.reference import paged_attention as rp

    case, opts = DECODE_PINNED[4]["case"], DECODE_PINNED[4]["opts"]
    inp = make_inputs(case, 5, torch.float64, "cpu")
    assert_close(zoo.paged_sinks_dropped_in_merge(*inp.args(), scale=case.scale),
                 rp.paged_attention(*inp.args(), scale=case.scale), what="sinks off")
    sinks = make_sinks(opts, inp.q, inp.k, list(range(case.B + 1)), case.scale, 5)
    with pytest.raises(AssertionError):
        check_with_options(zoo.paged_sinks_dropped_in_merge(*inp.args(), scale=case.scale, window=opts.window,
                                                softcap=opts.softcap, sinks=sinks),
               inp.q, inp.k, inp.v, list(range(case.B + 1)), opts, sinks, case.scale, "zoo")
    pcase = PREFILL_PINNED[0]["case"]
    pin = make_prefill_inputs(pcase, 1, torch.float64, "cpu")
    assert_close(zoo.prefill_window_from_chunk_start(*pin.args(), scale=pcase.scale),
                 rp.paged_prefill(*pin.args(), scale=pcase.scale), what="window off")


@pytest.mark.claim("FA-8")
@pytest.mark.suite_own("the suite's paged kernel's tile skipping (its internals)")
def test_fa8_paged_decode_never_reads_the_tokens_a_window_hides(device):
    """The Triton decode kernel starts at each sequence's first visible token: NaN values in the
    tokens before the window (which a kernel that read and masked them would multiply by a zero
    weight into NaN) leave the output equal to the dense reference's."""
    pa = pytest.importorskip("inference_conformance.optimized.paged_attention")
    case, opts = PagedCase((130, 70), 2, 1, 16, 16, 0.25), Options(window=40)
    inp = make_inputs(case, 9, torch.float32, device)
    for b, n in enumerate(case.lens):
        for t in range(n - opts.window):                  # token t of sequence b: slot t % 16 of its block
            inp.v_cache[int(inp.block_table[b, t // 16]), t % 16] = float("nan")
    out = pa.paged_attention(*inp.args(), scale=case.scale, window=opts.window, num_splits=3)
    assert not torch.isnan(out).any(), "a token the window hides was read"
    check_with_options(out, inp.q, inp.k, [vb.nan_to_num() for vb in inp.v], list(range(case.B + 1)), opts, None, case.scale,
           "paged decode with NaN before the window")


@pytest.mark.claim("FA-8")
@pytest.mark.suite_own("the paged FA-8 laws' coverage requirement, on the reference and a zoo entry")
def test_fa8_paged_coverage_requirement_sees_a_missing_class():
    """Without its window of one key the decode law misses that class (the requirement fails
    naming it) and passes ``paged_window_of_one_ignored``: the pin is what rejects it."""
    from inference_conformance.conformance import registry

    without = FA8_PAGED.with_examples(tuple(e for e in DECODE_PINNED if e["opts"].window != 1))
    reference = next(i for i in registry.builtins("paged_attention", "cpu") if i.name == "reference")
    run = without(reference, "cpu", torch.float64)
    assert without.missing_classes(run) == ["FA-8 paged: window of one key (W = 1)"], without.missing_classes(run)
    with pytest.raises(AssertionError, match="window of one key"):
        without.check_coverage(run)
    without(next(i for i in registry.zoo("paged_attention") if i.name == "paged_window_of_one_ignored"), "cpu", torch.float64)
