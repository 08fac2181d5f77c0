"""The coverage table of PA-9's pinned examples and the transfer tests beside its law
(``laws.py``).
"""
from __future__ import annotations

import pytest

from inference_conformance.conformance import results
from inference_conformance.optimized.paged_attention.engine_disagg import DisaggregatedEngine
from inference_conformance.conformance.coverage import classes_reached, missing_classes
from inference_conformance.properties.kv_transfer.cases import FOUR_AT_ONCE, observation, run_disaggregated
from inference_conformance.properties.kv_transfer.laws import PA9
from inference_conformance.properties.paged_attention.engine_cases import model_for
from inference_conformance.reference.kv_transfer import TRANSFER

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.claim("PA-9")
@pytest.mark.suite_own("the suite's pinned examples reach every boundary class")
def test_pa9_coverage_table():
    """The boundary classes each pinned example reaches (every profile runs them)."""
    table: dict = {}
    for i, ex in enumerate(PA9.examples):
        dis = run_disaggregated(TRANSFER, model_for(ex["seed"]), ex["reqs"], ex["bs_send"], ex["bs_receive"],
                                ex["slack"], ex["pool_seed"], ex["budget"], ex["receive_order"])
        for name in classes_reached(PA9.coverage, PA9.name, observation(ex, dis)):
            table.setdefault(name, []).append(f"example {i}")
    missing = missing_classes(PA9.coverage, table, PA9.name)
    results.record("PA-9", measured=len(table), bound=len(table) + len(missing),
                   unit="boundary classes reached by the pinned examples",
                   rule="every class of the kv_transfer contract is reached in every Hypothesis profile",
                   coverage=dict(sorted(table.items())))
    assert not missing, f"pinned examples miss {missing}"


@pytest.mark.claim("PA-9")
@pytest.mark.suite_own("the pinned examples really move blocks to other ids and sizes (the suite's engines)")
def test_pa9_transfer_moves_blocks_to_other_ids():
    """The pinned transfer really changes ids and block sizes: the decode engine holds each
    transferred request in blocks of 2 at ids other than the prefill engine's blocks of 3, and
    four requests are in flight at once."""
    model = model_for(13)
    seen = {}

    class Watching:
        def send(self, engine, request_id):
            seen[request_id] = engine.block_ids(request_id)
            return TRANSFER.send(engine, request_id)

        def receive(self, engine, payload):
            TRANSFER.receive(engine, payload)
            rid = payload.state.request_id
            seen[rid] = (seen[rid], list(engine.book.tables[rid]))

    dis = run_disaggregated(Watching(), model, FOUR_AT_ONCE, 3, 2, 3, 1, receive_order="reversed")
    assert isinstance(dis, DisaggregatedEngine) and dis.transfers == 4 and dis.most_in_flight == 4
    moved = sum(sent[:len(got)] != got for sent, got in seen.values())
    assert moved == 4, seen
    results.record("PA-9", measured=0, bound=0, unit="requests whose tokens differ from one engine",
                   rule=f"{len(FOUR_AT_ONCE)} requests transferred from blocks of 3 to blocks of 2 at other ids "
                        f"(pools in random order, {dis.most_in_flight} in flight, received in reverse); the zoo's "
                        "dropped, reordered, truncated, misplaced and mis-laid-out transfers are rejected")
