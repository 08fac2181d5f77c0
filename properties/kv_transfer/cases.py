"""Runs of a ``kv_transfer`` implementation for the law of PA-9: a prefill engine and a decode engine
(``optimized/paged_attention/engine_disagg.py``), each with its own pool and block size, requests
moved between them by the implementation under test (:func:`run_disaggregated`), judged against
one engine running the same requests; the drawn and pinned cases and the contract's bad calls
(:func:`invalid_calls`, which need engines over a model); the law is in ``laws.py``.

Inputs are drawn to find the field's transfer bugs: the two block sizes in every order, prompt
lengths at a multiple of either block size and one off, prompts shorter than one block, pools
that hand blocks out in a shuffled order (the sender's ids follow no pattern), several requests
in flight at once received in reverse order, sampled requests (their generator travels with
them), and a prefill engine with a token budget (prompts computed in chunks).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from inference_conformance.conformance.failures import crash_fails
from inference_conformance.conformance.registry import InvalidCall
from inference_conformance.optimized.paged_attention.engine import PagedEngine
from inference_conformance.optimized.paged_attention.engine_disagg import DisaggregatedEngine
from inference_conformance.properties.paged_attention.engine_cases import (
    CFG,
    Req,
    model_for,
    run_engine,
)
from inference_conformance.reference.transformer import Transformer, init_weights



@dataclass(frozen=True)
class TransferRun:
    """What one example of the law handed the implementation (its coverage observation):
    ``bs_send`` / ``bs_receive`` the prefill and decode engines' block sizes, ``lengths`` the
    tokens sent per transferred request, ``shuffled`` whether both pools hand blocks out in a
    shuffled order, ``most_in_flight`` the most payloads sent before the first was received,
    ``receive_order`` "sent" or "reversed"."""

    bs_send: int
    bs_receive: int
    lengths: tuple
    shuffled: bool
    most_in_flight: int
    receive_order: str


def observation(case: dict, dis: DisaggregatedEngine) -> TransferRun:
    """The coverage observation of the law's example ``case`` (its drawn arguments) run as ``dis``."""
    return TransferRun(case["bs_send"], case["bs_receive"], tuple(len(r.prompt) for r in case["reqs"] if r.max_new > 1),
                       case["pool_seed"] is not None, dis.most_in_flight, case["receive_order"])


def run_disaggregated(transfer, model, reqs, bs_send: int, bs_receive: int, slack: int, pool_seed: int | None,
                      budget: int | None = None, receive_order: str = "sent", device: str = "cpu",
                      ) -> DisaggregatedEngine:
    """A prefill engine (blocks of ``bs_send``, token budget ``budget``) and a decode engine
    (``bs_receive``), each pool handing its blocks out in a random order drawn from ``pool_seed``
    (None: in order), requests moved by ``transfer`` and received in ``receive_order``; returns
    the :class:`DisaggregatedEngine` after running ``reqs`` at their arrival steps."""
    def engine(bs, salt):
        e = PagedEngine(model, num_blocks=sum(-(-(len(r.prompt) + r.max_new) // bs) for r in reqs) + slack,
                        block_size=bs, keep_logits=True, max_num_batched_tokens=budget if salt == 0 else None)
        if pool_seed is not None:
            e.book.allocator.shuffle_free(torch.Generator().manual_seed(pool_seed + salt))
        return e
    dis = DisaggregatedEngine(engine(bs_send, 0), engine(bs_receive, 1), transfer, receive_order=receive_order)
    run_engine(dis, reqs, device)
    return dis


#: What the contract documents ``send`` and ``receive`` raising (for bad calls): they pass through.
DOCUMENTED = (TypeError, ValueError)


class CrashesFail:
    """``transfer`` as the law calls it: an exception the contract does not document (not a
    refusal, not :data:`DOCUMENTED`), raised in its ``send`` or ``receive``, fails the law
    (:class:`inference_conformance.conformance.failures.ImplementationCrash`) naming ``who``, the
    call, the request id and the exception."""

    def __init__(self, transfer, who: str) -> None:
        self.transfer, self.who, self._sent = transfer, who, []

    def send(self, engine, request_id):
        with crash_fails(f"{self.who}: send(prefill engine, request {request_id!r})", DOCUMENTED):
            payload = self.transfer.send(engine, request_id)
        self._sent.append((payload, request_id))
        return payload

    def receive(self, engine, payload) -> None:
        i = next((i for i, (p, _) in enumerate(self._sent) if p is payload), None)
        rid = self._sent.pop(i)[1] if i is not None else "not one sent"
        with crash_fails(f"{self.who}: receive(decode engine, the payload of request {rid!r})", DOCUMENTED):
            self.transfer.receive(engine, payload)


#: Pinned requests: lengths 11 and 2 one short of a multiple of 3 (2 shorter than one block of 3
#: and a multiple of 2), 6 a multiple of 3, 7 one past; one sampled; all arrive at once, so that
#: four are in flight together.
FOUR_AT_ONCE = (Req(tuple(range(2, 13)), 4, 0, 0.0, 1), Req((7, 8), 3, 0, 1.0, 2),
                Req((9, 10, 11, 12, 13, 14), 3, 0, 0.0, 3), Req(tuple(range(20, 27)), 2, 0, 0.0, 4))
#: Staggered arrivals, one request of a single token (it ends in the prefill engine), lengths 5, 8 and 16.
STAGGERED = (Req((7, 8, 9, 10, 11), 3, 0, 1.0, 5), Req((4, 4), 1, 1, 0.0, 6), Req(tuple(range(20, 28)), 4, 2, 0.0, 7),
             Req(tuple(range(1, 17)), 2, 3, 0.0, 8))

EXAMPLES = (
    dict(reqs=FOUR_AT_ONCE, bs_send=3, bs_receive=2, slack=3, seed=13, pool_seed=1, budget=None,
         receive_order="reversed"),
    dict(reqs=STAGGERED, bs_send=2, bs_receive=5, slack=2, seed=14, pool_seed=2, budget=3, receive_order="sent"),
    dict(reqs=STAGGERED, bs_send=4, bs_receive=4, slack=0, seed=15, pool_seed=None, budget=None,
         receive_order="sent"),
)

# ---------------------------------------------------------------------------- the bad calls
def invalid_calls(device) -> list[InvalidCall]:
    """The kv_transfer contract's bad calls, each on fresh engines of the test model (blocks of 2):
    a sending engine holding request "a" ready (prompt of 3) and request "w" still waiting; a
    receiving engine (blocks of 3) that already holds a request "a", or whose model has another
    number of layers. A rejected call must leave the engine it was made on as it was."""
    made: dict = {}

    def sender():
        model = model_for(0, device)
        e = PagedEngine(model, num_blocks=8, block_size=2)
        e.add_request("a", [1, 2, 3], 3)
        e.step()
        e.add_request("w", [4, 5], 2)
        return e

    def receiver(layers=CFG.n_layers, holds_a=False):
        if layers == CFG.n_layers:
            model = model_for(0, device)
        else:
            model = init_weights(Transformer(dataclasses.replace(CFG, n_layers=layers)), 0).to(device=device, dtype=torch.float64).eval()
        e = PagedEngine(model, num_blocks=8, block_size=3)
        if holds_a:
            e.add_request("a", [1, 2], 2)
        return e

    def on_send(request_id, engine=None):
        def args(impl):
            made["engine"] = sender()
            return (made["engine"] if engine is None else engine, request_id)
        return args

    def on_receive(engine_maker):
        def args(impl):
            payload = impl.send(sender(), "a")
            made["engine"] = engine_maker()
            return (made["engine"], payload)
        return args

    def state(impl):
        e = made["engine"]
        if not hasattr(e, "book"):
            return torch.zeros(1)
        return (torch.tensor([e.book.allocator.num_free, len(e.running), len(e.waiting)]),
                *(c.nan_to_num(7.0) for c in e.k + e.v))

    calls = [  # (what, function, args, raises, argument)
        ("send-engine-not-an-engine", "send", on_send("a", engine={"k": []}), TypeError, "engine"),
        ("send-unknown-request", "send", on_send("zz"), ValueError, "request_id"),
        ("send-request-not-ready", "send", on_send("w"), ValueError, "request_id"),
        ("receive-engine-not-an-engine", "receive", on_receive(lambda: object()), TypeError, "engine"),
        ("receive-other-model-shape", "receive", on_receive(lambda: receiver(layers=1)), ValueError, "engine"),
        ("receive-request-id-held", "receive", on_receive(lambda: receiver(holds_a=True)), ValueError, "request id"),
    ]
    out = [InvalidCall(what, args, raises=(exc,), argument=argument, function=fn, state=state)
           for what, fn, args, exc, argument in calls]

    def not_a_payload(impl):
        made["engine"] = receiver()
        return (made["engine"], None)

    out.append(InvalidCall("receive-not-a-payload", not_a_payload, raises=(TypeError,), argument="payload",
                           function="receive", state=state))
    return out
