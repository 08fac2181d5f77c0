"""The sizes of the main job's experiments, default and full, in one place.

``python -m inference_conformance.reports`` runs every experiment at its default size, chosen so
that the whole job finishes in minutes on two cores and each claim is still checked, at the size
its row states, by a test that can fail; ``--full`` (``INFERENCE_CONFORMANCE_FULL=1`` in the
environment of a pytest process) runs the sizes the experiments were designed at. A statistical
test keeps its calibration at either size: its limit and its stated power are computed from the
size (never from what it measured), and the row says both.

Each entry is a :class:`Size`: the claim, what is counted, the default and the full value.
:func:`size` gives the value of the running mode, :func:`stated` the words a row quotes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

#: The environment variable that asks for the full sizes ("1", "true", "yes" or "on").
FULL_ENV = "INFERENCE_CONFORMANCE_FULL"


@dataclass(frozen=True)
class Size:
    """One experiment's size: ``claim`` (a CLAIMS.md id), ``what`` it counts (with its unit),
    ``default`` (the main job's) and ``full`` (``--full``)."""

    claim: str
    what: str
    default: Any
    full: Any


SIZES: dict[str, Size] = {
    # SD-1: calibration of the statistical law (false alarms of a correct verifier, power)
    "sd1_exact_draws": Size("SD-1", "exact multinomial draws of the whole law", 5_000, 20_000),
    "sd1_calibration_runs": Size("SD-1", "reseeded runs of the law on the batched verifier", 300, 1000),
    "sd1_power_runs": Size("SD-1", "reseeded runs per subtle known-bad verifier", 20, 50),
    # SD-3: grammatical fraction, equivalence of speculative and target sampling
    "sd3_docs": Size("SD-3", "documents per arm", 1000, 4000),
    "sd3_margin": Size("SD-3", "equivalence margin (grammatical fraction)", 0.04, 0.02),
    # SD-9: wall-clock speedup against target-only decoding (B = 1)
    "sd9_gammas": Size("SD-9", "draft lengths γ", (1, 2, 4, 6, 8), tuple(range(1, 9))),
    "sd9_tokens": Size("SD-9", "tokens generated per timed run", 64, 96),
    "sd9_repeats": Size("SD-9", "paired timed runs per γ", 5, 5),
}


def full() -> bool:
    """Whether the full sizes are asked for (``INFERENCE_CONFORMANCE_FULL``)."""
    return os.environ.get(FULL_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def mode() -> str:
    """"full" or "default": the sizes in force."""
    return "full" if full() else "default"


def size(name: str) -> Any:
    """The value of size ``name`` in the running mode. Raises TypeError for a non-str ``name``
    and ValueError for an unknown one (naming the known ones)."""
    return getattr(_entry(name), mode())


def stated(name: str) -> str:
    """The words a row quotes for size ``name``: "documents per arm: 1000 (default size; full:
    4000)". Raises like :func:`size`."""
    s = _entry(name)
    other = "default" if full() else "full"
    return f"{s.what}: {_show(size(name))} ({mode()} size; {other}: {_show(getattr(s, other))})"


def _show(v: Any) -> str:
    return "{" + ", ".join(map(str, v)) + "}" if isinstance(v, tuple) else str(v)


def _entry(name: str) -> Size:
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if name not in SIZES:
        raise ValueError(f"name: unknown size {name!r}; known: {', '.join(sorted(SIZES))}")
    return SIZES[name]
