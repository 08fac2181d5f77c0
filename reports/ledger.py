"""The claims ledger (``CLAIMS.md``), parsed into claim records.

The ledger sits at the repository's root and ships inside the package as
``inference_conformance/CLAIMS.md`` (in the checkout a link to the root's file; setuptools copies
its content into the wheel), so it is read through :mod:`importlib.resources` wherever the suite
runs: a checkout on ``PYTHONPATH``, an editable install or a wheel.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

#: The shipped ledger: a :class:`importlib.resources.abc.Traversable` (``read_text`` works on it).
LEDGER = resources.files("inference_conformance") / "CLAIMS.md"
_CLAIM = re.compile(r"^- (?P<id>[A-Z]{2}-\d+) (?P<kind>exact|bound|figure|trend|analytic)[^:]*: (?P<text>.*)$")


@dataclass(frozen=True)
class Claim:
    """One numbered claim: ``id`` ("FA-3"), ``kind`` (exact, bound, figure, trend, analytic),
    its ``text`` and the ledger ``section`` (its ``##`` heading) it stands under."""

    id: str
    kind: str
    text: str
    section: str


def parse(text: str) -> list[Claim]:
    """Every numbered claim in the ledger ``text``, in ledger order."""
    out, section = [], ""
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        m = _CLAIM.match(line.strip())
        if m:
            out.append(Claim(m["id"], m["kind"], m["text"], section))
    return out


def claims(path: Path | None = None) -> list[Claim]:
    """Every numbered claim of the ledger at ``path`` (default: the shipped :data:`LEDGER`), in
    ledger order. Raises FileNotFoundError if the ledger is missing (a broken install)."""
    return parse((LEDGER if path is None else Path(path)).read_text(encoding="utf-8"))
