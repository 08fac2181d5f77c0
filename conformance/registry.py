"""Name -> implementation, for every technique, with availability per device.

Each technique's contract module (``conformance/contracts/<technique>.py``) declares a
:class:`Contract`: the names of the callables an implementation provides, the built-in
implementations as ``"module:attr"`` strings, and its known-bad implementations (the bug zoo).
Nothing else in the suite lists implementations. Outside implementations are added with
``--impl TECHNIQUE=module:attr`` (see :func:`load_outside`).
"""
from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping


@dataclass(frozen=True)
class Contract:
    """One technique's call contract.

    ``functions``: names of the callables an implementation must provide; a plain function is
    accepted for a one-function contract. ``builtins``: name -> "module:attr". ``requires``:
    name -> set of devices the built-in runs on (default: every device). ``needs``: name -> the
    module a built-in needs (an outside library such as ``flash_attn``): when it cannot be found
    the built-in is listed as unavailable with that reason, and nothing is imported to learn it;
    the contract module itself imports no implementation. ``zoo``: name ->
    "module:attr" of known-bad implementations each law must reject. ``cases`` (optional):
    "module:attr" of a function ``cases(seed: int, device: str) -> list[tuple[tuple, dict]]``
    giving small valid ``(args, kwargs)`` for the contract's main function, inputs of real
    magnitude included; a contract that sets it gets the generic checks of
    ``properties/test_contract_generic.py`` for every implementation (inputs not mutated, output
    fully written, repeatable results). A kwarg ``out`` that is a tensor is an output buffer the
    contract hands over: the generic checks pre-fill it with NaN.
    """

    technique: str
    functions: tuple[str, ...]
    doc: str
    builtins: Mapping[str, str] = field(default_factory=dict)
    requires: Mapping[str, frozenset[str]] = field(default_factory=dict)
    needs: Mapping[str, str] = field(default_factory=dict)
    zoo: Mapping[str, str] = field(default_factory=dict)
    cases: str = ""


@dataclass
class Implementation:
    """A loaded implementation of one contract.

    Call it like its main function (``impl(q, k, v, ...)``) or reach any contract function as an
    attribute (``impl.decode(...)``). ``origin`` is "builtin", "outside" or "zoo".
    """

    technique: str
    name: str
    target: str
    origin: str
    namespace: Any
    functions: tuple[str, ...]
    unavailable: str | None = None

    def __call__(self, *args, **kwargs):
        return getattr(self, self.functions[0])(*args, **kwargs)

    def __getattr__(self, item):
        if item in ("namespace", "functions"):
            raise AttributeError(item)
        if item in self.functions:
            return getattr(self.namespace, item)
        raise AttributeError(f"implementation {self.name!r} of {self.technique!r} has no {item!r}")

    def __repr__(self) -> str:
        # short, as Hypothesis prints it in every falsifying example; ``target`` and ``origin``
        # are attributes for whoever needs them
        return f"Implementation({self.technique!r}, {self.name!r})"


def contracts() -> dict[str, Contract]:
    """Every contract declared under ``conformance.contracts``, by technique name."""
    from conformance import contracts as pkg

    found: dict[str, Contract] = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
        contract = getattr(mod, "CONTRACT", None)
        if isinstance(contract, Contract):
            found[contract.technique] = contract
    return found


def contract(technique: str) -> Contract:
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


def _namespace(c: Contract, obj: Any, target: str) -> Any:
    if callable(obj) and not isinstance(obj, (type, types.ModuleType)) and len(c.functions) == 1 \
            and not hasattr(obj, c.functions[0]):
        return types.SimpleNamespace(**{c.functions[0]: obj})
    missing = [f for f in c.functions if not callable(getattr(obj, f, None))]
    if missing:
        raise TypeError(
            f"{target!r} does not meet the {c.technique!r} contract: missing callables {missing}; "
            f"the contract needs {list(c.functions)}")
    return obj


def importable(module: str) -> bool:
    """True when ``module`` can be found (``importlib.util.find_spec``: nothing is imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def load(technique: str, name: str, target: str, origin: str, device: str | None = None,
         requires: frozenset[str] | None = None, needs: str | None = None) -> Implementation:
    """Import ``target`` ("module:attr") as an implementation of ``technique``.

    An import failure of a built-in marks it unavailable (with the reason) instead of raising,
    as does a missing module it ``needs`` or a ``device`` outside its ``requires``; an outside
    implementation that cannot be imported raises, because the user asked for it.
    """
    c = contract(technique)
    if needs is not None and not importable(needs):
        return Implementation(technique, name, target, origin, None, c.functions,
                              unavailable=f"{name} needs the {needs!r} package, which is not installed")
    if requires is not None and device is not None and device not in requires:
        return Implementation(technique, name, target, origin, None, c.functions,
                              unavailable=f"{name} runs on {sorted(requires)}, not {device}")
    try:
        obj = _resolve(target)
    except ImportError as exc:
        if origin == "outside":
            raise
        return Implementation(technique, name, target, origin, None, c.functions,
                              unavailable=f"cannot import {target}: {exc}")
    return Implementation(technique, name, target, origin, _namespace(c, obj, target), c.functions)


def builtins(technique: str, device: str | None = None) -> list[Implementation]:
    """The suite's own implementations of ``technique`` (unavailable ones carry the reason)."""
    c = contract(technique)
    return [load(technique, n, t, "builtin", device, c.requires.get(n), c.needs.get(n))
            for n, t in c.builtins.items()]


def zoo(technique: str) -> list[Implementation]:
    """The known-bad implementations every law of ``technique`` must reject."""
    c = contract(technique)
    return [load(technique, n, t, "zoo") for n, t in c.zoo.items()]


def cases(technique: str, seed: int, device: str) -> list[tuple[tuple, dict]]:
    """The contract's small valid calls (``Contract.cases``); [] when the contract sets none."""
    c = contract(technique)
    if not c.cases:
        return []
    return list(_resolve(c.cases)(seed, device))


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


Oracle = Callable[..., Any]
