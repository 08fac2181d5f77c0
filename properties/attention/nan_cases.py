"""The cases of the attention contract's NaN rule (its law is in ``laws.py``): one NaN placed in
q, k or v, and where the contract says the output is NaN or unspecified."""
from __future__ import annotations

from dataclasses import dataclass

import torch



@dataclass(frozen=True)
class NanCase:
    """One NaN placed in ``where`` ("q", "k" or "v") at batch ``b``, head ``h`` (a query head for
    q, a KV head for k and v), position ``t`` and component ``d``."""

    causal: bool
    Tq: int
    Tk: int
    where: str
    b: int
    h: int
    t: int
    d: int
    B: int = 2
    Hq: int = 4
    Hkv: int = 2
    D: int = 8


def expected_nan(c: NanCase) -> torch.Tensor:
    """(B, Hq, Tq, D) bool: where the contract says the output is NaN."""
    return _masks(c)[0]


def unspecified(c: NanCase) -> torch.Tensor:
    """(B, Hq, Tq, D) bool: where the contract leaves the output unspecified (a NaN value under
    a key the mask hides: component d of the rows that cannot see it, 0 x NaN)."""
    return _masks(c)[1]


def _masks(c: NanCase) -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.zeros(c.B, c.Hq, c.Tq, c.D, dtype=torch.bool)
    free = torch.zeros_like(mask)
    if c.where == "q":
        mask[c.b, c.h, c.t, :] = True
        return mask, free
    group = c.Hq // c.Hkv
    heads = range(c.h * group, (c.h + 1) * group)
    rows = [i for i in range(c.Tq) if not c.causal or c.t <= i + (c.Tk - c.Tq)]
    for h in heads:
        for i in range(c.Tq):
            if i not in rows:
                free[c.b, h, i, c.d] = c.where == "v"
            elif c.where == "k":
                mask[c.b, h, i, :] = True
            else:
                mask[c.b, h, i, c.d] = True
    return mask, free


#: A NaN seen by every row, one seen only by the last rows (a key the causal mask hides from
#: the others), one in a query row, one in a value; the decode shape (Tq = 1) and Tq = Tk.
CASES = (
    NanCase(True, 5, 9, "k", 1, 0, 8, 3),    # the last key: only the last query sees it
    NanCase(True, 5, 9, "k", 0, 1, 2, 0),    # an early key: every row sees it
    NanCase(True, 6, 6, "v", 1, 1, 4, 5),    # Tq = Tk: rows 4, 5 see it, component 5 only
    NanCase(False, 5, 9, "k", 0, 0, 8, 1),   # no mask: every row sees every key
    NanCase(True, 5, 9, "q", 1, 2, 3, 7),    # a query row
    NanCase(False, 1, 33, "q", 0, 3, 0, 0),  # decode
    NanCase(True, 1, 33, "v", 1, 0, 32, 2),  # decode: the newest value
)
