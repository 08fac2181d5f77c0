"""The registry: every registered name resolves, registrations are Python objects where they
live (no contract names an implementation), installed packages register through entry points,
and ``--list-impls`` shows it all."""
from __future__ import annotations

import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from inference_conformance.conformance import registry

ROOT = Path(__file__).resolve().parent.parent
TECHNIQUES = sorted(registry.contracts())


@pytest.mark.parametrize("technique", TECHNIQUES)
def test_every_builtin_resolves_or_says_why_not(technique):
    """Each built-in meets its contract, or is unavailable because an outside package it needs
    is missing, it runs on another device or in a peer set's environment; never because the
    suite's own module is broken."""
    impls = registry.builtins(technique, "cpu")
    assert impls, f"no implementation of {technique!r} is registered"
    for impl in impls:
        if impl.unavailable is None:
            assert impl.namespace is not None
            for fn in impl.functions:
                assert callable(getattr(impl, fn)), f"{technique}:{impl.name} lacks {fn}"
        else:
            assert re.search(r"needs the '[\w.]+' package|runs on \['cuda'\]|runs in the peers-[\w-]+ environment",
                             impl.unavailable), \
                f"{technique}:{impl.name} is unavailable for a reason of the suite's own: {impl.unavailable}"


@pytest.fixture(scope="module")
def zoo_tests() -> list[dict]:
    """Every zoo test the suite collects, with its technique and zoo entry (the plugin
    parametrizes ``bad_impl`` over each law's ``kills``), as ``inference_conformance.reports.falsifiers`` reads them."""
    from inference_conformance.reports import falsifiers

    return [z for z in falsifiers.zoo_tests(ROOT) if z["zoo"] is not None]


@pytest.mark.parametrize("technique", TECHNIQUES)
def test_every_zoo_entry_resolves_and_is_killed_by_some_law(technique, zoo_tests):
    """Every registered zoo entry meets its contract and some collected zoo test of a law of its
    technique must reject it (no entry is registered and forgotten)."""
    zoo = registry.zoo(technique)
    assert zoo, f"{technique!r} has no known-bad implementation"
    killed = {z["zoo"] for z in zoo_tests if z["technique"] == technique}
    for impl in zoo:
        assert impl.origin == "zoo" and impl.namespace is not None
        assert impl.name in killed, f"zoo entry {technique}:{impl.name} is rejected by no collected zoo test"


def test_every_law_takes_registered_implementations_or_says_why():
    """No law runs on the built-ins only: every test of ``properties/`` marked with a claim (zoo and
    rejection tests aside) takes the registry's implementations (``impl``, outside ones included),
    or is marked ``suite_own`` with its reason (a simulator, a formula, the reference model, one
    built-in's internals, a contract not yet written), read from the suite's own collection."""
    from inference_conformance.reports import falsifiers

    laws = falsifiers.law_tests(ROOT)
    assert sum(z["impl"] for z in laws) > 100 and sum(bool(z["own"]) for z in laws) > 50, len(laws)
    off = falsifiers.laws_off_the_registry(ROOT)
    assert not off, ("laws that take no registered implementation and do not say why (mark them "
                     f"@pytest.mark.suite_own(\"why\") or parametrize them over the registry): {off}")


def test_contracts_name_no_implementation():
    """The lowest layer never names the layers above it, not even in strings."""
    for path in (ROOT / "conformance" / "contracts").rglob("*.py"):
        code = path.read_text(encoding="utf-8")
        hits = re.findall(r"""["'](?:optimized|reference|properties|benchmarks|reports)\.[\w.]+:\w+["']""", code)
        assert not hits, f"{path.name} names implementations in strings: {hits}"


def test_builtin_rejects_a_bad_name():
    with pytest.raises(TypeError, match="name"):
        registry.builtin("attention", "", lambda *a, **k: None)
    with pytest.raises(TypeError, match="technique"):
        registry.known_bad(None, "x", lambda *a, **k: None)


def test_installed_package_registers_through_an_entry_point(monkeypatch):
    """A package that declares the entry point is found; a module without the contract's
    functions is a TypeError naming it; a name registered twice is a ValueError."""
    def my_attention(q, k, v, *, causal, scale):
        return q

    mod = types.ModuleType("my_kernels")
    mod.implementations = lambda: (registry.builtin("attention", "my_kernel", my_attention),)
    ep = types.SimpleNamespace(name="my_kernels", value="my_kernels", load=lambda: mod)
    monkeypatch.setattr(registry.importlib.metadata, "entry_points", lambda group: [ep])
    impls = {i.name: i for i in registry.builtins("attention", "cpu")}
    assert impls["my_kernel"].unavailable is None and impls["my_kernel"].outside
    assert not impls["reference"].outside
    mod.implementations = lambda: (registry.builtin("attention", "reference", my_attention),)
    with pytest.raises(ValueError, match="registered twice"):
        registry.builtins("attention", "cpu")
    mod.implementations = lambda: (registry.builtin("attention", "broken", object()),)
    with pytest.raises(TypeError, match="missing callables"):
        registry.builtins("attention", "cpu")
    mod.implementations = lambda: ("attention:my_kernel",)
    with pytest.raises(TypeError, match="Registration"):
        registry.builtins("attention", "cpu")


def test_a_module_that_cannot_be_imported_is_listed_with_the_reason(monkeypatch):
    def boom():
        raise ImportError("No module named 'vendor_lib'")

    ep = types.SimpleNamespace(name="vendor", value="vendor_pkg", load=boom)
    monkeypatch.setattr(registry.importlib.metadata, "entry_points", lambda group: [ep])
    broken = [i for i in registry.builtins("attention", "cpu") if "vendor" in i.name]
    assert len(broken) == 1 and "vendor_lib" in broken[0].unavailable


def test_list_impls_prints_every_registration():
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--list-impls",
                          "--device", "cpu", "--impl", "attention=examples.my_attention:attention"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr + out.stdout
    for technique in TECHNIQUES:
        for impl in registry.builtins(technique, "cpu") + registry.zoo(technique):
            assert impl.name in out.stdout, f"--list-impls does not show {technique}:{impl.name}"
    assert "needs the 'flash_attn' package" in out.stdout
    assert "examples.my_attention:attention" in out.stdout
    assert "passed" not in out.stdout  # it ran no test


def test_an_optional_contract_function_left_out_is_refused():
    """``Contract.optional``: a plain decode function registered for ``paged_attention`` still
    meets the contract, its ``paged_prefill`` raising NotImplementedError (reported
    "unsupported"); an object that provides it keeps its own."""
    c = registry.contract("paged_attention")
    assert "paged_prefill" in c.optional and "paged_prefill" not in c.functions

    def decode_only(q, k_cache, v_cache, block_table, seq_lens, *, scale):
        return q

    impl = registry.Implementation("paged_attention", "x", "m:decode_only", "outside",
                                   registry._namespace(c, decode_only, "m:decode_only"), c.all_functions)
    assert impl.paged_attention is decode_only
    with pytest.raises(NotImplementedError, match="optional function 'paged_prefill'"):
        impl.paged_prefill()
    both = types.SimpleNamespace(paged_attention=decode_only, paged_prefill=len)
    assert registry._namespace(c, both, "m:both").paged_prefill is len
    with pytest.raises(TypeError, match="missing callables"):
        registry._namespace(c, types.SimpleNamespace(paged_prefill=len), "m:prefill_only")
