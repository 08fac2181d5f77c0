"""The coverage table of SD-12's pinned examples (the drafter laws are in ``laws.py``)."""
from __future__ import annotations

import pytest

from inference_conformance.conformance import results
from inference_conformance.conformance.contracts.drafter import COVERAGE
from inference_conformance.properties.drafter.cases import greedy_tokens, prompt_for, replay, speculate
from inference_conformance.properties.drafter.laws import AHEAD, SD12, SD12_EXAMPLES

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.claim("SD-12", "SD-14")
@pytest.mark.suite_own("the suite's pinned examples reach every boundary class")
def test_drafter_coverage_table():
    """The boundary classes the pinned examples of SD-12 reach with the draft chain (the one
    drafter of the suite that proposes in every round)."""
    from inference_conformance.conformance.coverage import classes_reached, missing_classes
    from inference_conformance.optimized.drafter import ChainDrafter

    table: dict = {}
    for i, ex in enumerate(SD12_EXAMPLES):
        prompt = prompt_for(ex["kind"], ex["seed"])
        _, _, watched = speculate(ChainDrafter(None, 4), prompt, ex["n_tokens"], check_cache=False,
                                  max_seq_len=len(prompt) + ex["n_tokens"] + ex["slack"])
        for r in replay(watched.calls, greedy_tokens(tuple(prompt), ex["n_tokens"] + AHEAD)):
            for name in classes_reached(COVERAGE, SD12.name, r):
                table.setdefault(name, set()).add(f"example {i}")
    missing = missing_classes(COVERAGE, table, SD12.name)
    results.record("SD-12", measured=len(table), bound=len(table) + len(missing),
                   unit="boundary classes reached by the pinned examples",
                   rule="every class of the drafter contract is reached in every Hypothesis profile",
                   coverage={k: sorted(v) for k, v in sorted(table.items())})
    assert not missing, f"pinned examples miss {missing}"
