"""Device selection, without state of its own.

Without CUDA, Triton kernels run under Triton's interpreter, which is chosen when
``triton.jit`` decorates a function; so ``TRITON_INTERPRET=1`` must be set before any module
that defines a kernel is imported. :func:`resolve_device` only answers which device an option
names; :func:`use_device` sets the interpreter up for it, and is called by the pytest plugin
when the suite's own code is collected (never for a project's tests alone) and by the report's
entry point, never at import time. The chosen device of a pytest run lives in that run's
``config.stash`` (:mod:`inference_conformance.conformance.plugin_state`): :func:`current_device`
reads it.
"""
from __future__ import annotations

import os

DEVICES = ("cpu", "cuda", "auto")


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def resolve_device(requested: str | None = None) -> str:
    """The device ``requested`` names: "cpu", "cuda", or for None/""/"auto" "cuda" when
    ``torch.cuda.is_available()`` else "cpu". Sets nothing.

    Raises ValueError for an unknown name (naming ``requested``) or when "cuda" is requested on a
    machine without CUDA."""
    if requested not in (None, "", *DEVICES):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'auto', got {requested!r}")
    if requested in (None, "", "auto"):
        return "cuda" if cuda_available() else "cpu"
    if requested == "cuda" and not cuda_available():
        raise ValueError("device 'cuda' was requested but torch.cuda.is_available() is False")
    return requested


def use_device(device: str) -> str:
    """Set Triton up for ``device`` ("cpu" or "cuda"): on "cpu", ``TRITON_INTERPRET=1`` unless
    already set. Call before any kernel module is imported; returns ``device``. Raises ValueError
    for another name."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return device


def select_device(requested: str | None = None) -> str:
    """:func:`resolve_device` then :func:`use_device`: what a command of the suite's own (the
    report, a smoke script) calls once, first. Returns "cpu" or "cuda"; raises ValueError as
    :func:`resolve_device` does."""
    return use_device(resolve_device(requested))


def current_device(config=None) -> str:
    """The device of the pytest run ``config`` (default: the run collecting or running the
    current test, :func:`inference_conformance.conformance.plugin_state.active_config`); outside a
    pytest run (a command of the suite's own), :func:`select_device` of None, which sets Triton
    up for it. Returns "cpu" or "cuda"."""
    from inference_conformance.conformance import plugin_state

    config = config if config is not None else plugin_state.active_config()
    if config is None:
        return select_device(None)
    return plugin_state.state(config).device


def triton_interpreted() -> bool:
    """True when Triton kernels run under the interpreter (CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def cache_interpreter_patching() -> bool:
    """Make Triton's interpreter stop rescanning ``triton.language`` on every nested call.

    Under ``TRITON_INTERPRET=1`` every ``@triton.jit`` function called from a kernel (a tile
    body, once per tile) re-patches the language: ``_patch_builtin`` lists each module's members
    with ``inspect.getmembers`` and wraps those still marked builtin. Here the names that are
    builtin are read once per module and member count (a builtin added later, a new count, is
    read again) and each call checks only those names, wrapping exactly what the original wraps:
    the outputs are bit for bit the same. Measured on the attention kernels' production-sized
    calls: 1.5-1.9x faster on Triton 3.9, 1.2x on 3.6 (1.2x on one call on a loaded machine).

    Applied only to an interpreter whose ``_patch_builtin(pkg, builder, scope)`` and
    ``_patch_attr`` have the shape read here (any other Triton is left as it is). Returns whether
    it is applied; idempotent. Called by :mod:`inference_conformance.optimized.triton_shared` when kernels are
    interpreted."""
    import inspect

    try:
        from triton.runtime import interpreter
        import triton.language as tl
    except ImportError:
        return False
    original = getattr(interpreter, "_patch_builtin", None)
    if getattr(original, "_names_cached", False):
        return True
    if (original is None or not callable(getattr(interpreter, "_patch_attr", None))
            or list(inspect.signature(original).parameters) != ["pkg", "builder", "scope"]):
        return False
    is_builtin = tl.core.is_builtin
    names: dict[tuple[int, int], tuple[object, list[str]]] = {}

    def _patch_builtin(pkg, builder, scope):
        key = (id(pkg), len(vars(pkg)))
        known = names.get(key)
        if known is None or known[0] is not pkg:
            known = names[key] = (pkg, [n for n, m in inspect.getmembers(pkg) if is_builtin(m)])
        for name in known[1]:
            member = getattr(pkg, name)
            if is_builtin(member):
                interpreter._patch_attr(pkg, name, member, builder, scope)

    _patch_builtin._names_cached = True
    _patch_builtin.__wrapped__ = original
    interpreter._patch_builtin = _patch_builtin
    return True


def skip_discarded_overflow_checks() -> bool:
    """Stop Triton's interpreter computing integer-overflow checks whose verdict it discards.

    The interpreter's options default to ``sanitize_overflow=True`` with ``debug=False``: every
    32-bit ``+``, ``-`` and ``*`` in a kernel (its index arithmetic) is then recomputed in int64 and
    compared with the int32 range, and the result handed to ``device_assert``, which without
    ``debug`` returns at once: the check asserts nothing (compiled code drops it the same way).
    Measured on the split-KV kernel under FA-3: 40% of the interpreted time. Here the interpreter's
    options get ``sanitize_overflow=False`` while ``debug`` is off, so the kernels' outputs are bit
    for bit the same; a run with ``debug=True`` (overflow checks that do assert) is left as it is.

    Applied only to an interpreter whose builder has options with both fields (any other Triton is
    left as it is). Returns whether the checks are off; idempotent. Called by
    :mod:`inference_conformance.optimized.triton_shared` when kernels are interpreted."""
    import dataclasses

    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if (not dataclasses.is_dataclass(options) or getattr(options, "debug", True) is not False
            or not hasattr(options, "sanitize_overflow")):
        return False
    if options.sanitize_overflow:
        builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return True


#: What Triton < 3.7's interpreter raises, under numpy >= 2.4, for a loop with a run-time bound.
_RANGE_BOUND_ERROR = "only 0-dimensional arrays can be converted to Python scalars"


def interpreter_hint(text: str) -> str | None:
    """A hint for a failure whose text (``text``: the exception's, or the whole report's) is the
    interpreter's known limit rather than the implementation's error, else None: Triton < 3.7's
    interpreter with numpy >= 2.4 cannot take a run-time ``range`` bound in a kernel."""
    if _RANGE_BOUND_ERROR not in text or not triton_interpreted():
        return None
    return ("Triton's interpreter (< 3.7) with numpy >= 2.4 cannot take a run-time loop bound "
            "(`for i in range(start, end, STEP)` in a kernel): the kernel did not run, nothing was "
            "compared. Walk the tiles with a while loop (as optimized/triton_shared.py's tile_loop "
            "does there), or test with Triton >= 3.7 or numpy < 2.4; compiled kernels are not affected.")
