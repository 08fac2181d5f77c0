"""The ``inference_engine`` contract's step-level call, ``serve`` (claims PA-6, PA-7, PA-8 for a
whole engine): the schedule's entries (:class:`Arrival`, :class:`Fork`), the serve features an
engine declares (:data:`SERVE_FEATURES`), ``validate_serve`` and its documented bad calls. The
contract's text is the module docstring of ``contract.py`` ("serve"); the requests an Arrival
carries and their check are ``generate.py``'s."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

from inference_conformance.conformance.contracts.inference_engine.generate import Request, validate
from inference_conformance.conformance.registry_declarations import InvalidCall

#: What ``serve`` may offer (``Capabilities.serving``): requests arriving at given steps, a
#: copy-on-write fork of a running request, a KV pool of ``Params.block_size`` x ``kv_blocks``
#: (small enough to force preemption), per-request counts on the completions.
SERVE_FEATURES = ("arrivals", "fork", "kv_pool", "stats")


@dataclass(frozen=True)
class Arrival:
    """``request`` (a :class:`Request`) given the id ``id`` (str or int) arrives before the
    engine's step ``step`` (>= 0; step 0: before the first)."""

    id: Hashable
    request: object
    step: int = 0


@dataclass(frozen=True)
class Fork:
    """Parallel sampling: ``id`` continues request ``parent`` once the parent has generated exactly
    ``after`` tokens (1 <= after < the parent's ``max_new_tokens``), sampling at ``temperature``
    with its own generator seeded by ``seed``; it shares the parent's blocks (copy-on-write)."""

    id: Hashable
    parent: Hashable
    after: int = 1
    seed: int = 0
    temperature: float = 1.0


def _int(x, name: str, low: int) -> None:
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    if x < low:
        raise ValueError(f"{name} must be >= {low}, got {x}")


def validate_serve(schedule, params) -> None:
    """The contract's checks of one ``serve`` call (the order of ``contract.py``'s docstring):
    TypeError or ValueError naming the entry and field, then ``validate`` (the ``generate``
    check) of the Arrivals' requests and ``params``."""
    if not isinstance(schedule, list):
        raise TypeError(f"schedule must be a list of Arrival and Fork, got {type(schedule).__name__}")
    if not schedule:
        raise ValueError("schedule must hold at least one Arrival")
    seen: dict = {}
    for i, e in enumerate(schedule):
        if not isinstance(e, (Arrival, Fork)):
            raise TypeError(f"schedule[{i}] must be an Arrival or a Fork, got {type(e).__name__}")
        if not isinstance(e.id, (str, int)) or isinstance(e.id, bool):
            raise TypeError(f"schedule[{i}].id must be a str or an int, got {type(e.id).__name__}")
        if e.id in seen:
            raise ValueError(f"schedule[{i}].id {e.id!r} is used twice")
        if isinstance(e, Arrival):
            if not isinstance(e.request, Request):
                raise TypeError(f"schedule[{i}].request must be a Request, got {type(e.request).__name__}")
            _int(e.step, f"schedule[{i}].step", 0)
        else:
            parent = seen.get(e.parent)
            if not isinstance(parent, Arrival):
                raise ValueError(f"schedule[{i}].parent {e.parent!r} names no earlier Arrival")
            _int(e.after, f"schedule[{i}].after", 1)
            if e.after >= parent.request.max_new_tokens:
                raise ValueError(f"schedule[{i}].after must be < the parent's max_new_tokens "
                                 f"{parent.request.max_new_tokens}, got {e.after}")
            _int(e.seed, f"schedule[{i}].seed", 0)
            if isinstance(e.temperature, bool) or not isinstance(e.temperature, (int, float)) or not (
                    0 <= e.temperature < float("inf")):
                raise ValueError(f"schedule[{i}].temperature must be finite and >= 0, got {e.temperature!r}")
        seen[e.id] = e
    validate([e.request for e in schedule if isinstance(e, Arrival)], params)


def refuse_unserved(serving: tuple, schedule, params, who: str) -> None:
    """NotImplementedError (the engine's refusal) for a part of ``serve`` not in ``serving``."""
    if not serving:
        raise NotImplementedError(f"{who} has no step-level serve")
    if "arrivals" not in serving and any(isinstance(e, Arrival) and e.step > 0 for e in schedule):
        raise NotImplementedError(f"{who} takes every request at step 0 (no arrivals)")
    if "fork" not in serving and any(isinstance(e, Fork) for e in schedule):
        raise NotImplementedError(f"{who} has no fork")


def _serving(impl):
    """``impl`` where it declares ``serve`` (its bad calls are checked there); else its refusal."""
    if not impl.capabilities().serving:
        raise NotImplementedError("the engine declares no serve (Capabilities.serving is empty)")
    return impl


def invalid_serve(folder: str, ok_request, params) -> list[InvalidCall]:
    """The documented bad ``serve`` calls; each fails before the (absent) model folder is read."""
    a = Arrival("a", ok_request, 0)

    def bad(what, schedule, raises, argument, p=params):
        return InvalidCall(what, (schedule, p), raises=(raises,), argument=argument, function="serve", on=_serving)

    return [
        bad("serve-schedule-not-a-list", (a,), TypeError, "schedule"),
        bad("serve-schedule-empty", [], ValueError, "schedule"),
        bad("serve-entry-not-an-arrival", [ok_request], TypeError, "schedule[0]"),
        bad("serve-step-negative", [Arrival("a", ok_request, -1)], ValueError, "step"),
        bad("serve-id-twice", [a, Arrival("a", ok_request, 1)], ValueError, "id"),
        bad("serve-fork-unknown-parent", [a, Fork("c", "b", 1)], ValueError, "parent"),
        bad("serve-fork-after-the-end", [a, Fork("c", "a", 2)], ValueError, "after"),
        bad("serve-fork-after-zero", [a, Fork("c", "a", 0)], ValueError, "after"),
    ]
