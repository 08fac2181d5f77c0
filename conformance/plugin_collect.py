"""Collection hooks of the suite's pytest plugin: ``bench_*.py`` of the suite's benchmarks
collected whatever the project's ``python_files``, the suite's profile and device around its
own modules only, the registry's parametrization and the selection ``--impl``, ``--zoo-only``
and ``--expect`` make."""
from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from _pytest.python import path_matches_patterns

from inference_conformance.conformance import expectations, registry, verdicts
from inference_conformance.conformance.bench_rows import bench_id
from inference_conformance.conformance.outcomes import Outcome
from inference_conformance.conformance.outside import impl_timeout
from inference_conformance.conformance.plugin_profiles import applied
from inference_conformance.conformance.plugin_state import activated, is_suite_node, is_suite_path, state



def ready(config) -> None:
    """The suite's code is about to run in this process: set Triton up for the run's device
    (``TRITON_INTERPRET=1`` without CUDA), once, before any kernel module is imported."""
    st = state(config)
    if not st.interpreter_ready:
        from inference_conformance.conformance.device import use_device

        use_device(st.device)
        st.interpreter_ready = True


@contextlib.contextmanager
def suite_context(node):
    """Around collecting or running ``node``: the run's config is the active one, and for a node
    of the suite, its device is set up and its Hypothesis profile is the default."""
    config = node.config
    with activated(config):
        if not is_suite_node(node):
            yield
            return
        ready(config)
        with applied(state(config).profile):
            yield


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    with suite_context(collector):
        return (yield)


def _benchmarks_folders() -> list[Path]:
    import inference_conformance

    return [Path(b, "benchmarks").resolve() for b in inference_conformance.__path__ if Path(b, "benchmarks").is_dir()]


def _properties_folders() -> list[Path]:
    import inference_conformance

    return [Path(b, "properties").resolve() for b in inference_conformance.__path__ if Path(b, "properties").is_dir()]


def pytest_collect_file(file_path: Path, parent):
    """``bench_*.py`` in the suite's ``benchmarks`` folder and the laws of ``properties/``
    (``properties/<technique>/laws.py``: each :class:`inference_conformance.conformance.laws.Law`
    there is collected as its tests, :func:`pytest_pycollect_makeitem`) are test modules
    whatever the project's ``python_files`` (``pytest --pyargs inference_conformance.properties``
    from any project); where it names them, or they are named on the command line, pytest
    collects them already."""
    if path_matches_patterns(file_path, [*parent.config.getini("python_files"), "__init__.py"]) \
            or parent.session.isinitpath(file_path):
        return None
    if path_matches_patterns(file_path, ["bench_*.py"]):
        folders = _benchmarks_folders()
    elif is_laws_file(file_path):
        folders = _properties_folders()
    else:
        return None
    if not is_suite_path(file_path.parent, folders):
        return None
    return parent.ihook.pytest_pycollect_makemodule(module_path=file_path, parent=parent)


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector, name, obj):
    """A :class:`inference_conformance.conformance.laws.Law` in a laws module: its tests."""
    return law_items(collector, obj)


def is_laws_file(path) -> bool:
    """Whether the file at ``path`` is a technique's home of laws: ``laws.py`` or a module of a
    ``laws`` package."""
    path = Path(path)
    return path.suffix == ".py" and (path.name == "laws.py" or path.parent.name == "laws")


def law_items(collector, obj) -> list | None:
    """What pytest collects of ``obj`` in a module: for a :class:`Law` of a laws module (see
    :func:`is_laws_file`), each test the law declares, made and parametrized as pytest makes a
    test function (the module holds it under its name, where pytest's items look it up); [] for
    such a test met again in the module (or a law met again under another name); None for
    anything else (a law is collected in the module that declared it, :attr:`Law.home`, only)."""
    if not is_laws_file(getattr(collector, "path", None) or ""):
        return None
    from inference_conformance.conformance.laws import Law

    if isinstance(getattr(obj, _MADE_FROM, None), Law):
        return None if collector.stash.get(_MAKING, None) is obj else []
    module = collector.obj
    if not isinstance(obj, Law) or obj.home != getattr(module, "__name__", None):
        return None
    seen = collector.stash.setdefault(_COLLECTED, set())
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    items = []
    for name, test in obj.tests():
        setattr(test, _MADE_FROM, obj)
        setattr(module, name, test)
        collector.stash[_MAKING] = test
        try:
            made = collector.ihook.pytest_pycollect_makeitem(collector=collector, name=name, obj=test)
        finally:
            collector.stash[_MAKING] = None
        items += made if isinstance(made, list) else [made] if made is not None else []
    return items


_COLLECTED = pytest.StashKey[set]()
_MAKING = pytest.StashKey[object]()
_MADE_FROM = "_made_from_law"


def technique_of(node) -> str | None:
    m = node.get_closest_marker("technique")
    return m.args[0] if m else None


def pytest_generate_tests(metafunc):
    technique = technique_of(metafunc.definition)
    if technique is None:
        return
    st = state(metafunc.config)
    if "impl" in metafunc.fixturenames:
        outside = st.outside.get(technique)
        impls = outside if outside else st.builtins(technique)
        # a benchmark's row of an outside implementation is named by its place, not its target
        timed = bool(outside) and "benchmark" in metafunc.fixturenames
        for i in impls:
            if st.run is not None:
                st.run.saw(i)
        params = [pytest.param(i, id=bench_id(n) if timed else i.name,
                               marks=[pytest.mark.skip(reason=i.unavailable)] if i.unavailable else [])
                  for n, i in enumerate(impls)]
        metafunc.parametrize("impl", params)
    if "bad_impl" in metafunc.fixturenames:
        kills = metafunc.definition.get_closest_marker("kills")
        names = list(kills.args) if kills else []
        zoo = {i.name: i for i in registry.zoo(technique)}
        unknown = [n for n in names if n not in zoo]
        if unknown:
            raise pytest.UsageError(f"{metafunc.definition.nodeid}: kills unknown zoo entries {unknown}")
        metafunc.parametrize("bad_impl", [pytest.param(zoo[n], id=f"zoo-{n}") for n in names])


def is_zoo_test(item) -> bool:
    """Whether ``item`` is a bug-zoo test: it takes ``bad_impl`` (the registry's zoo), or its
    function calls :func:`inference_conformance.conformance.zoo.expect_rejected` itself (or the
    paged engines' ``expect_rejection``, which names its entry the same way)."""
    if "bad_impl" in getattr(item, "fixturenames", ()):
        return True
    code = getattr(getattr(item, "function", None), "__code__", None)
    return code is not None and any(_names_in(code, n) for n in ("expect_rejected", "expect_rejection"))


def _names_in(code, name: str) -> bool:
    """Whether ``code`` (or a function or lambda defined in it) uses the global or closure ``name``."""
    if name in code.co_names or name in code.co_freevars:
        return True
    return any(_names_in(c, name) for c in code.co_consts if hasattr(c, "co_names"))


def param(item, name):
    """The value of parameter ``name`` of ``item`` (None when it has none)."""
    cs = getattr(item, "callspec", None)
    return cs.params.get(name) if cs is not None else None


def _is_outside(impl) -> bool:
    return impl is not None and bool(getattr(impl, "outside", False))


def _outside_bench(item) -> str | None:
    m = item.get_closest_marker("outside_bench")
    return m.args[0] if m else None


def _bench_function(item) -> tuple[str, str] | None:
    """(module, function) of a benchmark test (one taking the ``benchmark`` fixture), else None."""
    if "benchmark" not in getattr(item, "fixturenames", ()):
        return None
    return item.nodeid.split("::")[0], getattr(item, "originalname", item.name)


def _deselect(config, items, keep) -> None:
    drop = [i for i in items if i not in keep]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [i for i in items if i in keep]


def pytest_collection_modifyitems(config, items):
    st = state(config)
    timeout = impl_timeout(config)
    if timeout and config.pluginmanager.hasplugin("timeout"):
        for item in items:
            if (_is_outside(param(item, "impl")) or _outside_bench(item)) \
                    and item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(timeout))
    if st.expecting():
        strict = Outcome.UNEXPECTED_PASS.fails_run(config.getoption("allow_unexpected_pass", default=False))
        for item in items:
            entry = expected(item)
            if entry is not None and Outcome.of(entry.expected).fails_law:
                # an intermittent failure (a race) may pass: not strict
                item.add_marker(pytest.mark.xfail(strict=strict and not entry.intermittent,
                                                  reason=verdicts.expect_reason(entry)))
    _modes_at_production_shapes(config, items)
    _production_shapes_once_interpreted(config, items)
    if config.getoption("zoo_only", default=False):
        _deselect(config, items, {i for i in items if is_zoo_test(i)})
    techniques = set(st.outside)
    if not techniques:
        return
    # a benchmark with an outside row keeps its built-in rows beside it, in one pinned run
    beside = set() if config.getoption("outside_bench_only", default=False) else \
        {_bench_function(i) for i in items if _outside_bench(i) in techniques}
    # the project's own tests, run in the same command, are the project's: --impl selects the suite's
    keep = {item for item in items
            if (technique_of(item) in techniques and "bad_impl" not in getattr(item, "fixturenames", ()))
            or _outside_bench(item) in techniques or _bench_function(item) in beside or not is_suite_node(item)}
    _deselect(config, items, keep)


def _modes_at_production_shapes(config, items) -> None:
    """Under the gating profiles, a mode of a built-in (``builtin(..., mode_of=...)``: the same
    kernels, one setting changed) skips the production-shape tests and runs its laws in float32
    only, each with the reason: the base runs every shape and dtype there; the mode runs them
    all under ``dev`` and ``thorough``."""
    import torch

    from inference_conformance.conformance.laws import GATING_PROFILES
    from inference_conformance.conformance.plugin_profiles import profile_name

    if profile_name(config).rsplit(".", 1)[-1] not in GATING_PROFILES:
        return
    for item in items:
        impl = param(item, "impl")
        if not getattr(impl, "mode_of", None):
            continue
        dtype = param(item, "dtype")
        if "production" in getattr(item, "originalname", item.name):
            why = "its production shapes"
        elif isinstance(dtype, torch.dtype) and dtype != torch.float32:
            why = f"its laws in {str(dtype).replace('torch.', '')}"
        else:
            continue
        item.add_marker(pytest.mark.skip(reason=f"{impl.name} is a mode of {impl.mode_of}: {why} run under the "
                                                "dev and thorough profiles (the base runs them here)"))


def _production_shapes_once_interpreted(config, items) -> None:
    """Under the gating profiles, with kernels interpreted, a Triton kernel of the suite's own (not
    an adapter of another project's) production-shape test runs each shape in one of its dtypes, the dtypes taken in turn over
    the shapes (each dtype reaches half of them): the interpreter gives float32 and bfloat16 the
    same tiles (``INTERPRET_BLOCK_*``), so both run the same index arithmetic at a shape, which is
    what these sizes check; the drawn laws run every dtype. Compiled (``--device cuda``) and
    under ``dev`` and ``thorough`` every shape runs in every dtype."""
    from inference_conformance.conformance.device import triton_interpreted
    from inference_conformance.conformance.laws import GATING_PROFILES
    from inference_conformance.conformance.plugin_profiles import profile_name

    if profile_name(config).rsplit(".", 1)[-1] not in GATING_PROFILES or not triton_interpreted():
        return
    shapes: dict[tuple, list] = {}
    dtypes: dict[tuple, list] = {}
    chosen = []
    for item in items:
        impl, name, dtype = param(item, "impl"), param(item, "name"), param(item, "dtype")
        if (name is None or dtype is None or not getattr(impl, "kernel_modules", ()) or _is_outside(impl)
                or getattr(impl, "adapter", False) or "production" not in getattr(item, "originalname", item.name)):
            continue
        key = (item.nodeid.split("[")[0], impl.name)
        shapes.setdefault(key, [])
        dtypes.setdefault(key, [])
        if name not in shapes[key]:
            shapes[key].append(name)
        if dtype not in dtypes[key]:
            dtypes[key].append(dtype)
        chosen.append((item, key, name, dtype))
    for item, key, name, dtype in chosen:
        turn = dtypes[key][shapes[key].index(name) % len(dtypes[key])]
        if dtype != turn:
            item.add_marker(pytest.mark.skip(reason=(
                f"{key[1]} interpreted: shape {name} runs in {str(turn).replace('torch.', '')} here (the interpreter "
                "gives both dtypes the same tiles); every dtype under dev, thorough and compiled")))


_EXPECTED = pytest.StashKey[object]()


def expected(item):
    """The :class:`inference_conformance.conformance.expectations.Entry` for ``item`` (its
    ``impl``'s file lists it), or None."""
    if _EXPECTED in item.stash:
        return item.stash[_EXPECTED]
    st = state(item.config)
    impl = param(item, "impl")
    entry = None
    if impl is not None and st.expecting():
        dtype = param(item, "dtype")
        how = dict(law=getattr(item, "originalname", ""), technique=impl.technique,
                   dtype=str(dtype).replace("torch.", "") if dtype is not None else "",
                   impl_target=getattr(impl, "target", "") or "")
        entry = expectations.lookup(st.expect, impl.name, item.name, **how)
        if entry is None and impl.origin == "builtin":   # the suite's own files: its built-ins only
            entry = expectations.lookup(st.expect_builtin, impl.name, item.name, **how)
    item.stash[_EXPECTED] = entry
    return entry
