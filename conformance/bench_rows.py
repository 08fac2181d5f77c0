"""A benchmark's rows, what a benchmark module imports (not the pytest plugin itself): the outside
implementations (``--impl``) of its technique, their rows' ids and extra_info, the implementation
behind a row, and their refusals.

Each function takes the run's pytest ``config``; without one it reads
:func:`inference_conformance.conformance.plugin_state.active_config` (the run collecting or
running the calling module), and outside a pytest run there are no outside implementations.
"""
from __future__ import annotations

from contextlib import nullcontext

import pytest

from inference_conformance.conformance.outcomes import refusal_is_unsupported
from inference_conformance.conformance.plugin_state import active_config, state


def outside(technique: str, config=None) -> list:
    """The outside implementations of ``technique`` given with ``--impl`` (loaded once, at
    configure), in the order given; [] without ``--impl`` or outside a pytest run."""
    config = config if config is not None else active_config()
    if config is None:
        return []
    return list(state(config).outside.get(technique, ()))


def bench_id(index: int) -> str:
    """The backend id of the ``index``-th (from 0) outside implementation of a technique in a
    benchmark: ``impl``, ``impl2``, ``impl3``, ... (independent of the target string). Raises
    ValueError for a negative ``index``."""
    if index < 0:
        raise ValueError(f"index must be >= 0, got {index}")
    return "impl" if index == 0 else f"impl{index + 1}"


def outside_backends(technique: str, config=None) -> dict:
    """Backend id (:func:`bench_id`) -> outside implementation of ``technique``, in ``--impl`` order."""
    return {bench_id(i): impl for i, impl in enumerate(outside(technique, config))}


def bench_implementation(technique: str, backend: str, device: str, config=None):
    """The implementation behind the benchmark row ``backend``: the outside one of that id
    (:func:`outside_backends`), else the built-in of ``technique`` named ``backend`` on ``device``;
    an unavailable built-in skips the row with its reason. KeyError for an unknown name."""
    outside_impls = outside_backends(technique, config)
    if backend in outside_impls:
        return outside_impls[backend]
    from inference_conformance.conformance import registry

    impl = {i.name: i for i in registry.builtins(technique, device)}[backend]
    if impl.unavailable:
        pytest.skip(impl.unavailable)
    return impl


def outside_info(technique: str, backend: str, config=None) -> dict:
    """The extra_info naming the target behind an outside benchmark row ``backend``
    (``{"implementation": "module:attr"}``); {} for a built-in backend."""
    impl = outside_backends(technique, config).get(backend)
    return {"implementation": impl.target} if impl is not None else {}


def outside_refusals(technique: str, backend: str, config=None):
    """A context for a benchmark row's first calls (its in-test ``median_seconds``): for an
    outside row, its implementation's ``NotImplementedError`` ends the test as "unsupported" (as
    in the laws); a built-in's refusal stays an error. Never wrap the ``benchmark.pedantic`` loop
    in it (no overhead per timed round)."""
    impl = outside_backends(technique, config).get(backend)
    return refusal_is_unsupported(impl.name) if impl is not None else nullcontext()


def bench_backends(technique: str, builtin: tuple[str, ...] | list[str], config=None) -> list:
    """A benchmark's ``backend`` parameter values: the ``builtin`` names (ids unchanged), then
    one ``impl``/``impl2``/... per outside implementation of ``technique``, each marked
    ``outside_bench(technique)`` so that ``--impl`` keeps exactly these rows. Call it where the
    benchmark module is collected: ``@pytest.mark.parametrize("backend",
    bench_backends("attention", BACKENDS))``."""
    return list(builtin) + [pytest.param(b, id=b, marks=pytest.mark.outside_bench(technique))
                            for b in outside_backends(technique, config)]
