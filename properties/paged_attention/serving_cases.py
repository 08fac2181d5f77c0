"""The checks of PA-2 (the serving simulation of lecture 001 §4.3), each a function of the
figures it judges (a policy's mean waste; the paged and reserve-max runs' concurrency and
steps), so that ``properties/paged_attention/test_serving.py`` gives them the simulator's runs on the lecture's
trace and ``properties/paged_attention/test_serving_rejections.py`` known-bad runs (a reserve-max that reserves
only what is generated, blocks as large as a request). Each raises AssertionError naming the
claim, the measured figure, the lecture's and the tolerance.
"""
from __future__ import annotations

from inference_conformance.conformance.tolerance import assert_scalar, check_scalar

#: The lecture's setting: a KV budget of 32,768 token slots, blocks of 16, the trace's seed.
BUDGET = 32768
BLOCK = 16
SEED = 2023
#: "about": the relative tolerance of the lecture's rounded figures.
ABOUT = 0.25

LECTURE = {
    "reserve_max_waste": 0.5,
    "exact_waste": 0.14,
    "paged_waste": 0.011,
    "concurrency_ratio": 2.5,
    "step_reduction": 0.6,
}


def check_pa2_waste(policy: str, mean_waste: float) -> None:
    """PA-2 on one policy's mean waste (fraction of the budget, mean over steps): within
    :data:`ABOUT` (relative) of the lecture's figure for ``policy`` ("reserve_max": about half,
    "exact": about 14%, "paged": about 1.1%)."""
    assert_scalar(mean_waste, LECTURE[f"{policy}_waste"], rel=ABOUT,
                  what=f"PA-2: {policy}: mean waste vs the lecture's figure")


def check_pa2_paged_vs_reserve(paged, reserve) -> tuple[float, float]:
    """PA-2 on the paged and reserve-max runs (``mean_running``, ``total_steps``, e.g.
    ``inference_conformance.reference.paged_attention.serving.SimResult``): about 2.5x as many concurrent requests and about 60% fewer
    steps, each within :data:`ABOUT`. Returns (concurrency ratio, step reduction); both are
    judged before either raises."""
    ratio = paged.mean_running / reserve.mean_running
    reduction = 1 - paged.total_steps / reserve.total_steps
    v1 = check_scalar(ratio, LECTURE["concurrency_ratio"], rel=ABOUT,
                      what="PA-2: mean concurrent requests, paged / reserve-max")
    v2 = check_scalar(reduction, LECTURE["step_reduction"], rel=ABOUT, what="PA-2: fewer steps than reserve-max")
    v1.check()
    v2.check()
    return ratio, reduction
