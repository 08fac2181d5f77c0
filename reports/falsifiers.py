"""Which known-bad implementation makes each claim's verdict fail: the table ``docs/claims.md``.

Every verdict must be able to fail. For each claim of ``CLAIMS.md`` this lists the bug-zoo
entries its laws are declared to reject (the ``kills`` of every zoo test marked with the claim,
read from pytest's own collection of ``properties/``, so the table is what the suite runs, not a
list typed twice), and, for a claim no zoo test names, says so: its failing input is a data case
of its own check (a pinned example, an analytic figure, a benchmark's trend), named by its tests
in the report.

Used by ``python -m inference_conformance.reports.docs``; as a pytest plugin (``-p inference_conformance.reports.falsifiers``) it prints the
collected zoo tests, and the tests named for a rejection (``*zoo*``, ``*reject*``: a law shown
rejecting known-bad data), as JSON lines (``ZOO-TEST {...}``), and every other test marked with a
claim (``LAW-TEST {...}``: whether it takes registered implementations, or why not), and collects
nothing else. :func:`laws_off_the_registry` reads the second kind: a law that runs on the suite's
built-ins only, unless it says why (``@pytest.mark.suite_own("why")``).
"""
from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "ZOO-TEST "
LAW_PREFIX = "LAW-TEST "


def pytest_collection_modifyitems(session, config, items):
    """Print one JSON line per zoo test: its test name, technique, claims and zoo entry."""
    for item in items:
        cs = getattr(item, "callspec", None)
        bad = cs.params.get("bad_impl") if cs is not None else None
        name = item.nodeid.split("::")[-1]
        claims = item.get_closest_marker("claim")
        if bad is None and not re.search(r"zoo|reject", name.split("[")[0]):
            if claims is not None:
                own = item.get_closest_marker("suite_own")
                print(LAW_PREFIX + json.dumps({"test": item.nodeid.split("[")[0], "claims": list(claims.args),
                                               "impl": cs is not None and "impl" in cs.params,
                                               "own": (own.args[0] if own and own.args else "") if own else None}),
                      flush=True)
            continue
        tech = item.get_closest_marker("technique")
        print(PREFIX + json.dumps({"test": item.nodeid.split("[")[0], "technique": tech.args[0] if tech else "",
                                   "claims": list(claims.args) if claims else [],
                                   "zoo": bad.name if bad is not None else None,
                                   "case": name[len(name.split("[")[0]):]}), flush=True)
    items[:] = []


def zoo_tests(root: Path = ROOT) -> list[dict]:
    """Every collected zoo test of ``properties/`` (subprocess: the suite's own collection, ~10 s
    on 2 cores; made once per process and root). Raises RuntimeError with pytest's output when
    the collection fails."""
    return [dict(z) for z in _zoo_tests(Path(root).resolve()) if not z.get("law")]


@functools.lru_cache(maxsize=None)
def _zoo_tests(root: Path) -> tuple[dict, ...]:
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "inference_conformance.reports.falsifiers",
                        "--collect-only", "-q", "--device", "cpu", "properties"],
                       cwd=root, capture_output=True, text=True, timeout=600)
    rows = [json.loads(line[len(PREFIX):]) for line in r.stdout.splitlines() if line.startswith(PREFIX)]
    laws = [dict(json.loads(line[len(LAW_PREFIX):]), law=True) for line in r.stdout.splitlines()
            if line.startswith(LAW_PREFIX)]
    if not rows or not laws:
        raise RuntimeError(f"no zoo test or law collected (exit {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return tuple(rows + laws)


def law_tests(root: Path = ROOT) -> list[dict]:
    """Every other collected test of ``properties/`` marked with a claim: {"test", "claims",
    "impl" (True when a case of it takes a registered implementation), "own" (the reason of its
    ``suite_own`` marker, "" when it gives none; None without the marker)}."""
    return [dict(z) for z in _zoo_tests(Path(root).resolve()) if z.get("law")]


def laws_off_the_registry(root: Path = ROOT) -> list[str]:
    """The laws (claim tests of ``properties/``, zoo and rejection tests aside) that take no
    registered implementation and are not marked ``suite_own`` with a reason: each would judge
    the suite's own code only, where an outside implementation cannot reach it."""
    return sorted({z["test"] for z in law_tests(root) if not z["impl"] and not z["own"]})


def claims_without_rejection(root: Path = ROOT) -> list[str]:
    """Claim ids of ``CLAIMS.md`` that no zoo test and no ``*reject*``/``*zoo*`` test marked with
    the claim shows failing (the suite's own collection of ``properties/``)."""
    from inference_conformance.reports.ledger import claims

    shown = {cid for z in zoo_tests(root) for cid in z["claims"]}
    return [c.id for c in claims(root / "CLAIMS.md") if c.id not in shown]


def render(root: Path = ROOT) -> str:
    """The markdown table claim -> the known-bad implementations that make it fail."""
    from inference_conformance.reports.ledger import claims

    by_claim: dict[str, dict[str, set]] = defaultdict(lambda: defaultdict(set))
    by_data: dict[str, set] = defaultdict(set)
    for z in zoo_tests(root):
        for cid in z["claims"]:
            if z["zoo"] is not None:
                by_claim[cid][f"{z['technique']}:{z['zoo']}"].add(z["test"].split("::")[-1])
            else:
                by_data[cid].add(z["test"].split("::")[-1] + z["case"])
    lines = ["# What makes each claim fail", "",
             "<!-- generated by `python -m inference_conformance.reports.docs` from pytest's collection of properties/ and "
             "CLAIMS.md: edit the laws, not this page -->", "",
             "Every verdict must be able to fail. For each claim: the known-bad implementations "
             "(bug-zoo entries, `docs/<technique>.md` says what each gets wrong) that its laws are "
             "declared to reject, and the zoo tests that reject them. A claim with none is failed "
             "by data of its own check instead (a pinned case, an analytic figure, a benchmark "
             "trend): its tests are named in the report.", "",
             "| claim | kind | known-bad implementations rejected | zoo tests | other rejection tests |",
             "|---|---|---|---|---|"]
    covered = shown = 0
    missing = []
    for c in claims(root / "CLAIMS.md"):
        entries = by_claim.get(c.id, {})
        covered += bool(entries)
        shown += bool(entries) or bool(by_data.get(c.id))
        if not (entries or by_data.get(c.id)):
            missing.append(c.id)
        names = ", ".join(f"`{e}`" for e in sorted(entries)) or "-"
        tests = ", ".join(f"`{t}`" for t in sorted({t for ts in entries.values() for t in ts})) or "-"
        data = ", ".join(f"`{t}`" for t in sorted(by_data.get(c.id, ()))) or "-"
        lines.append(f"| {c.id} | {c.kind} | {names} | {tests} | {data} |")
    total = len(claims(root / "CLAIMS.md"))
    lines += ["", f"{covered} of {total} claims have known-bad implementations of their own; {shown} of {total} "
              "have a test that shows their check rejecting a known-bad implementation or input."]
    lines[-1] += (f" Without one: {', '.join(missing)}: failed only by their own data (an analytic figure or "
                  "a trend measured against its mark), the gap this table exists to show." if missing else
                  " tests/test_docs.py keeps it so: a new claim needs one.")
    return "\n".join(lines) + "\n"
