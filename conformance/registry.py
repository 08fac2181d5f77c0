"""Name -> implementation, for every technique, with availability per device.

Each technique's contract module (``conformance/contracts/<technique>.py``, or the subpackage
``conformance/contracts/<technique>/`` whose ``__init__`` re-exports ``contract.py``'s names) declares a
:class:`Contract`: the callables an implementation provides, its documentation and (optionally)
its small valid calls. The contract names no implementation. Implementations are declared as
Python objects where they live, by a function ``implementations()`` in the technique's module of
each layer, which returns :class:`Registration` objects made by :func:`builtin` or
:func:`known_bad`:

- ``reference/<technique>.py``: the float64-capable references (origin "builtin");
- ``optimized/<technique>.py``: the optimized implementations and the adapters of other
  projects' kernels (origin "builtin", ``adapter=True`` for the adapters);
- ``properties/<technique>/zoo.py``: the known-bad implementations every law must reject
  (origin "zoo").

The technique's name is the only link, so adding a technique adds one module per folder and no
list anywhere. An installed package registers its own implementations through the entry-point
group ``inference_conformance.implementations`` (a module with ``implementations()``, or that
function itself); outside implementations are also added on the command line with
``--impl TECHNIQUE=module:attr`` (see :func:`load_outside`). ``pytest --list-impls`` prints what
is registered, available or why not.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import pkgutil
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from inference_conformance.conformance.registry_declarations import (  # noqa: F401 - re-exported
    Contract,
    InvalidCall,
    Registration,
    builtin,
    known_bad,
    vars_of,
)


#: The entry-point group through which an installed package registers implementations.
ENTRY_POINT_GROUP = "inference_conformance.implementations"
#: Where a technique's implementations are declared, by layer: module name templates.
LAYERS = ("inference_conformance.reference.{technique}", "inference_conformance.optimized.{technique}",
          "inference_conformance.properties.{technique}.zoo")
#: The suite's own top-level packages: an implementation defined elsewhere is outside code.
SUITE_PACKAGES = tuple(f"inference_conformance.{p}" for p in ("reference", "optimized", "properties", "conformance"))


@dataclass
class Implementation:
    """A loaded implementation of one contract.

    Call it like its main function (``impl(q, k, v, ...)``) or reach any contract function as an
    attribute (``impl.decode(...)``). ``origin`` is "builtin", "outside" or "zoo"; ``adapter`` is
    True for the suite's adapters of other projects' kernels; ``kernel_modules`` the modules of
    the Triton kernels it launches, where declared; ``unavailable`` the reason it cannot run here, or None;
    ``batch_invariant`` whether its registration declares batch invariance; ``mode_of`` the
    built-in whose kernels it runs with one setting changed (its laws run their pinned examples
    under the gating profiles), or None.
    """

    technique: str
    name: str
    target: str
    origin: str
    namespace: Any
    functions: tuple[str, ...]
    unavailable: str | None = None
    adapter: bool = False
    kernel_modules: tuple = ()
    returns: Mapping[str, Any] = field(default_factory=dict)
    batch_invariant: bool = False
    mode_of: str | None = None

    @property
    def outside(self) -> bool:
        """True for code that is not the suite's own: ``--impl`` targets, installed packages'
        registrations and the suite's adapters of other projects' kernels."""
        suite = tuple(p + "." for p in SUITE_PACKAGES)
        return self.origin == "outside" or self.adapter or not self.target.replace(":", ".").startswith(suite)

    def __call__(self, *args, **kwargs):
        return getattr(self, self.functions[0])(*args, **kwargs)

    def __getattr__(self, item):
        if item in ("namespace", "functions", "returns"):
            raise AttributeError(item)
        if item in self.functions:
            fn = getattr(self.namespace, item)
            want = self.returns.get(item) if self.returns else None
            return fn if want is None else _checked_result(fn, want, f"{self.name}.{item}")
        raise AttributeError(f"implementation {self.name!r} of {self.technique!r} has no {item!r}")

    def __repr__(self) -> str:
        # short, as Hypothesis prints it in every falsifying example; ``target`` and ``origin``
        # are attributes for whoever needs them
        return f"Implementation({self.technique!r}, {self.name!r})"

    def _repr_pretty_(self, printer, cycle) -> None:
        # Hypothesis' printer spells a dataclass out field by field unless it finds this
        printer.text(repr(self))


def _checked_result(fn: Callable, want: Any, who: str) -> Callable:
    """``fn`` whose result must be an instance of ``want`` (a type or a tuple of types), else a
    TypeError naming ``who`` and both types."""
    def call(*args, **kwargs):
        out = fn(*args, **kwargs)
        if not isinstance(out, want):
            names = [w.__name__ for w in want] if isinstance(want, tuple) else [want.__name__]
            raise TypeError(f"{who} returned {type(out).__module__}.{type(out).__qualname__}, the contract "
                            f"returns {' or '.join(names)}")
        return out
    call.__name__ = getattr(fn, "__name__", "call")
    call.__wrapped__ = fn
    return call


def contracts() -> dict[str, Contract]:
    """Every contract declared under ``inference_conformance.conformance.contracts``, by technique name."""
    from inference_conformance.conformance import contracts as pkg

    found: dict[str, Contract] = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
        contract = getattr(mod, "CONTRACT", None)
        if isinstance(contract, Contract):
            found[contract.technique] = contract
    return found


def contract(technique: str) -> Contract:
    """The contract of ``technique``; ValueError naming the known ones when there is none."""
    all_ = contracts()
    if technique not in all_:
        raise ValueError(f"unknown technique {technique!r}; known: {sorted(all_)}")
    return all_[technique]


def _resolve(target: str) -> Any:
    if ":" not in target:
        raise ValueError(f"implementation must be 'module:attr', got {target!r}")
    mod_name, attr = target.split(":", 1)
    obj: Any = importlib.import_module(mod_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _refuses(name: str, target: str) -> Callable:
    """The stand-in of an optional contract function an implementation leaves out."""
    def refuse(*args, **kwargs):
        raise NotImplementedError(f"{target} does not implement the optional function {name!r}")
    refuse.__name__ = name
    return refuse


def _namespace(c: Contract, obj: Any, target: str) -> Any:
    if callable(obj) and not isinstance(obj, (type, types.ModuleType)) and len(c.functions) == 1 \
            and not hasattr(obj, c.functions[0]):
        return types.SimpleNamespace(**{c.functions[0]: obj}, **{f: _refuses(f, target) for f in c.optional})
    missing = [f for f in c.functions if not callable(getattr(obj, f, None))]
    if missing:
        raise TypeError(
            f"{target!r} does not meet the {c.technique!r} contract: missing callables {missing}; "
            f"the contract needs {list(c.functions)}")
    absent = [f for f in c.optional if not callable(getattr(obj, f, None))]
    if absent:
        return types.SimpleNamespace(**{f: getattr(obj, f) for f in c.functions},
                                     **{f: getattr(obj, f, None) if f not in absent else _refuses(f, target)
                                        for f in c.optional})
    return obj


#: The environment variable naming the peer sets whose adapters run here (comma-separated).
PEERS_VARIABLE = "INFERENCE_CONFORMANCE_PEERS"


def peer_sets() -> frozenset[str]:
    """The peer sets named by ``INFERENCE_CONFORMANCE_PEERS`` (e.g. "libs,hf")."""
    return frozenset(p.strip() for p in os.environ.get(PEERS_VARIABLE, "").split(",") if p.strip())


def importable(module: str) -> bool:
    """True when ``module`` can be found (``importlib.util.find_spec``: nothing is imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


#: The installed entry points of ENTRY_POINT_GROUP, read once per ``entry_points`` function (reading
#: every distribution's metadata costs ~7 ms, and a collection asks ~200 times); a replaced function
#: (a test's monkeypatch) is asked again.
_ENTRY_POINTS: dict = {}


def _entry_point_sources() -> list[tuple[str, Callable[[], Any]]]:
    read = importlib.metadata.entry_points
    if _ENTRY_POINTS.get("read") is not read:
        try:
            eps = list(read(group=ENTRY_POINT_GROUP))
        except Exception:  # pragma: no cover - a broken distribution's metadata
            eps = []
        _ENTRY_POINTS.clear()
        _ENTRY_POINTS.update(read=read, eps=eps)
    return [(f"entry point {ep.name} ({ep.value})", ep.load) for ep in _ENTRY_POINTS["eps"]]


def _sources(technique: str) -> list[tuple[str, Callable[[], Any]]]:
    """(label, loader) of every place that may declare implementations of ``technique``: the
    technique's module in each layer that exists, then installed entry points."""
    out = []
    for template in LAYERS:
        name = template.format(technique=technique)
        if importlib.util.find_spec(name.rsplit(".", 1)[0]) is not None and importlib.util.find_spec(name) is not None:
            out.append((name, lambda name=name: importlib.import_module(name)))
    return out + _entry_point_sources()


def registrations(technique: str) -> tuple[list[Registration], list[tuple[str, str]]]:
    """Every :class:`Registration` of ``technique``, in declaration order (reference, optimized,
    zoo, installed packages), and the sources that failed to load as (label, reason): a module
    that cannot be imported, or whose ``implementations()`` raised ImportError."""
    contract(technique)
    found: list[Registration] = []
    failed: list[tuple[str, str]] = []
    for label, loader in _sources(technique):
        try:
            obj = loader()
            declare = getattr(obj, "implementations", obj)
            regs = list(declare()) if callable(declare) else []
        except ImportError as exc:
            failed.append((label, f"cannot import {label}: {exc}"))
            continue
        for r in regs:
            if not isinstance(r, Registration):
                raise TypeError(f"{label}: implementations() must return Registration objects "
                                f"(registry.builtin / registry.known_bad), got {r!r}")
        found.extend(r for r in regs if r.technique == technique)
    seen: dict[tuple[str, str], str] = {}
    for r in found:
        key = (r.origin, r.name)
        if key in seen:
            raise ValueError(f"{technique!r}: {r.origin} name {r.name!r} registered twice "
                             f"({seen[key]} and {r.target})")
        seen[key] = r.target
    return found, failed


def _load_registration(c: Contract, r: Registration, device: str | None) -> Implementation:
    base = dict(technique=r.technique, name=r.name, target=r.target, origin=r.origin,
                functions=c.all_functions, adapter=r.adapter, kernel_modules=r.kernel_modules, returns=c.returns,
                batch_invariant=r.batch_invariant, mode_of=r.mode_of)
    if r.peer is not None and r.peer not in peer_sets():      # first: the environment that installs it
        return Implementation(namespace=None, unavailable=f"{r.name} runs in the peers-{r.peer} environment "
                              f"(tox -e peers-{r.peer}: {PEERS_VARIABLE}={r.peer})", **base)
    if r.needs is not None and not importable(r.needs):
        return Implementation(namespace=None, unavailable=f"{r.name} needs the {r.needs!r} package, "
                              "which is not installed", **base)
    if r.requires is not None and device is not None and device not in r.requires:
        return Implementation(namespace=None, unavailable=f"{r.name} runs on {sorted(r.requires)}, not {device}",
                              **base)
    return Implementation(namespace=_namespace(c, r.impl, r.target), **base)


def _unloadable(c: Contract, label: str, reason: str, origin: str) -> Implementation:
    return Implementation(c.technique, label, label, origin, None, c.all_functions, unavailable=reason)


def builtins(technique: str, device: str | None = None) -> list[Implementation]:
    """The suite's own implementations of ``technique`` and those installed packages register
    (unavailable ones carry the reason; a module that cannot be imported is one unavailable
    entry named after it)."""
    c = contract(technique)
    regs, failed = registrations(technique)
    out = [_load_registration(c, r, device) for r in regs if r.origin == "builtin"]
    return out + [_unloadable(c, label, reason, "builtin") for label, reason in failed]


def zoo(technique: str) -> list[Implementation]:
    """The known-bad implementations every law of ``technique`` must reject."""
    c = contract(technique)
    regs, failed = registrations(technique)
    if any(label.startswith("inference_conformance.properties.") for label, _ in failed):
        raise ImportError("; ".join(reason for label, reason in failed if label.startswith("inference_conformance.properties.")))
    return [_load_registration(c, r, None) for r in regs if r.origin == "zoo"]


def load(technique: str, name: str, target: str, origin: str, device: str | None = None) -> Implementation:
    """Import ``target`` ("module:attr") as an implementation of ``technique``; an import
    failure raises (ImportError), a target that misses a contract function raises TypeError.
    A target whose attribute ``batch_invariant`` is True declares batch invariance (enforced by
    the batch-invariance law; a non-bool raises TypeError)."""
    return from_object(technique, name, _resolve(target), origin, target)


def from_object(technique: str, name: str, obj: Any, origin: str, target: str | None = None) -> Implementation:
    """``obj`` (an object or module with the contract's callables) as an implementation of
    ``technique`` named ``name``: what :func:`load` does once ``target`` is imported, for an
    implementation built at run time (``--engine-url``'s server). TypeError as :func:`load`."""
    c = contract(technique)
    target = target or name
    declared = getattr(obj, "batch_invariant", False)
    if not isinstance(declared, bool):
        raise TypeError(f"{target}: batch_invariant must be a bool, got {declared!r}")
    return Implementation(technique, name, target, origin, _namespace(c, obj, target), c.all_functions,
                          returns=c.returns, batch_invariant=declared)


def cases(technique: str, seed: int, device: str) -> list[tuple[tuple, dict]]:
    """The contract's small valid calls (``Contract.cases``); [] when the contract sets none."""
    c = contract(technique)
    if c.cases is None:
        return []
    return list(c.cases(seed, device))


def invalid_calls(technique: str, device: str) -> list[InvalidCall]:
    """The contract's invalid calls (``Contract.invalid``); [] when the contract sets none."""
    c = contract(technique)
    return [] if c.invalid is None else list(c.invalid(device))


def parse_impl_option(values: list[str]) -> dict[str, list[tuple[str, str]]]:
    """Parse repeated ``--impl TECHNIQUE=module:attr`` values.

    Returns technique -> [(name, target)]. Raises ValueError naming the bad value.
    """
    out: dict[str, list[tuple[str, str]]] = {}
    known = contracts()
    for value in values:
        if "=" not in value:
            raise ValueError(f"--impl expects TECHNIQUE=module:attr, got {value!r}")
        technique, target = value.split("=", 1)
        if technique not in known:
            raise ValueError(f"--impl {value!r}: unknown technique {technique!r}; known: {sorted(known)}")
        if ":" not in target:
            raise ValueError(f"--impl {value!r}: expected module:attr after '='")
        out.setdefault(technique, []).append((target, target))
    return out


def load_outside(technique: str, target: str) -> Implementation:
    """Load a user's implementation; raises ImportError/AttributeError/TypeError with the reason."""
    return load(technique, target, target, "outside")


def listing(device: str | None = None) -> list[tuple[str, str, str, str]]:
    """Every registered implementation as (technique, name, origin, "available" or the reason
    it is not), technique by technique: what ``pytest --list-impls`` prints."""
    rows = []
    for technique in sorted(contracts()):
        impls = builtins(technique, device)
        try:
            impls += zoo(technique)
        except ImportError as exc:
            rows.append((technique, f"inference_conformance.properties.{technique}.zoo", "zoo", f"cannot import: {exc}"))
        for i in impls:
            origin = "adapter" if i.adapter else i.origin
            rows.append((technique, i.name, origin, i.unavailable or "available"))
    return rows


Oracle = Callable[..., Any]
