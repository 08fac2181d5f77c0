"""The claims ledger (CLAIMS.md at the repository root), parsed into claim records."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

LEDGER = Path(__file__).resolve().parent.parent / "CLAIMS.md"
_CLAIM = re.compile(r"^- (?P<id>[A-Z]{2}-\d+) (?P<kind>exact|bound|figure|trend|analytic)[^:]*: (?P<text>.*)$")


@dataclass(frozen=True)
class Claim:
    id: str
    kind: str
    text: str
    section: str


def claims(path: Path = LEDGER) -> list[Claim]:
    """Every numbered claim, in ledger order. Raises FileNotFoundError if the ledger is missing."""
    out, section = [], ""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        m = _CLAIM.match(line.strip())
        if m:
            out.append(Claim(m["id"], m["kind"], m["text"], section))
    return out
