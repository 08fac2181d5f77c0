"""The laws reach the boundary classes of the attention kernels under the ``ci`` profile.

The float64 reference (taking FA-7's ``num_splits`` and FA-8's options too) runs FA-3's law
(float64 and bfloat16), FA-7's law and FA-8's; every class of the contract's coverage table
(``inference_conformance.conformance.contracts.attention.COVERAGE``) must be reached by one of the calls the runs
observed (``Run.observations``) or the production shapes made. Removing a pinned boundary case
makes this test fail. The kernel configurations a dispatcher can choose (the autotuned 16-bit
tiles for max(Tq, Tk) >= 1024, the float64 tiles, the two-stage loop) are forced on the Triton
kernel and checked for values.
"""
from __future__ import annotations

import types

import pytest
import torch

from inference_conformance.conformance.contracts.attention import COVERAGE
from inference_conformance.conformance.registry import Implementation
from inference_conformance.properties.attention.laws import FA3, FA7, FA8
from inference_conformance.properties.attention.cases import (
    PRODUCTION_CASES,
    Case,
    call_profile,
    check_against_reference,
    make_inputs,
)
from inference_conformance.properties.strategies import KernelLaunchCapture
from inference_conformance.reference import attention as ref

pytestmark = pytest.mark.suite_own("the suite's own pinned examples and its Triton kernels' dispatch configurations")


def reference_with_splits(q, k, v, *, causal, scale, num_splits=None, **options):
    """The float64 reference attention with FA-8's options, taking (and ignoring) FA-7's ``num_splits``."""
    return ref.attention(q, k, v, causal=causal, scale=scale, **options)


def record_laws() -> dict[str, list[dict]]:
    """Run the attention laws on the reference; return the calls (``call_profile``) per law:
    what the runs observed, and the production shapes as test_fa3_production_shapes calls them."""
    impl = Implementation("attention", "reference_with_splits", f"{__name__}:reference_with_splits", "outside",
                          types.SimpleNamespace(attention=reference_with_splits), ("attention",))
    calls = {FA3.name: [o for dtype in (torch.float64, torch.bfloat16) for o in FA3(impl, "cpu", dtype).observations],
             FA7.name: FA7(impl, "cpu", torch.float64).observations,
             FA8.name: FA8(impl, "cpu", torch.float64).observations, "production": []}
    for dtype in (torch.float32, torch.bfloat16):
        for case in PRODUCTION_CASES.values():
            q, k, _ = make_inputs(case, 17, dtype, "cpu")
            calls["production"].append(call_profile(q, k, case))
    return calls


def missing_classes(calls: dict[str, list[dict]], table=COVERAGE) -> list[str]:
    """Names of the classes of ``table`` that no call of their laws reached."""
    return [c.name for c in table
            if not any(c.test(call) for law in c.laws for call in calls.get(law, []))]


@pytest.fixture(scope="module")
def recorded():
    return record_laws()


@pytest.mark.technique("attention")
@pytest.mark.claim("FA-3")
def test_every_boundary_class_is_reached_under_ci(recorded):
    missing = missing_classes(recorded)
    assert not missing, f"boundary classes no law reaches: {missing}"


def test_the_coverage_check_fails_when_a_class_is_not_reached(recorded):
    """Drop the calls of one class (head dim 96; Tk a multiple of 128): the check names it."""
    for name, drop in (("head dim 96", lambda c: c["D"] == 96),
                       ("Tk a multiple of 128", lambda c: c["Tk"] % 128 == 0)):
        pruned = {law: [c for c in calls if not drop(c)] for law, calls in recorded.items()}
        assert name in missing_classes(pruned), name


# ------------------------------------------------- every configuration a dispatcher can choose
def _configs_16bit():
    fa = pytest.importorskip("inference_conformance.optimized.attention.flash_attention")
    return sorted({(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in fa._cuda_configs()})


@pytest.mark.technique("attention")
@pytest.mark.claim("FA-3")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64], ids=["bfloat16", "float64"])
def test_fa3_every_dispatch_configuration(device, dtype):
    """Each tile configuration of the autotuner (16-bit, max(Tq, Tk) >= 1024) and the float64
    tiles the GPU uses (16 x 16; 8 x 8 at D = 256), with the two-stage loop, at a shape with
    more than one query tile, a partial last key tile and a causal diagonal: values against
    the float64 reference. On CPU the tiles are forced (block_m, block_n)."""
    fa = pytest.importorskip("inference_conformance.optimized.attention.flash_attention")
    tiles = pytest.importorskip("inference_conformance.optimized.attention.tiles")
    if dtype == torch.float64:
        configs = [(16, 16, 64), (8, 8, 256)]
    else:
        configs = [(bm, bn, 64) for bm, bn in _configs_16bit()]
    saved = tiles.TWO_STAGE_OVERRIDE
    tiles.TWO_STAGE_OVERRIDE = True
    try:
        for bm, bn, D in configs:
            Tq = bm + 1                                       # two query tiles
            case = Case(B=1, Hq=1, Hkv=1, Tq=Tq, Tk=1024 + 1, D=D, causal=True, scale=D ** -0.5)
            q, k, v = make_inputs(case, bm + bn, dtype, device)
            out = fa.flash_attention(q, k, v, causal=True, scale=case.scale, block_m=bm, block_n=bn)
            check_against_reference(out, q, k, v, case, what=f"flash_attention, tiles {bm}x{bn}, D={D}")
    finally:
        tiles.TWO_STAGE_OVERRIDE = saved


# ------------------------------------------------- float64 on a GPU: no scale rounded to float32
@pytest.mark.technique("attention")
@pytest.mark.claim("FA-3")
def test_float64_kernels_hand_no_float_argument_that_float32_would_round(device, monkeypatch):
    """Compiled Triton types a Python float kernel argument as float32: a float64 call must not
    pass the scale that way (the interpreter keeps the Python float, so only the launch
    arguments show it). The outputs are exact too."""
    fa = pytest.importorskip("inference_conformance.optimized.attention.flash_attention")
    fd = pytest.importorskip("inference_conformance.optimized.attention.flash_decoding")
    seen = []
    for mod, name in ((fa, "_flash_attn_fwd_kernel"), (fd, "_split_kv_kernel"), (fd, "_merge_kernel")):
        monkeypatch.setattr(mod, name, KernelLaunchCapture(getattr(mod, name), seen))
    case = Case(B=2, Hq=2, Hkv=1, Tq=5, Tk=40, D=59, causal=True, scale=0.3 / 59 ** 0.5)
    q, k, v = make_inputs(case, 9, torch.float64, device)
    for out in (fa.flash_attention(q, k, v, causal=True, scale=case.scale),
                fd.flash_decoding(q, k, v, causal=True, scale=case.scale, num_splits=3)):
        check_against_reference(out, q, k, v, case, what="float64 kernel output")
    floats = [a for a in seen if isinstance(a, float)]
    assert floats, "no float argument recorded"
    rounded = [a for a in floats if float(torch.tensor(a, dtype=torch.float32)) != a]
    assert not rounded, f"float64 kernels were handed floats that float32 rounds: {rounded}"
