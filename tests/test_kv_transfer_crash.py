"""PA-9's law on a transfer that crashes: an exception the ``kv_transfer`` contract does not document
(an IndexError in ``receive``, a KeyError in ``send``) fails the law in the suite's compact format
(case, the call that crashed with its request id and the exception, the implementation), never as
a raw traceback; a refusal (NotImplementedError) stays "unsupported" and the contract's own
TypeError / ValueError pass through as they are. A known-bad transfer that crashes is not a kill,
and a crash stays a crash for expectations: a `fail` entry without a signature (a failed check)
never admits it, one naming its exception does."""
from __future__ import annotations

import re

import pytest

from inference_conformance.conformance import registry
from inference_conformance.conformance.expectations import Entry
from inference_conformance.conformance.failures import ImplementationCrash, LawFailure, failure_kind
from inference_conformance.conformance.outcomes import Unsupported
from inference_conformance.conformance.results import Recorder, recording
from inference_conformance.conformance.zoo import NotRejected, expect_rejected
from inference_conformance.properties.kv_transfer.laws import PA9
from inference_conformance.reference.kv_transfer import ReferenceTransfer


class IndexOnReceive(ReferenceTransfer):
    """Reads one block id past the payload's last when it receives."""

    def receive(self, engine, payload):
        payload.block_ids[len(payload.block_ids)]


class KeyOnSend(ReferenceTransfer):
    """Looks the request up in a table it never filled when it sends."""

    def send(self, engine, request_id):
        return {}[request_id]


class Raises(ReferenceTransfer):
    """Its ``receive`` raises ``error`` (a refusal, or the contract's own TypeError)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def receive(self, engine, payload):
        raise self.error


INDEX_ON_RECEIVE, KEY_ON_SEND = IndexOnReceive(), KeyOnSend()
REFUSES, TYPE_ERROR = Raises(NotImplementedError("no blocks of 5")), Raises(TypeError("payload must be a KVTransfer"))


#: PA-9 on its first pinned example alone (four requests in flight, received in reverse order).
ONE = PA9.with_examples(PA9.examples[:1])


def _load(attr: str, origin: str = "outside"):
    return registry.load("kv_transfer", attr.lower(), f"{__name__}:{attr}", origin)


def _law(impl):
    with recording(Recorder()):
        return ONE(impl, "cpu")


@pytest.mark.parametrize("attr, call, exc", [
    ("INDEX_ON_RECEIVE", r"receive\(decode engine, the payload of request \d+\)", "IndexError: list index out of range"),
    ("KEY_ON_SEND", r"send\(prefill engine, request \d+\)", "KeyError: "),
])
def test_a_crash_in_send_or_receive_fails_the_law_naming_the_call(attr, call, exc):
    with pytest.raises(LawFailure) as info:
        _law(_load(attr))
    lines = str(info.value).splitlines()
    assert lines[0].startswith("case: reqs=") and lines[-1] == f"implementation: {attr.lower()}", lines
    crash = next(line for line in lines if "crashed" in line)
    assert re.fullmatch(rf"{attr.lower()}: {call} crashed: {exc}.*", crash), crash
    assert "Traceback" not in str(info.value)
    kind = failure_kind(info.value)
    name = exc.split(":")[0]
    assert kind["exception"] == name and name in kind["mro"], kind
    assert Entry(key="*", expected="fail").admits(kind) == f"raised {name}, expected AssertionError"
    assert Entry(key="*", expected="fail", exception=name).admits(kind) == ""
    # inside a group of failures (Hypothesis' several distinct ones) the crash is still the kind
    group = ExceptionGroup("two failures", [AssertionError("attention output: wrong"), info.value])
    assert failure_kind(group)["exception"] == name


def test_a_failed_check_is_admitted_by_an_unsigned_entry():
    kind = failure_kind(LawFailure("reqs=1", "decode output: measured error 1.0e+00 EXCEEDS bound 1.0e-06 (rule float32)",
                                   "t"))
    assert kind["exception"] == "AssertionError" and Entry(key="*", expected="fail").admits(kind) == ""


def test_a_refusal_and_the_contracts_own_errors_are_not_crashes():
    with pytest.raises(Unsupported, match="no blocks of 5"):
        _law(_load("REFUSES"))
    with pytest.raises(TypeError, match="payload must be a KVTransfer") as info:
        _law(_load("TYPE_ERROR"))
    assert not isinstance(info.value, ImplementationCrash)


def test_a_known_bad_transfer_that_crashes_is_not_a_kill():
    with pytest.raises(NotRejected, match=r"crashed law .*IndexError"):
        with recording(Recorder()):
            expect_rejected(ONE, _load("INDEX_ON_RECEIVE", "zoo"), "cpu")
