"""perf/ceilings.py: the fraction-of-ceiling arithmetic on synthetic numbers, and the
measurement itself in quick mode (tiny sizes) returning positive finite numbers."""
from __future__ import annotations

import math

import pytest

from inference_conformance.perf.ceilings import fraction_of_ceiling, measure_ceilings
from inference_conformance.conformance.tolerance import assert_scalar

# A made-up device: 100 TFLOP/s bf16, 1 TB/s copy: ridge at 100 FLOP/byte.
FAKE = {"copy_bytes_per_s": 1e12, "matmul_flops_per_s": {"bfloat16": 100e12, "float32": 25e12}}


def test_fraction_memory_bound_kernel():
    # 1e9 FLOPs over 1e9 bytes (intensity 1) in 2 ms: 0.5 TFLOP/s, 0.5 TB/s.
    f = fraction_of_ceiling(1e9, 1e9, 2e-3, FAKE)
    assert_scalar(f["achieved_flops_per_s"], 5e11, rel=1e-12, what="achieved FLOP/s")
    assert_scalar(f["achieved_bytes_per_s"], 5e11, rel=1e-12, what="achieved bytes/s")
    assert_scalar(f["intensity"], 1.0, rel=1e-12, what="intensity")
    assert_scalar(f["flops_fraction"], 0.005, rel=1e-12, what="fraction of peak")
    assert_scalar(f["bytes_fraction"], 0.5, rel=1e-12, what="fraction of bandwidth")
    assert_scalar(f["ridge"], 100.0, rel=1e-12, what="ridge")
    assert_scalar(f["attainable_flops_per_s"], 1e12, rel=1e-12, what="roofline at AI=1")
    assert_scalar(f["roofline_fraction"], 0.5, rel=1e-12, what="achieved / attainable")
    assert f["bound"] == "memory"


def test_fraction_compute_bound_kernel():
    # intensity 1000 > ridge 100: attainable is the peak; 5e10 FLOPs in 1 ms = 50 TFLOP/s.
    f = fraction_of_ceiling(5e10, 5e7, 1e-3, FAKE)
    assert f["bound"] == "compute"
    assert_scalar(f["attainable_flops_per_s"], 100e12, rel=1e-12, what="roofline at AI=1000")
    assert_scalar(f["roofline_fraction"], 0.5, rel=1e-12, what="achieved / peak")
    f32 = fraction_of_ceiling(5e10, 5e7, 1e-3, FAKE, dtype="float32")
    assert_scalar(f32["flops_fraction"], 2.0, rel=1e-12, what="fraction of the fp32 peak")


def test_fraction_pure_copy():
    f = fraction_of_ceiling(0, 2e9, 4e-3, FAKE)
    assert f["intensity"] == 0 and f["attainable_flops_per_s"] == 0 and f["bound"] == "memory"
    assert_scalar(f["roofline_fraction"], 0.5, rel=1e-12, what="copy: fraction of bandwidth")


def test_fraction_rejects_bad_input():
    with pytest.raises(ValueError, match="seconds"):
        fraction_of_ceiling(1, 1, 0, FAKE)
    with pytest.raises(ValueError, match="bytes"):
        fraction_of_ceiling(1, -1, 1, FAKE)
    with pytest.raises(ValueError, match="float16"):
        fraction_of_ceiling(1, 1, 1, FAKE, dtype="float16")
    with pytest.raises(ValueError, match="device"):
        measure_ceilings("tpu", quick=True)


def test_measure_quick_positive_finite():
    c = measure_ceilings("cpu", quick=True)
    assert c["copy_bytes_per_s"] > 0 and math.isfinite(c["copy_bytes_per_s"])
    assert set(c["matmul_flops_per_s"]) >= {"bfloat16", "float32"}
    for dtype, flops in c["matmul_flops_per_s"].items():
        assert flops > 0 and math.isfinite(flops), (dtype, flops)
        assert flops == max(c["matmul_by_size"][dtype].values())
    assert c["sizes"]["copy_bytes"] > 0 and c["sizes"]["matmul_n"]
    assert "median" in c["method"]
    assert measure_ceilings("cpu", quick=True) is c  # cached per process
    f = fraction_of_ceiling(2 * 64**3, 3 * 64 * 64 * 4, 1e-3, c, dtype="float32")
    assert 0 < f["roofline_fraction"] and math.isfinite(f["roofline_fraction"])
