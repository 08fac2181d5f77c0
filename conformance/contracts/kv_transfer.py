"""The ``kv_transfer`` contract: moving a request and its KV cache from a prefill engine to a decode
engine (prefill/decode disaggregation; lecture 001 §4.5; Splitwise, DistServe, vLLM's and
Mooncake's KV connectors).

An implementation is one object (a class instance or a module) with two callables:

    send(engine, request_id) -> payload
    receive(engine, payload) -> None

They come as a pair because only the implementation reads its own payload: what ``send`` packs
(a Python object of the implementation's choosing, opaque to the suite) only its own ``receive``
unpacks. The suite calls ``send`` on the prefill engine for a request that is ready (its prompt
computed and its first token sampled), then ``receive`` on the decode engine with that payload,
and steps the decode engine on.

``engine`` is the suite's paged engine; a transfer may use this surface of it and nothing else:

- ``engine.block_size`` (int): tokens per block of this engine (the two engines' may differ).
- ``engine.k``, ``engine.v``: the cache, one tensor per layer (L of them), each
  (num_blocks, block_size, Hkv, D) in the model's dtype on its device; token p of a request is in
  block ``ids[p // block_size]``, slot ``p % block_size``, ``ids`` the request's block ids.
- ``engine.request_state(request_id) -> state``: a ready request's tokens and sampling state (a
  copy; its field ``length`` is the number of tokens whose K/V the engine computed, its field
  ``request_id`` the id); ValueError naming request_id for an unknown request or one not ready.
- ``engine.block_ids(request_id) -> list[int]``: the sender's block ids of that request, in
  logical order (its block table; blocks past ceil(length / block_size) may be listed).
- ``engine.release(request_id)``: take the request out of the sending engine and free its blocks
  (after the K/V have been read: the engine may overwrite them from then on).
- ``engine.admit(state) -> list[int]``: on the receiving engine (``state``: the object the
  sender's ``request_state`` returned, carried in the payload as it is: it holds the request's
  tokens and its sampling generator), book blocks of its own size for
  ``state.length`` tokens and start running the request from its last sampled token; returns the
  receiver's block ids for those tokens, in logical order, which the transfer fills through
  ``engine.k`` and ``engine.v`` before returning. ValueError naming the request id when it is
  already used in that engine (a payload received twice, or from another request of that id);
  ``OutOfBlocks`` (a RuntimeError) when its blocks do not fit, nothing booked.

The pools hand blocks out in any order, so the sender's ids follow no pattern and the receiver's
ids are its own, unrelated to the sender's; several requests may be sent before the first is
received, and they may be received in another order than sent.

The rule (claim PA-9): after ``receive`` the decode engine continues the request exactly as one
engine would: every later token's logits within the float64 tolerance of one engine's (the
engines run the float64 model) and its sampled tokens equal, whatever the two block sizes, the
request lengths (a multiple of either block size or not, shorter than one block) and the order
in which the pools hand out their blocks.

Errors, before anything is sent or booked: ``send`` raises TypeError naming ``engine`` for an
object without this surface (:func:`validate`, :func:`check_engine`), ValueError naming ``request_id`` for an
unknown request or one not ready (``engine.request_state`` raises it); ``receive`` raises
TypeError naming ``engine`` likewise, TypeError naming ``payload`` for an object that is not one
of its payloads, ValueError naming ``engine`` when the payload's K/V do not fit the engine's
model (another number of layers, Hkv or D: :func:`check_fits`), and ValueError naming the request
id for a payload whose request id the engine already holds (``engine.admit`` raises it). An
implementation may raise ``NotImplementedError`` for a setting it does not support (block sizes
it cannot map, say): the suite reports "unsupported", never a pass.

Oracle: one paged engine over the same float64 model running the same requests (no transfer).
Claims checked against this contract: PA-9. Sources: Patel et al. 2024 (Splitwise), Zhong et al.
2024 (DistServe), Kwon et al. 2023 (paged blocks).
"""
from __future__ import annotations

from inference_conformance.conformance.coverage import CoverageClass
from inference_conformance.conformance.registry_declarations import Contract

#: The engine surface a transfer may use (see the module's docstring).
ENGINE_SURFACE = ("block_size", "k", "v", "request_state", "block_ids", "release", "admit")


def check_engine(engine, name: str = "engine") -> None:
    """TypeError naming ``name`` for an object without the engine surface a transfer uses
    (:data:`ENGINE_SURFACE`)."""
    missing = [a for a in ENGINE_SURFACE if not hasattr(engine, a)]
    if missing:
        raise TypeError(f"{name} must be the suite's paged engine (with {', '.join(ENGINE_SURFACE)}), got "
                        f"{type(engine).__name__} without {missing}")


def check_fits(engine, layers: int, kv_heads: int, head_dim: int) -> None:
    """ValueError naming ``engine`` when K/V of ``layers`` layers of (Hkv, D) = (``kv_heads``,
    ``head_dim``) per token do not fit its cache."""
    have = (len(engine.k), *tuple(engine.k[0].shape[2:])) if len(engine.k) else (0,)
    if have != (layers, kv_heads, head_dim):
        raise ValueError(f"engine: the payload holds K/V of {layers} layers of (Hkv, D) = ({kv_heads}, {head_dim}), "
                         f"the engine's cache has {have[0]} layers of {tuple(have[1:])}")


def validate(engine, kv_shape: tuple | None = None) -> None:
    """The contract's checks of a call's ``engine``, before anything is sent or booked:
    :func:`check_engine`, then, for ``receive``, :func:`check_fits` with ``kv_shape`` (L, Hkv, D)
    of the payload's K/V. TypeError / ValueError naming ``engine``."""
    check_engine(engine)
    if kv_shape is not None:
        check_fits(engine, *kv_shape)


CONTRACT = Contract(
    technique="kv_transfer",
    functions=("send", "receive"),
    doc=__doc__,
    returns={"receive": type(None)},
)
# The bad calls need engines over a model, a layer above this one: they are
# inference_conformance.properties.kv_transfer.cases.invalid_calls, which the bad-input law finds by the technique's name.


# ----------------------------------------------------------------------------------------------
# coverage table: observations are the law's transfer runs (properties/kv_transfer/cases.py
# TransferRun: bs_send, bs_receive, lengths (tokens sent per request), shuffled, most_in_flight,
# receive_order)
# ----------------------------------------------------------------------------------------------

#: The law that judges a transfer (PA-9's).
_PA9 = ("law_transfer_continues_as_one_engine",)


def _coverage() -> tuple:
    def lens(pred):
        return lambda c: any(pred(n, c) for n in c.lengths)

    return (
        CoverageClass("sender block size < receiver's", _PA9, lambda c: c.bs_send < c.bs_receive),
        CoverageClass("sender block size = receiver's", _PA9, lambda c: c.bs_send == c.bs_receive),
        CoverageClass("sender block size > receiver's", _PA9, lambda c: c.bs_send > c.bs_receive),
        CoverageClass("length a multiple of the sender's block size (> 1)", _PA9,
                      lens(lambda n, c: c.bs_send > 1 and n % c.bs_send == 0)),
        CoverageClass("length one past a multiple of the sender's block size", _PA9,
                      lens(lambda n, c: c.bs_send > 1 and n > c.bs_send and n % c.bs_send == 1)),
        CoverageClass("length one short of a multiple of the sender's block size", _PA9,
                      lens(lambda n, c: c.bs_send > 2 and n > c.bs_send and n % c.bs_send == c.bs_send - 1)),
        CoverageClass("length a multiple of the receiver's block size (> 1), not of the sender's", _PA9,
                      lens(lambda n, c: c.bs_receive > 1 and n % c.bs_receive == 0 and n % c.bs_send)),
        CoverageClass("length shorter than one sender block", _PA9, lens(lambda n, c: n < c.bs_send)),
        CoverageClass("both pools hand out blocks in a shuffled order", _PA9, lambda c: c.shuffled),
        CoverageClass("several requests in flight, received in another order than sent", _PA9,
                      lambda c: c.most_in_flight > 1 and c.receive_order == "reversed"),
    )


#: The kv_transfer contract's coverage table (see :class:`CoverageClass`).
COVERAGE = _coverage()
