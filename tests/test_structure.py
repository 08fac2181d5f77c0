"""The suite's layers, checked: the contracts import no implementation, conformance/ imports
nothing above it, the benchmark machinery (perf/) sits on conformance/ and reference/'s analytic
models, the report (reports/) imports no command of perf/, and neither two modules nor two
packages of the suite import each other, directly or through others (lazy imports inside
functions included)."""
from __future__ import annotations

import ast
import functools
import graphlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("conformance", "reference", "optimized", "properties", "benchmarks", "perf", "reports", "smallworld")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["inference_conformance", *parts])


def _pkg(module: str) -> str:
    """The suite's subpackage a module belongs to: 'inference_conformance.perf.gate' -> 'perf'."""
    return module.split(".")[1]


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def import_graph() -> dict[str, set[str]]:
    """module -> the suite's modules it imports (every import statement, at any depth); the
    checkout is parsed once per test process (:func:`_parsed_graph`), each caller gets a copy."""
    return {m: set(deps) for m, deps in _parsed_graph().items()}


@functools.cache
def _nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of the file at ``path``, parsed once per test process (several checks walk it)."""
    return tuple(ast.walk(ast.parse(path.read_text(), str(path))))


@functools.cache
def _parsed_graph() -> dict[str, frozenset[str]]:
    """The import graph as grimp builds it from the package (lazy imports in functions included),
    restricted to the suite's subpackages: what import-graph tools see of a checkout."""
    grimp = pytest.importorskip("grimp", reason="grimp is not installed (pip install -e '.[test]')")
    graph = grimp.build_graph("inference_conformance", cache_dir=None)
    mods = _modules()
    return {name: frozenset(d for d in graph.find_modules_directly_imported_by(name) if d in mods and d != name)
            for name in mods}


def _assert_no_cycle(graph: dict[str, set[str]], what: str) -> None:
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle among the suite's {what}: {' -> '.join(exc.args[1])}")


def test_import_graph_has_no_cycle():
    _assert_no_cycle(import_graph(), "modules")


def test_import_graph_sees_top_level_and_lazy_imports():
    """The graph holds every module of every subpackage (grimp finds them through the package's
    links, as any tool that walks the package does) and the imports at any depth."""
    graph = import_graph()
    assert set(graph) == set(_modules()) and len(graph) > 250
    flash, tiles = "inference_conformance.optimized.attention.flash_attention", "inference_conformance.optimized.attention.tiles"
    assert tiles in graph[flash]     # top-level
    assert "inference_conformance.conformance.contracts.attention" in graph[tiles] | graph[flash]
    lazy = {m for m, deps in graph.items() if "inference_conformance.reference.attention" in deps}
    assert "inference_conformance.properties.attention.zoo" in lazy


def test_contracts_import_no_implementation():
    """The contracts (and the registry that loads them) import neither optimized/ nor reference/;
    every other module of conformance/ imports without importing optimized/, reference/ or
    perf/."""
    contracts = [m for m in _modules()
                 if m.startswith("inference_conformance.conformance.contracts") or m == "inference_conformance.conformance.registry"]
    rest = [m for m in _modules() if _pkg(m) == "conformance" and m not in contracts]
    code = ("import importlib, sys\n"
            "def loaded(top): return sorted(m for m in sys.modules if m.startswith('inference_conformance.') and m.split('.')[1] in top)\n"
            f"for m in {contracts!r}: importlib.import_module(m)\n"
            "from inference_conformance.conformance import registry\n"
            "for t in registry.contracts(): registry.contract(t)\n"
            "print(','.join(loaded(('optimized', 'reference'))))\n"
            f"for m in {rest!r}: importlib.import_module(m)\n"
            "print(','.join(loaded(('optimized', 'reference', 'perf'))))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    by_contracts, by_rest = (out.stdout.splitlines() + ["", ""])[:2]
    assert by_contracts == "", f"the contracts import implementations: {by_contracts}"
    assert by_rest == "", f"conformance/ imports a layer above it: {by_rest}"


def package_graph() -> dict[str, set[str]]:
    """package -> the suite's other packages its modules import (from :func:`import_graph`)."""
    out: dict[str, set[str]] = {p: set() for p in PACKAGES}
    for module, deps in import_graph().items():
        out[_pkg(module)] |= {_pkg(d) for d in deps} - {_pkg(module)}
    return out


def _imports_outside(package: str, allowed: set[str]) -> dict[str, list[str]]:
    """module of ``package`` -> the modules it imports from packages other than itself and ``allowed``."""
    out = {}
    for module, deps in import_graph().items():
        if _pkg(module) == package:
            bad = sorted(d for d in deps if _pkg(d) not in allowed | {package})
            if bad:
                out[module] = bad
    return out


def test_package_graph_has_no_cycle():
    _assert_no_cycle(package_graph(), "packages")


def test_conformance_imports_nothing_above_it():
    """conformance/ is the lowest layer: not even a lazy import of reference/, perf/ or another
    package (the device ceilings probe, which needs reference/'s roofline, is perf/ceilings.py)."""
    assert _imports_outside("conformance", set()) == {}


def test_perf_sits_on_conformance_and_the_analytic_models():
    """The benchmark machinery imports conformance/ and reference/ (the roofline) only: it runs
    the benchmarks in their own processes, never imports them, and knows nothing of the report."""
    assert _imports_outside("perf", {"conformance", "reference"}) == {}


def _commands() -> set[str]:
    """The modules of perf/ that are commands (``python -m perf.X``) or pytest plugins."""
    out = set()
    for name, path in _modules().items():
        if _pkg(name) != "perf":
            continue
        tree = ast.parse(path.read_text(), str(path))
        main = any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)
        hooks = any(isinstance(n, ast.FunctionDef) and n.name.startswith("pytest_") for n in tree.body)
        if main or hooks:
            out.add(name)
    return out


def test_reports_renders_only():
    """reports/ imports perf/'s library modules (history, records, env, settings, the ceilings
    probe), never one of its commands or plugins (the calibration's results are read as data),
    and nothing of the suite imports reports/: it is the top of the stack."""
    commands = _commands()
    assert {f"inference_conformance.perf.{m}" for m in ("gate", "ab", "calibrate", "lockstep", "inject")} <= commands
    graph = import_graph()
    used = {m: sorted(graph[m] & commands) for m in graph if _pkg(m) == "reports"}
    assert {m: c for m, c in used.items() if c} == {}, "reports/ imports a command of perf/"
    importers = sorted(m for m, deps in graph.items() if _pkg(m) != "reports"
                       and any(_pkg(d) == "reports" for d in deps))
    assert importers == [], f"modules outside reports/ import it: {importers}"


#: The one import of conformance/ that runs up a layer today (the ceilings probe does device work;
#: it leaves conformance/ with the benchmark machinery, issue 20 item 6).
UPWARD_IMPORTS_ALLOWED = {("inference_conformance.conformance.ceilings", "inference_conformance.reference.roofline")}


def test_conformance_imports_no_layer_above_it():
    """conformance/ (the contracts, the registry, the law runner, the tolerance policy) imports
    nothing from properties/, optimized/ or reference/, at any depth of any function."""
    graph = import_graph()
    upward = sorted((m, d) for m, deps in graph.items() if _pkg(m) == "conformance"
                    for d in deps if _pkg(d) in ("properties", "optimized", "reference")
                    and (m, d) not in UPWARD_IMPORTS_ALLOWED)
    assert not upward, f"conformance/ imports from the layers above it: {upward}"
    assert "inference_conformance.conformance.laws" in graph
    assert "inference_conformance.conformance.coverage" in graph["inference_conformance.conformance.contracts.attention"]


def test_no_test_module_imports_another():
    """A module of properties/ imports cases modules (properties/*_cases.py, strategies), never
    a test module: what two test files share lives in a module that is not collected."""
    graph = import_graph()
    tests = {m for m in graph if m.split(".")[-1].startswith("test_")}
    crossing = sorted((m, d) for m in graph for d in graph[m] if d in tests)
    assert not crossing, f"modules importing test modules: {crossing}"


def _shape_names(text: str) -> set[str]:
    """Size names used in the shape tuples of a text: '(B, Hq, Tq, D)' -> {'B', 'Hq', 'Tq', 'D'}."""
    import re

    names = set()
    for group in re.findall(r"\(([^()]+)\)", text):
        parts = [p.strip() for p in group.split(",")]
        # a shape tuple: sizes (capitalised, short: B, Hq, S_max), lowercase names, numbers, ...
        if len(parts) < 2 or not all(re.fullmatch(r"[A-Z][A-Za-z_0-9]{0,5}|[a-z_][a-z_0-9]*(\[[a-z]+\])?|\d+|\.\.\.", p)
                                     for p in parts):
            continue
        names |= {p for p in parts if re.fullmatch(r"[A-Z][A-Za-z_]*", p)}
    return names


def test_contracts_use_the_glossary_names():
    from inference_conformance.conformance import registry
    from inference_conformance.conformance.contracts.glossary import SIZES

    for technique, c in registry.contracts().items():
        unknown = _shape_names(c.doc) - set(SIZES)
        assert not unknown, f"contract {technique!r} uses size names outside the glossary: {sorted(unknown)}"
    assert _shape_names("q (B, Z, T, H)") - set(SIZES) == {"Z", "H"}  # the check sees a stray name


def _bare_imports(path: Path) -> list[str]:
    """The imports in ``path`` of a suite package by its folder name (``from conformance import
    x``) rather than its one import name (``from inference_conformance.conformance import x``)."""
    bad = []
    for node in _nodes(path):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        else:
            continue
        bad += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in PACKAGES + ("expectations",)]
    return bad


def _suite_files() -> list[Path]:
    """Every .py file of the suite: its packages, tests, examples, scripts and conftest.py."""
    return [p for d in (*PACKAGES, "expectations", "inference_conformance", "tests", "examples", "scripts")
            for p in sorted((ROOT / d).rglob("*.py"))] + [ROOT / "conftest.py"]


#: The most lines a file of the suite may have (CONTRIBUTING.md: split a longer one by responsibility).
MAX_LINES = 400


def test_files_are_at_most_400_lines():
    """Every .py file of the suite is at most :data:`MAX_LINES` lines: a longer one holds more than
    one responsibility and is split into ``<technique>_<what>.py`` modules."""
    files = _suite_files()
    assert len(files) > 100 and ROOT / "conftest.py" in files                  # the check sees the suite
    long = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines: {long}"


def test_one_import_name():
    """Every module of the suite, its tests, examples and scripts import the suite by its one
    name, ``inference_conformance``: the folder names (conformance, reference, benchmarks, ...)
    are names real projects use, and installed, nothing else is in site-packages."""
    bad = [b for p in _suite_files() for b in _bare_imports(p)]
    assert not bad, "imports by a folder name instead of inference_conformance.<folder>:\n" + "\n".join(bad)
    assert _bare_imports.__doc__ and "from conformance import" in _bare_imports.__doc__   # the check sees the form


def test_every_package_is_found_under_its_one_name():
    """The wheel holds every folder of the suite that is a package, each under its one name: the
    package's folder links each top-level folder (no ``package-dir`` map, no search-path addition),
    and setuptools' own package finder, given pyproject.toml's pattern, finds every one."""
    try:
        import tomllib
    except ModuleNotFoundError:   # Python 3.10
        import tomli as tomllib
    from setuptools import find_packages

    import inference_conformance

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "package-dir" not in cfg and isinstance(cfg["packages"], dict), cfg.get("packages")
    assert set(inference_conformance.SUBPACKAGES) == {*PACKAGES, "expectations"}
    for d in inference_conformance.SUBPACKAGES:
        link = ROOT / "inference_conformance" / d
        assert link.is_symlink() and link.resolve() == (ROOT / d).resolve(), f"{link} is not a link to ../{d}"
    want = {"inference_conformance"} | {
        "inference_conformance." + ".".join(i.parent.relative_to(ROOT).parts)
        for d in (*PACKAGES, "expectations") for i in (ROOT / d).rglob("__init__.py")}
    assert set(find_packages(str(ROOT), include=cfg["packages"]["find"]["include"])) == want


def _package_imports(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every ``inference_conformance.*`` name ``path`` imports (``from a.b import
    c``: ``a.b.c``, a module or an attribute of ``a.b``)."""
    out = []
    for node in _nodes(path):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return [(line, n) for line, n in out if n.startswith("inference_conformance.")]


def test_every_import_of_the_package_resolves_in_its_graph():
    """Each ``inference_conformance.*`` import of the suite, its tests, examples and scripts names a
    module of the graph grimp reads from the checkout, or an attribute of one."""
    grimp = pytest.importorskip("grimp", reason="grimp is not installed (pip install -e '.[test]')")
    modules = grimp.build_graph("inference_conformance", cache_dir=None).modules
    bad = [f"{p.relative_to(ROOT)}:{line}: {name}" for p in _suite_files() for line, name in _package_imports(p)
           if name not in modules and name.rsplit(".", 1)[0] not in modules]
    assert not bad, "imports no import-graph tool resolves:\n" + "\n".join(bad)


def test_a_type_checker_resolves_every_import_of_the_package():
    """basedpyright, run on the checkout as it is (pyproject.toml's [tool.basedpyright]: import
    resolution only), resolves every ``inference_conformance.*`` import. The interpreter it is given
    is the venv's base one, without the venv's packages: third-party imports (torch, triton) are
    left unresolved, cheaply; only the package's own count."""
    import json
    import shutil

    if not os.environ.get("INFERENCE_CONFORMANCE_TYPECHECK"):
        pytest.skip("the type checker runs when INFERENCE_CONFORMANCE_TYPECHECK=1 (30 s to minutes of CPU: not in the "
                    "README's test command)")
    exe = shutil.which("basedpyright", path=str(Path(sys.executable).parent)) or shutil.which("basedpyright")
    if exe is None:
        pytest.skip("basedpyright is not installed (pip install basedpyright)")
    base = getattr(sys, "_base_executable", sys.executable)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}      # the checkout as it is, nothing added
    out = subprocess.run([exe, "--outputjson", "--pythonpath", base], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, env=env)
    report = json.loads(out.stdout)
    assert report["summary"]["filesAnalyzed"] > 250, report["summary"]
    ours = [f"{Path(d['file']).relative_to(ROOT)}:{d['range']['start']['line'] + 1}: {d['message']}"
            for d in report["generalDiagnostics"]
            if d.get("rule") == "reportMissingImports" and "inference_conformance" in d["message"]
            and Path(d["file"]).resolve().is_relative_to(ROOT)]      # a file of this checkout, not one outside it
    assert not ours, f"{len(ours)} imports of the package unresolved by a type checker:\n" + "\n".join(ours[:40])

