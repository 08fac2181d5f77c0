"""The supported torch/Triton range is the tested one.

``requirements/oldest.txt`` pins the oldest stack; its pins are the lower bounds of
``pyproject.toml``; ``.ci/run`` runs the Triton kernel laws on it (``-k "triton and not production_shapes and not invariant and not
float64"``: every test whose
id names a Triton-backed implementation), and the README names it. A built-in implementation
whose module defines Triton kernels must carry "triton" in its name, or that run would miss it.
"""
from __future__ import annotations

import inspect
import re
from pathlib import Path

from inference_conformance.conformance import registry

ROOT = Path(__file__).resolve().parent.parent


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if m := re.fullmatch(r"\s*([A-Za-z0-9_.-]+)==([^\s;#]+).*", line):
            out[m.group(1).lower()] = m.group(2)
    return out


def lower_bounds() -> dict[str, str]:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    deps = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
    out = {}
    for d in re.findall(r'^\s*"([^"]+)"', deps, re.M):
        if m := re.fullmatch(r"([A-Za-z0-9_.-]+)>=([^\s,;]+).*", d):
            out[m.group(1).lower()] = m.group(2)
    return out


def major_minor(v: str) -> tuple[int, int]:
    a, b = re.findall(r"\d+", v)[:2]
    return int(a), int(b)


def test_lower_bounds_are_the_oldest_tested_stack():
    oldest, bounds = pins(ROOT / "requirements" / "oldest.txt"), lower_bounds()
    assert set(oldest) == {"torch", "triton"}, oldest
    for name, version in oldest.items():
        assert name in bounds, f"pyproject.toml declares no lower bound for {name}"
        assert major_minor(bounds[name]) == major_minor(version), (name, bounds[name], version)


def test_ci_runs_the_kernel_laws_on_the_oldest_stack():
    lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    installs = [l for l in lines if "-c requirements/oldest.txt" in l]
    assert len(installs) == 1 and ".venv-oldest/bin/pip install" in installs[0], "one .ci/run line installs the oldest stack"
    runs = [l for l in lines if ".venv-oldest/bin/python -m pytest" in l]
    assert len(runs) == 1, "one .ci/run line runs the oldest stack's tests"
    selection = 'properties tests -k "triton and not production_shapes and not invariant and not float64"'
    assert re.search(r'-m pytest .*' + re.escape(selection) + r'\s*$', runs[0]), runs[0]


def test_readme_names_the_tested_versions():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for name, version in {**pins(ROOT / "requirements" / "oldest.txt"),
                          "torch": pins(ROOT / "requirements" / "cpu.txt")["torch"]}.items():
        mm = ".".join(map(str, major_minor(version)))
        assert re.search(rf"(?i){name} {re.escape(mm)}\b", text), f"README does not name {name} {mm}"
    oldest = pins(ROOT / "requirements" / "oldest.txt")
    mm = {k: ".".join(map(str, major_minor(v))) for k, v in oldest.items()}
    assert re.search(rf"(?i)torch {mm['torch']}.{{0,40}}triton {mm['triton']}", text)


def test_triton_backed_builtins_are_named_triton():
    """CI's oldest-stack step selects the kernel laws by ``-k triton``: every built-in that
    launches Triton kernels (declares kernel modules, or is defined in a module with a
    ``@triton.jit``) must carry "triton" in its name, and only those."""
    checked = 0
    for technique in registry.contracts():
        for impl in registry.builtins(technique, "cpu"):
            if impl.unavailable:
                continue
            module = impl.target.split(":", 1)[0]
            src = inspect.getsource(__import__(module, fromlist=["_"]))
            launches = bool(impl.kernel_modules) or "@triton.jit" in src
            assert launches == ("triton" in impl.name), (
                f"{technique}:{impl.name} ({impl.target}) {'launches' if launches else 'launches no'} "
                "Triton kernels")
            checked += 1
    assert checked >= 10