"""Device selection, done once per process before any Triton kernel is defined.

Without CUDA, Triton kernels run under Triton's interpreter, which is chosen when
``triton.jit`` decorates a function; so ``TRITON_INTERPRET=1`` must be set before any module
that defines a kernel is imported. :func:`select_device` is called from the pytest plugin's
``pytest_configure`` and from the report's entry point, never at import time.
"""
from __future__ import annotations

import os

_selected: str | None = None


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def select_device(requested: str | None = None) -> str:
    """Resolve ``requested`` ("cpu", "cuda" or None for auto) and set up Triton accordingly.

    Returns "cpu" or "cuda". Raises ValueError for an unknown name or when "cuda" is requested
    on a machine without CUDA.
    """
    global _selected
    if requested not in (None, "", "auto", "cpu", "cuda"):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'auto', got {requested!r}")
    if requested in (None, "", "auto"):
        device = "cuda" if cuda_available() else "cpu"
    else:
        device = requested
        if device == "cuda" and not cuda_available():
            raise ValueError("device 'cuda' was requested but torch.cuda.is_available() is False")
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    _selected = device
    return device


def current_device() -> str:
    """The device chosen by :func:`select_device` (auto-selecting if it was never called)."""
    return _selected if _selected is not None else select_device(None)


def triton_interpreted() -> bool:
    """True when Triton kernels run under the interpreter (CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"
