"""The isolations of a failing attention example (what the diagnosis replays the zoo on when an
implementation has several bugs at once: :mod:`inference_conformance.conformance.diagnosis`).

An implementation with a top-left mask *and* a wrong scale matches neither bug of the zoo on a
causal Tq < Tk call with any scale but 1/sqrt(D): both change its output. Each isolation is the
failing example with every feature of the call neutral (no mask, scale 1/sqrt(D), inputs of
normal magnitude, no window, soft-cap or sinks) but one, set as the example set it, or switched
on where the example left it off (a window of Tk/3, a soft-cap of 0.5, dominant sinks): on it,
only the bugs of that feature can change the output.
"""
from __future__ import annotations

import dataclasses
import math


def _case_key(drawn: dict) -> str | None:
    """The drawn argument that is an attention case (a dataclass with ``causal``, ``scale``, ``D``)."""
    return next((k for k, v in drawn.items() if dataclasses.is_dataclass(v) and not isinstance(v, type)
                 and all(hasattr(v, f) for f in ("causal", "scale", "D", "Tq", "Tk"))), None)


def isolations(drawn: dict) -> list[tuple[str, dict]]:
    """(label, drawn arguments) for each feature of the failing example's attention call that can
    be left alone: "the causal mask alone" (where Tq < Tk), "the scale alone", and for a case
    with options "the window alone" (causal, Tq = Tk: the mask's alignment cannot matter),
    "the soft-cap alone", "the sinks alone". [] for a law that draws no attention case."""
    key = _case_key(drawn)
    if key is None:
        return []
    case = drawn[key]
    names = {f.name for f in dataclasses.fields(case)}
    plain = 1.0 / math.sqrt(case.D)
    neutral = {"causal": False, "scale": plain}
    neutral.update({k: v for k, v in (("magnitude", "normal"), ("amp", 1.0)) if k in names})
    neutral.update({k: None for k in ("window", "softcap", "sinks") if k in names})
    features = []
    if case.Tq < case.Tk:
        features.append(("the causal mask alone", {"causal": True}))
    scale = case.scale if not math.isclose(case.scale, plain, rel_tol=1e-3) else 0.5 * plain
    features.append(("the scale alone", {"scale": scale}))
    if "window" in names:
        features.append(("the window alone", {"causal": True, "Tq": case.Tk,
                                              "window": case.window or max(1, case.Tk // 3)}))
    if "softcap" in names:
        features.append(("the soft-cap alone", {"softcap": case.softcap or 0.5}))
    if "sinks" in names:
        features.append(("the sinks alone", {"sinks": case.sinks or "dominant"}))
    return [(label, {**drawn, key: dataclasses.replace(case, **{**neutral, **change})}) for label, change in features]


__all__ = ["isolations"]
