"""The law of KV transfers between a prefill and a decode engine (claim PA-9; lecture 001 §4.5,
Splitwise, DistServe).

PA-9: a prefill engine and a decode engine, each with its own pool and block size, the KV moved
by the ``kv_transfer`` implementation under test (``conformance/contracts/kv_transfer.py``):
every request continues exactly as in one engine (logits within the float64 tolerance, tokens
equal), whatever the two block sizes, the request lengths and the order the pools hand blocks
out, with several requests in flight received in another order than sent. The law runs over every registered transfer; it rejects every
known-bad one (``zoo.py``): the last partial block dropped, the blocks
sent in block-id order, the tail truncated to the receiver's whole blocks, the tokens placed at
the sender's ids, the blocks read in the other layout (Hkv before block_size).
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import note
from hypothesis import strategies as st

from inference_conformance.conformance.contracts.kv_transfer import COVERAGE
from inference_conformance.conformance.laws import Kills, Law, refusal
from inference_conformance.conformance.tolerance import assert_close, assert_exact
from inference_conformance.optimized.paged_attention.engine import PagedEngine
from inference_conformance.properties.kv_transfer.cases import EXAMPLES, CrashesFail, observation, run_disaggregated
from inference_conformance.properties.paged_attention.engine_cases import blocks_for, model_for, run_engine, workloads

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: The known-bad transfers (``properties/kv_transfer/zoo.py``) PA-9's law must reject.
ZOO = ("drops_last_partial_block", "blocks_in_id_order", "truncated_to_whole_blocks", "placed_at_sender_ids",
       "head_major_layout_mismatch", "reads_after_release")


def law_transfer_continues_as_one_engine(run, device, reqs, bs_send, bs_receive, slack, seed, pool_seed, budget,
                                         receive_order):
    """PA-9: requests computed by a prefill engine and moved by the transfer into a decode
    engine's pool (its own ids and block size) continue exactly as in one engine: every token's
    logits within the float64 tolerance, every sampled token equal. A crash in ``send`` or
    ``receive`` fails it naming the call (:class:`CrashesFail`)."""
    model = model_for(seed, device)
    one = PagedEngine(model, num_blocks=blocks_for(reqs, bs_send) * len(reqs) + slack, block_size=bs_send,
                      keep_logits=True)
    run_engine(one, reqs, device)
    with refusal(run, f"{run.impl.name} refused blocks of {bs_send} -> {bs_receive}"):
        dis = run_disaggregated(CrashesFail(run.impl, run.implementation), model, reqs, bs_send, bs_receive, slack,
                                pool_seed, budget, receive_order, device)
    moved = sum(r.max_new > 1 for r in reqs)
    run.observe(observation(dict(reqs=reqs, bs_send=bs_send, bs_receive=bs_receive, pool_seed=pool_seed,
                                 receive_order=receive_order), dis))
    note(f"transfers {dis.transfers}, in flight {dis.most_in_flight}, prefill {dict(dis.prefill_engine.stats)}, "
         f"decode {dict(dis.decode_engine.stats)}")
    assert dis.transfers == moved, f"{dis.transfers} transfers, {moved} requests of more than one token"
    what = f"prefill blocks of {bs_send} -> decode blocks of {bs_receive} (received {receive_order}) vs one engine"
    for i, r in enumerate(reqs):      # logits first: the diagnosis tells the transfer bugs apart by them
        assert_close(torch.stack(dis.logits[i]), torch.stack(one.logits[i]),
                     what=f"request {i} (prompt {len(r.prompt)}, {r.max_new} new, T={r.temperature}) logits, {what}")
        assert_exact(torch.tensor(dis.finished[i]), torch.tensor(one.finished[i]), what=f"request {i} tokens, {what}")


PA9 = Law(
    claim="PA-9", technique="kv_transfer", body=law_transfer_continues_as_one_engine,
    given={"reqs": workloads(max_requests=4, max_prompt=16), "bs_send": st.integers(1, 5),
           "bs_receive": st.integers(1, 5), "slack": st.integers(0, 6), "seed": st.integers(0, 100),
           "pool_seed": st.none() | st.integers(0, 2**16), "budget": st.sampled_from([None, None, 3, 8]),
           "receive_order": st.sampled_from(["sent", "reversed"])},
    examples=EXAMPLES,
    params=("device",),
    kills=(Kills(ZOO),),
    coverage=COVERAGE,
    require_coverage=True,
    max_examples=lambda n: max(6, n // 3),
    test="test_pa9_transfer_continues_as_one_engine", zoo_tests=("test_pa9_zoo_bad_transfer_rejected",))
