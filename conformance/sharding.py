"""``--shard K/N``: run one of N parts of a pytest selection, so that one suite run can be split
across processes, CI jobs or machines and merged afterwards (``python -m inference_conformance.reports merge``).

The collected tests are ordered by a stable hash of their node id (SHA-256, never Python's
salted ``hash()``) and dealt out in turn: test number i of that order runs in shard
``i mod N + 1``. Every shard of the same command on the same checkout collects the same tests,
so the N shards run each test exactly once between them and their counts differ by at most one;
the deal does not depend on the order of collection, the worker count (``-n``) or the machine.
Each shard writes its own run folder (``--results DIR``); :mod:`inference_conformance.reports.merge` combines them.
"""
from __future__ import annotations

import hashlib
import re

import pytest

_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def parse(spec: str | None) -> tuple[int, int] | None:
    """``"2/3"`` -> (2, 3); None for no sharding. Raises ValueError (naming ``--shard``) unless
    1 <= K <= N."""
    if spec is None or spec == "":
        return None
    if not isinstance(spec, str):
        raise TypeError(f"--shard must be a string K/N, got {type(spec).__name__}")
    m = _SPEC.match(spec)
    if m is None:
        raise ValueError(f"--shard {spec!r}: expected K/N with 1 <= K <= N (e.g. 2/3)")
    k, n = int(m.group(1)), int(m.group(2))
    if not 1 <= k <= n:
        raise ValueError(f"--shard {spec!r}: K must be between 1 and N (got K={k}, N={n})")
    return k, n


def key(nodeid: str) -> str:
    """The stable sort key of one test (hex SHA-256 of its node id)."""
    return hashlib.sha256(nodeid.encode("utf-8")).hexdigest()


def assign(nodeids: list[str], n: int) -> dict[str, int]:
    """node id -> its shard (1..n): the ids in :func:`key` order, dealt out in turn."""
    order = sorted(set(nodeids), key=lambda i: (key(i), i))
    return {nid: pos % n + 1 for pos, nid in enumerate(order)}


def add_option(group) -> None:
    group.addoption("--shard", default=None, metavar="K/N",
                    help="run only shard K of N of the collected tests (a stable hash of each test id); "
                         "merge the shards' --results folders with python -m inference_conformance.reports merge")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Keep this shard's tests (after every other selection: -k, --impl, --zoo-only)."""
    spec = parse(config.getoption("shard", default=None))
    if spec is None:
        return
    k, n = spec
    shard = assign([i.nodeid for i in items], n)
    keep = [i for i in items if shard[i.nodeid] == k]
    drop = [i for i in items if shard[i.nodeid] != k]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
