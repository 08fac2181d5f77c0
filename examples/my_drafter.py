"""A drafter written outside the suite, from its contract page (docs/drafter.md) alone.

Checked with no change to the suite:

    CI=true PYTHONPATH=examples .venv/bin/python -m pytest -n 1 properties --impl drafter=my_drafter:DRAFTER

It drafts a small token tree with no model: the continuations of the two latest earlier
occurrences of the context's last 3 tokens (else 2), up to 4 tokens each, as two sibling branches
under the last committed token (one branch when they start alike). ``BUGGY`` is the same with a
classic off-by-one: a node's parent is taken as the number of nodes so far, not that number
minus one, so every node after a branch's first names itself as its parent.
"""
from __future__ import annotations

from inference_conformance.conformance.contracts.drafter import validate


class TwoBranchLookup:
    """Two-branch n-gram lookup (n = 3, then 2), each branch up to ``depth`` tokens."""

    def __init__(self, depth: int = 4, off_by_one: bool = False):
        self.depth, self.off_by_one = depth, off_by_one

    def continuations(self, ctx: list) -> list:
        for n in (3, 2):
            if len(ctx) <= n:
                continue
            key, found = ctx[-n:], []
            for start in range(len(ctx) - n - 1, -1, -1):       # latest first, never the key itself
                if ctx[start:start + n] == key:
                    cont = ctx[start + n:start + n + self.depth]
                    if cont and all(cont[0] != f[0] for f in found):
                        found.append(cont)
                if len(found) == 2:
                    break
            if found:
                return found
        return []

    def propose(self, context, hidden, target):
        validate(context, hidden, target)                      # TypeError / ValueError naming the argument
        parents, tokens = [], []
        for branch in self.continuations(list(context)):
            for j, token in enumerate(branch):
                if j == 0:
                    parents.append(-1)
                else:
                    parents.append(len(parents) if self.off_by_one else len(parents) - 1)
                tokens.append(token)
        return parents, tokens


DRAFTER = TwoBranchLookup()
BUGGY = TwoBranchLookup(off_by_one=True)
