"""What the gating profiles leave out, and only there (conformance/plugin_collect.py): with
kernels interpreted, a built-in Triton kernel's production-shape test runs each shape in one of its
dtypes, the dtypes in turn; an outside implementation, an adapter of another project's kernels, a
kernel without Triton modules, the ``dev`` profile and compiled kernels run every shape in every dtype."""
from __future__ import annotations

import types

import pytest
import torch

from inference_conformance.conformance import plugin_collect

SHAPES = ["s0", "s1", "s2"]
DTYPES = [torch.float32, torch.bfloat16]


class Item:
    def __init__(self, impl, name, dtype, test="properties/x/test_x.py::test_xx_production_shapes"):
        self.nodeid = f"{test}[{impl.name}-{name}-{dtype}]"
        self.originalname = test.split("::")[1]
        self.name = self.nodeid.split("::")[1]
        self.callspec = types.SimpleNamespace(params={"impl": impl, "name": name, "dtype": dtype})
        self.skipped = None

    def add_marker(self, mark):
        assert self.skipped is None, "two skips on one item"
        self.skipped = mark.kwargs["reason"]


class Config:
    def __init__(self, profile):
        self.profile = profile

    def getoption(self, name, default=None):
        return self.profile if name == "hypothesis_profile" else default


def impl(name, kernels=True, outside=False, adapter=False):
    return types.SimpleNamespace(name=name, kernel_modules=(object(),) if kernels else (), outside=outside, mode_of=None,
                                 adapter=adapter)


def run(profile, *impls, interpreted=True, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1" if interpreted else "0")
    items = [Item(i, n, d) for i in impls for n in SHAPES for d in DTYPES]
    plugin_collect._production_shapes_once_interpreted(Config(profile), items)
    return {(it.callspec.params["impl"].name, it.callspec.params["name"], it.callspec.params["dtype"])
            for it in items if it.skipped is None}, items


def test_each_shape_once_dtypes_in_turn_under_ci(monkeypatch):
    ran, items = run("ci", impl("triton"), monkeypatch=monkeypatch)
    assert ran == {("triton", "s0", torch.float32), ("triton", "s1", torch.bfloat16), ("triton", "s2", torch.float32)}
    assert all("same tiles" in it.skipped for it in items if it.skipped)


@pytest.mark.parametrize("case", ["outside", "adapter", "no kernels", "dev", "compiled"])
def test_every_shape_in_every_dtype_otherwise(monkeypatch, case):
    """An adapter's kernels (vLLM's) may pick tiles by dtype, and may refuse one dtype: every shape in every dtype."""
    chosen = {"outside": impl("mine", outside=True), "adapter": impl("vllm_triton", adapter=True),
              "no kernels": impl("torch", kernels=False)}.get(case, impl("triton"))
    ran, _ = run("dev" if case == "dev" else "ci", chosen, interpreted=case != "compiled", monkeypatch=monkeypatch)
    assert len(ran) == len(SHAPES) * len(DTYPES), (case, ran)
