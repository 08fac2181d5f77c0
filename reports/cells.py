"""What a report cell says beyond its verdict, shared by the report (:mod:`inference_conformance.reports.build`)
and the conformance matrix (:mod:`inference_conformance.reports.merge`): the batch-invariance property
that ``properties/test_batch_invariance.py`` records in its rows' ``extra`` (``batch_invariant``,
``max_batch_diff``, ``declared``), and an engine's declared capabilities
(``properties/inference_engine/declarations.py``: ``capabilities``).
"""
from __future__ import annotations

import math


def _num(x) -> str:
    return f"{x:.4g}" if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x)


def batch_invariance_text(extras: list[dict]) -> str | None:
    """The property over the rows' ``extras`` of one implementation (dicts; those without a bool
    ``batch_invariant`` are ignored): "bitwise invariant" where every row says invariant, else
    "not invariant: max abs diff X" (X the largest ``max_batch_diff``, inf where NaN appeared on
    one side), with ", declared" where a row says the implementation declares it; None when no
    row measured it."""
    seen = [x for x in extras if isinstance(x, dict) and isinstance(x.get("batch_invariant"), bool)]
    if not seen:
        return None
    diffs = [float(x["max_batch_diff"]) if isinstance(x.get("max_batch_diff"), (int, float)) else math.inf
             for x in seen if not x["batch_invariant"]]
    text = f"not invariant: max abs diff {_num(max(diffs))}" if diffs else "bitwise invariant"
    return text + (", declared" if any(x.get("declared") for x in seen) else "")


def declared_text(extras: list[dict]) -> str | None:
    """An engine's declared capabilities over its rows' ``extras`` ("declares ..."), None where
    no row says them."""
    said = [x["capabilities"] for x in extras if isinstance(x, dict) and isinstance(x.get("capabilities"), str)]
    return f"declares {said[-1]}" if said else None
