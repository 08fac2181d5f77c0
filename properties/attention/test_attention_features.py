"""Laws of the attention contract's options (claim FA-8): a left sliding ``window``, logit
soft-capping (``softcap``) and per-head ``sinks`` equal the float64 reference with the same
options, for every registered implementation (one that lacks an option is "unsupported" for the
examples using it, never passed). The cases, the law and its zoo list are in
``properties/attention/feature_cases.py``; the zoo entries (a window starting one key tile late,
the cap applied after the max subtraction, sinks dropped in the split-KV merge or counted once
per split) in ``properties/attention/zoo.py``. The pinned cases reach the contract's "FA-8: ..."
coverage classes (``properties/attention/test_attention_coverage.py`` checks it under ``ci``).
"""
from __future__ import annotations

import types

import pytest
import torch

from inference_conformance.conformance.registry import Implementation
from inference_conformance.conformance.outcomes import Unsupported
from inference_conformance.properties.attention import zoo
from inference_conformance.properties.attention.laws import FA8
from inference_conformance.properties.attention.feature_cases import (
    PINNED,
    FCase,
    call_options,
    check_options,
    make_sinks,
)
from inference_conformance.properties.attention.cases import make_inputs
from inference_conformance.reference import attention as ref



def _implementation(name, fn):
    return Implementation("attention", name, f"tests:{name}", "outside",
                          types.SimpleNamespace(attention=fn), ("attention",))


@pytest.mark.claim("FA-8")
@pytest.mark.parametrize("name,case", [
    ("window_skips_wrong_tile", FCase(1, 2, 1, 20, 200, 16, True, 0.25, window=40)),
    ("softcap_after_max", FCase(1, 2, 1, 17, 33, 16, True, 1.0, softcap=0.5)),
    ("sinks_dropped_in_merge", FCase(1, 4, 2, 3, 65, 16, True, 0.5, sinks="dominant")),
    ("sinks_once_per_split", FCase(1, 4, 2, 3, 65, 16, True, 0.5, sinks="dominant")),
])
def test_fa8_rejects_each_zoo_entry_by_its_own_comparison(name, case):
    """The law's own comparison (:func:`check_options`) rejects each FA-8 zoo entry on a pinned
    case, and accepts the reference and the entry with the option off (the bug is the option's)."""
    q, k, v = make_inputs(case, 101, torch.float64, "cpu")
    sinks = make_sinks(case, q, k, 101)
    bad = getattr(zoo, name)
    with pytest.raises(AssertionError):
        check_options(call_options(bad, q, k, v, case, sinks), q, k, v, case, sinks)
    check_options(call_options(ref.attention, q, k, v, case, sinks), q, k, v, case, sinks)
    plain = FCase(*[getattr(case, f) for f in ("B", "Hq", "Hkv", "Tq", "Tk", "D", "causal", "scale")])
    check_options(call_options(bad, q, k, v, plain, None), q, k, v, plain, None)


@pytest.mark.claim("FA-8")
@pytest.mark.suite_own("the law's verdict for a missing option, on a synthetic implementation")
def test_fa8_an_implementation_lacking_an_option_is_unsupported_not_passed():
    """The plain contract (no option keywords) is refused by FA-8's law: "unsupported"; one that
    takes only ``window`` runs the window examples and reports the others refused (partial)."""
    def plain(q, k, v, *, causal, scale):
        return ref.attention(q, k, v, causal=causal, scale=scale)

    def window_only(q, k, v, *, causal, scale, window=None):
        return ref.attention(q, k, v, causal=causal, scale=scale, window=window)

    law = FA8.with_examples(PINNED)
    with pytest.raises(Unsupported, match="unsupported"):
        law(_implementation("plain", plain), "cpu", torch.float64)
    run = law(_implementation("window_only", window_only), "cpu", torch.float64)
    assert 0 < run.ran < len(PINNED) and run.refused and all("takes no" in r for r in run.refused)


# ------------------------------------------------- the suite's Triton kernels: what the window skips
@pytest.mark.claim("FA-8")
@pytest.mark.parametrize("kernel", ["flash_attention", "flash_decoding"])
@pytest.mark.suite_own("the suite's Triton kernels' tile skipping (their internals)")
def test_fa8_triton_never_reads_the_key_tiles_a_window_hides(device, kernel):
    """The kernels skip the key tiles before each query tile's window instead of masking them:
    NaN values in keys 0..63, which no row's window reaches (W = 40, rows at keys 160..199),
    would turn a read tile's 0·NaN products into NaN; the output stays equal to the reference's.
    A kernel that streamed every tile and masked would fail here, though its values are right."""
    fa = pytest.importorskip("inference_conformance.optimized.attention.flash_attention")
    fd = pytest.importorskip("inference_conformance.optimized.attention.flash_decoding")
    case = FCase(1, 2, 1, 40, 200, 16, True, 0.25, window=40)
    q, k, v = make_inputs(case, 7, torch.float32, device)
    v[:, :, :64] = float("nan")
    if kernel == "flash_attention":
        out = fa.flash_attention(q, k, v, causal=True, scale=case.scale, window=40, block_m=16, block_n=32)
    else:
        out = fd.flash_decoding(q, k, v, causal=True, scale=case.scale, window=40, num_splits=3)
    assert not torch.isnan(out).any(), "a key tile the window hides was read"
    v[:, :, :64] = 0.0
    check_options(out, q, k, v, case, None, what=f"{kernel} with NaN in the hidden tiles")


@pytest.mark.claim("FA-8")
@pytest.mark.parametrize("kernel", ["flash_attention", "flash_decoding"])
@pytest.mark.suite_own("the suite's Triton kernel's two-stage loop with the options (its internals)")
def test_fa8_triton_two_stage_tile_loop(device, kernel):
    """The GPU's tile loop (whole visible tiles unmasked first), forced on wherever the kernels
    run (bfloat16, as on GPU): a cap and sinks on its unmasked stage, and a window, which takes the
    one masked pass."""
    dtype = torch.bfloat16
    fa = pytest.importorskip("inference_conformance.optimized.attention.flash_attention")
    fd = pytest.importorskip("inference_conformance.optimized.attention.flash_decoding")
    tiles = pytest.importorskip("inference_conformance.optimized.attention.tiles")
    saved = tiles.TWO_STAGE_OVERRIDE
    tiles.TWO_STAGE_OVERRIDE = True
    try:
        for case in (FCase(1, 4, 2, 20, 130, 16, True, 0.25, "large", 12.0, softcap=5.0, sinks="dominant"),
                     FCase(1, 2, 1, 33, 161, 24, True, 0.25, window=47, sinks="mixed")):
            q, k, v = make_inputs(case, 3, dtype, device)
            sinks = make_sinks(case, q, k, 3)
            fn = fa.flash_attention if kernel == "flash_attention" else fd.flash_decoding
            check_options(call_options(fn, q, k, v, case, sinks), q, k, v, case, sinks, what=f"{kernel}, two stages")
    finally:
        tiles.TWO_STAGE_OVERRIDE = saved
