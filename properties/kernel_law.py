"""The template of a kernel's law over drawn cases: the body every law of the form "the kernel's
output on a case equals the reference's" shares (attention, its options, paged decode and
prefill, MLA decode, tree attention).

    law_matches_materialised = kernel_law(
        "law_matches_materialised", "KV-12: mla_decode ... equals attention over ...",
        fit=fit_budget, inputs=make_inputs, call=call, check=check_against_materialised)

The body, ``name(run, device, dtype, case, seed)``: a Triton kernel run under the interpreter
(``run.interpreted``) gets the case fitted to the interpreter's budget (``fit(case)``); the case
is noted (Hypothesis prints it with a failure); the inputs are built
(``inputs(case, seed, dtype, device)``), the implementation is called on them
(``call(run.impl, inputs, case, run=run)``: a refusal becomes the run's) and its output is
checked against the reference (``check(out, inputs, case)``). The law's name is the body's: the
coverage tables and the derandomized draws key on it.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

from hypothesis import note


def kernel_law(name: str, doc: str, *, inputs: Callable, call: Callable, check: Callable,
               fit: Callable | None = None, before: Callable | None = None) -> Callable[..., None]:
    """The body ``name(run, device, dtype, case, seed)`` of a kernel's law (see the module's
    docstring), documented by ``doc``, defined in the caller's module; ``before(run, case)``, when
    given, runs first (to refuse a case the implementation cannot take before any input is made).
    Raises TypeError naming the argument when ``name`` or ``doc`` is not a str, or ``inputs``,
    ``call``, ``check``, ``fit`` or ``before`` (when given) is not callable."""
    for arg, value in (("name", name), ("doc", doc)):
        if not isinstance(value, str):
            raise TypeError(f"kernel_law: {arg} must be a str, got {type(value).__name__}")
    for arg, value in (("inputs", inputs), ("call", call), ("check", check), ("fit", fit), ("before", before)):
        if not callable(value) and (value is not None or arg not in ("fit", "before")):
            raise TypeError(f"kernel_law: {arg} must be callable, got {type(value).__name__}")

    def body(run, device, dtype, case, seed) -> None:
        if before is not None:
            before(run, case)
        if run.interpreted and fit is not None:
            case = fit(case)
        note(f"{case}")
        args: Any = inputs(case, seed, dtype, device)
        check(call(run.impl, args, case, run=run), args, case)

    body.__name__ = body.__qualname__ = name
    body.__doc__ = doc
    body.__module__ = sys._getframe(1).f_globals.get("__name__", __name__)
    return body
