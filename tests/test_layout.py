"""One technique, one name: in each top-level folder a technique's code is one module or one
subpackage named after it (README, "Map"), so that everything about paged attention is found in
``reference/paged_attention``, ``optimized/paged_attention``, ``properties/paged_attention`` and
``benchmarks/bench_paged_attention.py``.

The names are the contracts' (``conformance/contracts/<technique>.py`` or ``<technique>/contract.py``, read
statically) plus the
topics below, which have claims but no contract of their own. Anything else at the top of a folder
is shared by every technique and listed here with the reason; a new file there fails this test
until it is placed under its technique or listed.
"""
from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from inference_conformance.catalog import techniques

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("reference", "optimized", "properties", "benchmarks")

#: Claims without a contract, by folder: name -> what it is.
TOPICS = {
    "reference": {"roofline": "the analytic performance model (AI-*, KV-4, KV-5)",
                  "transformer": "the reference model every technique's laws run"},
    "optimized": {},
    "properties": {"roofline": "the roofline and trend claims (AI-*)", "world": "the small world's claims (WD-*)"},
    "benchmarks": {},
}

#: Modules every technique shares, by folder: file -> why it is not one technique's.
SHARED = {
    "reference": {},
    "optimized": {"triton_shared.py": "the Triton helpers of every kernel (the interpreter switch, dot upcast, "
                                      "the kernel list)",
                  "vllm_shared.py": "what every vLLM adapter (optimized/<technique>/outside_vllm.py) shares: the import "
                                    "of vLLM, its backends' declared support, the one unified_attention call"},
    "properties": {"strategies.py": "the Hypothesis strategies every law draws from",
                   "falsify.py": "the helper every rejection test uses",
                   "generic_cases.py": "the checks every contract gets",
                   "test_contract_generic.py": "runs generic_cases.py over every contract",
                   "batch_invariance.py": "batch invariance measured for every contract that takes a batch",
                   "test_batch_invariance.py": "runs batch_invariance.py over every implementation of those contracts",
                   "kernel_law.py": "the one template of the kernel laws six techniques declare"},
    "benchmarks": {"conftest.py": "the benchmark fixtures", "timing.py": "the timers every benchmark uses",
                   "bench_ceilings.py": "the device's ceilings every benchmark's figures are divided by (AI-4); "
                                        "its name is kept because benchmark history is keyed by file (history/)"},
}

IGNORED = {"__init__.py", "__pycache__"}


def _names(folder: str) -> set[str]:
    return set(techniques(ROOT)) | set(TOPICS[folder])


def _entries(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).iterdir() if p.name not in IGNORED and not p.name.startswith("."))


def _owner(entry: Path, folder: str, names: set[str]) -> str | None:
    """The technique or topic a top-level entry of ``folder`` belongs to (``names``: its
    :func:`_names`, read once per check), or None."""
    if entry.is_dir():
        return entry.name if entry.name in names and (entry / "__init__.py").is_file() else None
    stem = entry.stem
    if folder == "benchmarks":
        stem = stem.removeprefix("bench_")
    elif folder == "properties":
        return None                     # laws live in a subpackage per technique (test files need their prefix)
    return stem if entry.suffix == ".py" and stem in names else None


def test_contracts_found():
    assert {"attention", "kv_cache", "paged_attention", "quantization", "speculative"} <= set(techniques(ROOT))


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_entry_is_one_technique_or_shared(folder):
    names = _names(folder)
    stray = [e.name for e in _entries(folder) if e.name not in SHARED[folder] and _owner(e, folder, names) is None]
    assert not stray, (f"{folder}/: {stray} belong to no technique; move each into its technique's module or "
                       f"subpackage (names: {sorted(_names(folder))}), or list it in tests/test_layout.py SHARED "
                       "with the reason")


@pytest.mark.parametrize("folder", FOLDERS)
def test_one_place_per_technique(folder):
    owners: dict[str, list[str]] = {}
    names = _names(folder)
    for e in _entries(folder):
        if (o := _owner(e, folder, names)) is not None:
            owners.setdefault(o, []).append(e.name)
    split = {o: names for o, names in owners.items() if len(names) > 1}
    assert not split, f"{folder}/: a technique in more than one place: {split}"


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_module_under_another_techniques_name(folder):
    """Inside a technique's subpackage, no module is named after another technique (``test_<name>``,
    ``bench_<name>`` or ``<name>_*`` for a longer or different name): it belongs in that one's place."""
    names = _names(folder)
    wrong = []
    for pkg in (e for e in _entries(folder) if e.is_dir() and _owner(e, folder, names)):
        for f in pkg.rglob("*.py"):
            stem = re.sub(r"^(test|bench)_", "", f.stem)
            claims = [n for n in names if stem == n or stem.startswith(n + "_")]
            best = max(claims, key=len, default=pkg.name)
            if best != pkg.name:
                wrong.append(f"{f.relative_to(ROOT)} (named for {best})")
    assert not wrong, f"modules under another technique's name: {wrong}"


def _top_level_names(init: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_submodule_shadows_its_package(folder):
    """Importing ``pkg.x`` sets the attribute ``x`` of ``pkg``: a submodule named like a function
    of its package's ``__init__`` replaces that function for every later caller (a module is not
    callable), depending on import order."""
    clashes = {}
    for pkg in (e for e in _entries(folder) if e.is_dir() and (e / "__init__.py").is_file()):
        subs = {p.stem for p in pkg.glob("*.py") if p.stem != "__init__"} | {
            p.name for p in pkg.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
        if hit := subs & _top_level_names(pkg / "__init__.py"):
            clashes[str(pkg.relative_to(ROOT))] = sorted(hit)
    assert not clashes, f"submodules named like their package's own names: {clashes}"


def test_every_technique_has_its_laws():
    missing = [t for t in techniques(ROOT) if not (ROOT / "properties" / t / "__init__.py").is_file()]
    assert not missing, f"contracts without properties/<technique>/: {missing}"


def test_the_check_rejects_a_flat_file(tmp_path, monkeypatch):
    """The layout rule itself can fail: a flat ``optimized/paged_engine.py`` belongs to no name."""
    fake = tmp_path / "optimized"
    fake.mkdir()
    (fake / "paged_engine.py").write_text("")
    (fake / "attention.py").write_text("")
    (fake / "attention").mkdir()
    (fake / "attention" / "__init__.py").write_text("")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    monkeypatch.setattr(f"{__name__}.techniques", lambda root: {"attention": {}, "paged_attention": {}})
    with pytest.raises(AssertionError, match="paged_engine.py"):
        test_every_entry_is_one_technique_or_shared("optimized")
    with pytest.raises(AssertionError, match="more than one place"):
        test_one_place_per_technique("optimized")
    (fake / "attention" / "__init__.py").write_text("def matmul(x, w):\n    return x @ w\n")
    (fake / "attention" / "matmul.py").write_text("")
    with pytest.raises(AssertionError, match="matmul"):
        test_no_submodule_shadows_its_package("optimized")


CONTRACTS = ROOT / "conformance" / "contracts"


def _declares_contract(path: Path) -> bool:
    return any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CONTRACT" for t in n.targets)
               for n in ast.parse(path.read_text(encoding="utf-8")).body)


def test_each_contract_is_declared_once_where_the_registry_reads_it():
    """A contract is a module of ``conformance/contracts/`` or, with helper modules, a subpackage
    whose ``contract.py`` declares ``CONTRACT`` and whose ``__init__`` re-exports it: the registry
    (``pkgutil.iter_modules`` over the folder) finds every contract once, the static catalog the
    same ones; the helpers, ``checks.py`` and ``glossary.py`` declare none."""
    from inference_conformance.conformance import registry

    declaring = sorted(p.relative_to(CONTRACTS).as_posix() for p in CONTRACTS.rglob("*.py") if _declares_contract(p))
    parts = sorted(p.name for p in CONTRACTS.iterdir() if (p / "__init__.py").is_file())
    assert {"paged_attention", "quantization", "inference_engine"} <= set(parts)
    assert declaring == sorted([*(p.name for p in CONTRACTS.glob("*.py") if _declares_contract(p)),
                                *(f"{d}/contract.py" for d in parts)]), declaring
    assert "checks.py" not in declaring and "glossary.py" not in declaring
    assert sorted(registry.contracts()) == sorted(techniques(ROOT)) and len(techniques(ROOT)) == len(declaring)
    for d in parts:
        module = importlib.import_module(f"inference_conformance.conformance.contracts.{d}")
        inner = importlib.import_module(f"inference_conformance.conformance.contracts.{d}.contract")
        assert module.CONTRACT is inner.CONTRACT is registry.contract(d)


def test_no_contract_submodule_shadows_its_package():
    """As :func:`test_no_submodule_shadows_its_package`, for the contracts in parts: a helper module
    named like a name the subpackage's ``__init__`` re-exports would replace it once imported."""
    clashes = {d.name: sorted(hit) for d in CONTRACTS.iterdir() if (d / "__init__.py").is_file()
               if (hit := ({p.stem for p in d.glob("*.py")} - {"__init__"}) & _top_level_names(d / "__init__.py"))}
    assert not clashes, f"contract modules named like their package's own names: {clashes}"
