"""How a technique and its implementations are declared: the contract and the registrations.

A technique's contract module declares one :class:`Contract` (with its :class:`InvalidCall`
list, optionally); each layer's module of the technique declares its implementations in
``implementations()``, returning :class:`Registration` objects made by :func:`builtin` (the
suite's references, optimized versions and adapters) or :func:`known_bad` (the bug zoo). How
they are found and loaded is :mod:`inference_conformance.conformance.registry`, which
re-exports every name here.
"""
from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping


@dataclass(frozen=True)
class Contract:
    """One technique's call contract.

    ``functions``: names of the callables an implementation must provide; a plain function is
    accepted for a one-function contract. ``doc``: the contract's text. ``cases`` (optional): a
    function ``cases(seed: int, device: str) -> list[tuple[tuple, dict]]`` giving small valid
    ``(args, kwargs)`` for the contract's main function, inputs of real magnitude included; a
    contract that sets it gets the generic checks of ``properties/test_contract_generic.py`` for
    every implementation (inputs not mutated, output fully written, repeatable results). A kwarg
    ``out`` that is a tensor is an output buffer the contract hands over: the generic checks
    pre-fill it with NaN. ``rules``: the tolerance rules the technique's laws judge by, by scheme
    name (``inference_conformance.conformance.tolerance.rule_for`` finds them; the dtype rules are the policy's own).
    ``returns``: function name -> the type (or tuple of types) its result must be; every call
    through an :class:`Implementation` is checked before any law reads the result (a tuple,
    None or a numpy array where a tensor is due is a TypeError naming the function).
    ``optional``: names of further callables an implementation may leave out: where it does, the
    function raises ``NotImplementedError`` (the suite reports "unsupported", never a pass), so
    a contract gains a call without breaking the implementations written before it.
    ``invalid`` (optional): a function ``invalid(device) -> list[InvalidCall]``, the contract's
    bad calls; a contract that sets it gets ``test_invalid_call_raises`` of
    ``properties/test_contract_generic.py`` for every implementation (a documented exception
    type, raised before an ``out`` buffer is written, its message naming the argument).
    """

    technique: str
    functions: tuple[str, ...]
    doc: str
    cases: Callable[[int, str], list] | None = None
    rules: Mapping[str, Any] = field(default_factory=dict)
    returns: Mapping[str, Any] = field(default_factory=dict)
    invalid: Callable[[str], list] | None = None
    optional: tuple[str, ...] = ()

    @property
    def all_functions(self) -> tuple[str, ...]:
        """The required functions, then the optional ones."""
        return self.functions + self.optional


@dataclass(frozen=True)
class InvalidCall:
    """One call a contract documents as invalid (``Contract.invalid``).

    ``what``: a short id. ``function``: the contract function called (None: the main one).
    ``args``, ``kwargs``: its arguments; ``args`` may instead be a function of the receiver
    returning them, for arguments only the implementation can make (its own quantized weight).
    ``raises``: the exception types the contract documents for it. ``argument``: the name its
    message must contain (case-insensitive; None where the contract names none). ``on``: a
    function of the implementation returning the object whose ``function`` is called (an engine
    the implementation builds; None: the implementation). ``state``: a function of that object
    returning what the rejected call must leave unchanged (a tensor or a tuple of them).
    """

    what: str
    args: Any = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    raises: tuple[type[BaseException], ...] = (TypeError, ValueError)
    argument: str | None = None
    function: str | None = None
    on: Callable[[Any], Any] | None = None
    state: Callable[[Any], Any] | None = None


@dataclass(frozen=True)
class Registration:
    """One implementation as its module declares it (see :func:`builtin`, :func:`known_bad`).

    ``impl``: the function, or an object with the contract's functions as attributes.
    ``requires``: the devices it runs on (None: every device). ``needs``: an outside package it
    needs; where that cannot be found the implementation is listed unavailable with the reason
    (nothing is imported to learn it). ``adapter``: it translates calls into another project's
    kernel (such rows get the outside-implementation timeout). ``kernel_modules``: the modules
    of the Triton kernels it launches (empty: it launches none). ``peer``: the peer set it
    belongs to (its laws run in that set's environment only, where ``INFERENCE_CONFORMANCE_PEERS``
    names it, as ``tox -e peers-<set>`` sets it; elsewhere it is listed unavailable with the
    reason). ``target``: "module:name" where it is defined, for messages and rows.
    ``batch_invariant``: the implementation declares that a request's output is bitwise the same
    whatever is batched with it (``properties/test_batch_invariance.py`` then fails it where a
    measured difference says otherwise; undeclared, the property is only measured and recorded).
    """

    technique: str
    name: str
    impl: Any
    origin: str
    target: str
    requires: frozenset[str] | None = None
    needs: str | None = None
    adapter: bool = False
    kernel_modules: tuple = ()
    bug: str = ""
    peer: str | None = None
    batch_invariant: bool = False
    mode_of: str | None = None

    @property
    def summary(self) -> str:
        """One line on what the implementation is (a zoo entry: its bug): ``bug``, else the
        first sentence of the implementation's own docstring, else ""."""
        if self.bug:
            return self.bug
        doc = self.impl.__doc__ if isinstance(self.impl, types.FunctionType) or "__doc__" in vars_of(self.impl) else ""
        text = " ".join((doc or "").split())
        return text.split(". ")[0].rstrip(".") if text else ""


def vars_of(obj: Any) -> dict:
    """``vars(obj)``, or {} for an object without a ``__dict__``."""
    try:
        return vars(obj)
    except TypeError:
        return {}


def _target(impl: Any, name: str, module: str) -> str:
    """"module:name" of ``impl``: a function's or class's own qualified name; an instance (a
    scheme, an engine factory) is named after the module that registers it."""
    qual, mod = getattr(impl, "__qualname__", None), getattr(impl, "__module__", None)
    if isinstance(impl, (types.FunctionType, type)) and isinstance(qual, str) and isinstance(mod, str):
        return f"{mod}:{qual}"
    return f"{module}:{name}"


def _caller_module(depth: int = 2) -> str:
    return sys._getframe(depth).f_globals.get("__name__", "?")


def _check_fields(technique: Any, name: Any) -> None:
    if not isinstance(technique, str) or not technique:
        raise TypeError(f"technique must be a non-empty str, got {technique!r}")
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")


def builtin(technique: str, name: str, impl: Any, *, requires: Iterable[str] | None = None,
            needs: str | None = None, adapter: bool = False,
            kernel_modules: Iterable[types.ModuleType] = (), peer: str | None = None,
            batch_invariant: bool = False, mode_of: str | None = None) -> Registration:
    """Declare one of the suite's implementations of ``technique`` (a reference, an optimized
    version, or an adapter of another project's kernel); ``batch_invariant=True`` declares its
    outputs bitwise independent of the rest of the batch (enforced where measured); ``mode_of``
    names the built-in whose kernels it runs with one setting changed (a mode: under the gating
    profiles ``ci`` and ``compat`` its laws run their pinned boundary examples in float32, no
    production shapes; the base draws; everything elsewhere). Raises TypeError on a non-str name, a ``batch_invariant`` that is
    not a bool or a ``mode_of`` that is not a str."""
    _check_fields(technique, name)
    if not isinstance(batch_invariant, bool):
        raise TypeError(f"batch_invariant must be a bool, got {batch_invariant!r}")
    if mode_of is not None and (not isinstance(mode_of, str) or not mode_of):
        raise TypeError(f"mode_of must be a built-in's name, got {mode_of!r}")
    return Registration(technique, name, impl, "builtin", _target(impl, name, _caller_module()),
                        frozenset(requires) if requires is not None else None, needs, adapter,
                        tuple(kernel_modules), peer=peer, batch_invariant=batch_invariant, mode_of=mode_of)


def known_bad(technique: str, name: str, impl: Any, *, bug: str = "", batch_invariant: bool = False) -> Registration:
    """Declare a known-bad implementation of ``technique`` (a bug-zoo entry): every law whose
    ``kills`` names it must reject it. ``bug``: one line saying what it gets wrong (default: the
    first sentence of its docstring); ``batch_invariant``: it claims batch invariance (a zoo
    entry whose bug is breaking that claim). Raises TypeError on a non-str name."""
    _check_fields(technique, name)
    return Registration(technique, name, impl, "zoo", _target(impl, name, _caller_module()), bug=bug,
                        batch_invariant=bool(batch_invariant))
