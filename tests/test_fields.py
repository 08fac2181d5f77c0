"""The report's figures are declared once (conformance/fields.py): a misspelt or mistyped figure
is refused where it is produced, never silently missing from a plot or a verdict."""
from __future__ import annotations

import pytest

from inference_conformance.conformance import fields, results


@pytest.mark.parametrize("key,declared", [("utilization", "utilisation"), ("tokens_per_S", "tokens_per_s"),
                                          ("tokensPerS", "tokens_per_s"), ("Holds", "holds")])
def test_a_near_miss_of_a_declared_field_is_refused(key, declared):
    with pytest.raises(ValueError, match=f"did you mean {declared!r}"):
        fields.check({key: 1.0}, where="test")


@pytest.mark.parametrize("key,value", [("holds", "yes"), ("batch", 2.5), ("flops", "1e9"), ("bits", True)])
def test_a_declared_field_of_the_wrong_type_is_refused(key, value):
    with pytest.raises(ValueError, match=f"field {key!r} must be"):
        fields.check({key: value}, where="test")


def test_descriptive_fields_and_declared_ones_pass():
    fields.check({"tflops": 1.0, "per_T": {1: 2}, "utilisation": 0.5, "batch": 4, "holds": False,
                  "tokens_per_s": {1: 2.0}, "flops": 10}, where="test")


def test_record_and_bench_info_check_their_fields():
    with pytest.raises(ValueError, match="utilisation"):
        results.record("PA-2", measured=0.5, utilization=0.5)

    class FakeBenchmark:
        name = "x"
        extra_info: dict = {}

    bench = FakeBenchmark()
    with pytest.raises(ValueError, match="implementation"):
        results.bench_info(bench, implementaton="torch")
    results.bench_info(bench, implementation="torch", batch=4)
    assert bench.extra_info == {"implementation": "torch", "batch": 4}


def test_every_plot_reads_declared_fields():
    from inference_conformance.reports.plots import SPECS

    used = {n for spec in SPECS.values() for key in ("x", "y", "group") for n in spec[key]}
    assert used <= set(fields.FIELDS)
