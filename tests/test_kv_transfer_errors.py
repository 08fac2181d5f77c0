"""What only the suite's own KV transfers and the engine surface they use promise about bad input
(the contract's documented bad calls run on every implementation in
``properties/test_contract_generic.py``): the engine's ``request_state``, ``block_ids``,
``release`` and ``admit`` refuse a request that is not ready, a state that is not one, a used
id, a full batch and a length that does not match the tokens, with their exact wording and
nothing booked; the built-in transfers name the payload type they expect; the disaggregated
engine refuses an unknown receive order."""
from __future__ import annotations

import dataclasses

import pytest

from inference_conformance.optimized.kv_transfer import PackedTokenTransfer
from inference_conformance.optimized.paged_attention.engine import PagedEngine
from inference_conformance.optimized.paged_attention.engine_disagg import DisaggregatedEngine
from inference_conformance.properties.paged_attention.engine_cases import model_for
from inference_conformance.reference.kv_transfer import TRANSFER

BUILTINS = [pytest.param(TRANSFER, id="reference"), pytest.param(PackedTokenTransfer(), id="packed_tokens")]


def _ready():
    model = model_for(0)
    e = PagedEngine(model, num_blocks=8, block_size=2)
    e.add_request("a", [1, 2, 3], 3)
    e.step()
    e.add_request("w", [4, 5], 2)
    return model, e


@pytest.mark.parametrize("method", ["request_state", "block_ids", "release"])
def test_engine_surface_refuses_a_request_not_ready(method):
    _, e = _ready()
    for rid in ("w", "zz"):
        with pytest.raises(ValueError, match=rf"request_id '{rid}' is not a running request of this engine with "
                                             r"its prompt computed \(ready to send: \['a'\]\)"):
            getattr(e, method)(rid)
    assert e.ready_to_send() == ["a"] and e.book.allocator.num_free == 6


def test_admit_refuses_bad_states_and_books_nothing():
    model, e = _ready()
    state = e.request_state("a")
    other = PagedEngine(model, num_blocks=8, block_size=3, max_batch=1)
    with pytest.raises(TypeError, match="state must be the RequestState request_state returned, got dict"):
        other.admit(vars(state))
    with pytest.raises(ValueError, match=r"state.length 2 must be the tokens but the last sampled one \(3 \+ 1 - 1\)"):
        other.admit(dataclasses.replace(state, length=2))
    assert other.book.allocator.num_free == 8 and not other.running
    assert len(other.admit(state)) == 1
    with pytest.raises(ValueError, match="request id 'a' is already used in this engine"):
        other.admit(state)
    with pytest.raises(ValueError, match=r"the batch is full \(1 running\)"):
        other.admit(dataclasses.replace(state, request_id="b"))


@pytest.mark.parametrize("transfer", BUILTINS)
def test_builtins_name_their_payload_and_the_engine_shape(transfer):
    model, e = _ready()
    payload = transfer.send(e, "a")
    with pytest.raises(TypeError, match=r"payload must be a \w+ this transfer's send returned, got tuple"):
        transfer.receive(PagedEngine(model, num_blocks=8, block_size=3), (payload,))
    with pytest.raises(TypeError, match=r"engine must be the suite's paged engine \(with block_size, k, v, "):
        transfer.send({"k": []}, "a")
    transfer.receive(PagedEngine(model, num_blocks=8, block_size=3), payload)


def test_disaggregated_engine_refuses_an_unknown_receive_order():
    model, e = _ready()
    with pytest.raises(ValueError, match="receive_order must be 'sent' or 'reversed', got 'random'"):
        DisaggregatedEngine(e, PagedEngine(model, num_blocks=8, block_size=3), receive_order="random")
