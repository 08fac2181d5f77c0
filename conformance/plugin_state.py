"""The state of one pytest run of the suite, kept in that run's ``config.stash`` (never in a
module), and how the plugin tells the suite's own tests from a project's.

- :class:`RunState` (:func:`state`): the device, the ``--impl`` implementations, the
  expectation entries, the ``--results`` folder's writer and the verdicts for the summary.
- :func:`active_config`: the pytest config of the run in the current context (set by the plugin
  from configure to unconfigure and around each collection and each test, a
  :class:`contextvars.ContextVar`, so nested in-process runs each see their own), or None: what
  the benchmarks' accessors and :func:`inference_conformance.conformance.device.current_device`
  read when no config is passed.
- :func:`is_suite_path`: whether a file or folder lies in the suite (its package's folders,
  and the checkout's ``tests/``); only there does the plugin apply its profiles, set up the
  device or collect ``bench_*.py``.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

import inference_conformance


@dataclass
class RunState:
    """What one pytest run of the suite holds (``config.stash[STATE]``).

    ``device_option``: ``--device`` as given (None: auto); ``device`` resolves it once, on first
    use. ``outside``: technique -> the ``--impl`` implementations, in the order given.
    ``expect`` / ``expect_builtin``: expectation entries of ``--expect`` and of the suite's own
    files. ``run``: the ``--results`` folder's :class:`inference_conformance.conformance.runinfo.RunFolder`
    or None. ``verdicts``: the terminal summary's tuples. ``profile``: the Hypothesis profile
    name the suite's own tests run under. ``interpreter_ready``: the device was set up.
    ``resolver``: turns ``device_option`` into a device
    (:func:`inference_conformance.conformance.device.resolve_device`, set at configure);
    :meth:`builtins`: the registered implementations, loaded once."""

    device_option: str | None = None
    outside: dict[str, list] = field(default_factory=dict)
    expect: list = field(default_factory=list)
    expect_builtin: list = field(default_factory=list)
    run: Any = None
    verdicts: list[tuple] = field(default_factory=list)
    profile: str = ""
    interpreter_ready: bool = False
    resolver: Callable[[str | None], str] | None = None
    _device: str | None = None
    _token: Any = None
    _builtins: dict = field(default_factory=dict)

    def builtins(self, technique: str) -> list:
        """The registry's implementations of ``technique`` on this run's device, loaded once per
        process: every test of the run calls the same objects, as a user's code holds one engine
        (an adapter's processes, servers and caches are started once, not once per test)."""
        if technique not in self._builtins:
            from inference_conformance.conformance import registry

            self._builtins[technique] = registry.builtins(technique, self.device)
        return self._builtins[technique]

    @property
    def device(self) -> str:
        """"cpu" or "cuda" (resolved from ``device_option`` on first use)."""
        if self._device is None:
            if self.resolver is None:
                raise RuntimeError("the run's device is resolved once the plugin has configured the run")
            self._device = self.resolver(self.device_option)
        return self._device

    def expecting(self) -> bool:
        """Whether any expectation file applies."""
        return bool(self.expect or self.expect_builtin)


STATE = pytest.StashKey[RunState]()


def state(config) -> RunState:
    """The :class:`RunState` of the run ``config`` (created empty on first use). Raises
    TypeError when ``config`` has no stash."""
    stash = getattr(config, "stash", None)
    if stash is None:
        raise TypeError(f"config must be a pytest Config, got {type(config).__name__}")
    if STATE not in stash:
        stash[STATE] = RunState()
    return stash[STATE]


_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("inference_conformance_config", default=None)


def active_config():
    """The pytest config of the run collecting or running a node in this context, else None."""
    return _ACTIVE.get()


@contextlib.contextmanager
def activated(config) -> Iterator[None]:
    """Make ``config`` the :func:`active_config` inside the block."""
    token = _ACTIVE.set(config)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def enter(config) -> None:
    """Make ``config`` the :func:`active_config` from its configure to its unconfigure (hooks
    such as ``pytest_sessionfinish`` of the suite's other plugins read it); see :func:`leave`."""
    state(config)._token = _ACTIVE.set(config)


def leave(config) -> None:
    """Undo :func:`enter` (where it was done in this context)."""
    st = state(config)
    if st._token is not None:
        try:
            _ACTIVE.reset(st._token)
        except ValueError:  # pragma: no cover - unconfigured from another context
            pass
        st._token = None


def suite_roots() -> list[Path]:
    """The folders that hold the suite: each subpackage's folder (checkout or installed) and the
    checkout's ``tests/``, resolved."""
    roots = []
    for base in inference_conformance.__path__:
        # ``tests`` is not a subpackage: the checkout's sits beside the folder ``conformance`` links to
        checkout = Path(base, "conformance").resolve().parent
        for folder in [*(Path(base, name) for name in inference_conformance.SUBPACKAGES), checkout / "tests"]:
            if folder.is_dir():
                roots.append(folder.resolve())
    return roots


def is_suite_path(path: str | os.PathLike, roots: list[Path] | None = None) -> bool:
    """Whether ``path`` (a file or folder) lies inside one of :func:`suite_roots` (or ``roots``)."""
    p = Path(path).resolve()
    return any(p == r or p.is_relative_to(r) for r in (roots if roots is not None else suite_roots()))


def is_suite_node(node) -> bool:
    """Whether a collector or item belongs to the suite (by its path, not its name); the answer
    is cached in the run's stash per path."""
    path = getattr(node, "path", None)
    if path is None:
        return False
    cache = node.config.stash.setdefault(_PATHS, {})
    if path not in cache:
        cache[path] = is_suite_path(path)
    return cache[path]


_PATHS = pytest.StashKey[dict]()


def suite_invocation(config) -> bool:
    """Whether every path pytest was asked to run lies in the suite (``--pyargs
    inference_conformance...`` included): a run of the suite alone."""
    args = [a.split("::", 1)[0] for a in config.args if not a.startswith("-")]
    if not args:
        return False
    roots = suite_roots()
    pyargs = bool(getattr(config.option, "pyargs", False))
    for a in args:
        if pyargs and (a == "inference_conformance" or a.startswith("inference_conformance.")):
            continue
        if not is_suite_path(Path(config.invocation_params.dir, a), roots):
            return False
    return True
