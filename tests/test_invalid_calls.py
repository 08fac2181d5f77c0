"""The bad-input law (``test_invalid_call_raises`` of properties/test_contract_generic.py, its
check :func:`inference_conformance.properties.generic_cases.check_invalid_call`): a documented exception type whose
message names the argument, nothing written; it passes outside code worded its own way and
rejects, saying why, every other answer."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inference_conformance.conformance import registry
from inference_conformance.conformance.registry import InvalidCall
from inference_conformance.properties.generic_cases import Refused, check_invalid_call, names

ROOT = Path(__file__).resolve().parent.parent


def _raising(exc):
    def fn(*args, **kwargs):
        raise exc
    return fn


CALL = InvalidCall("q-not-a-tensor", ([1.0],), raises=(TypeError,), argument="q")


def test_a_documented_type_naming_the_argument_passes():
    check_invalid_call(_raising(TypeError("q must be a tensor, got list")), CALL)
    check_invalid_call(_raising(TypeError("expected a tensor for Q")), CALL)       # case-insensitive


@pytest.mark.parametrize("fn, says", [
    (lambda *a, **k: None, "returned without an exception"),
    (_raising(RuntimeError("q must be a tensor")), "raised RuntimeError"),
    (_raising(ValueError("q must be a tensor")), "raised ValueError"),
    (_raising(NotImplementedError("lists")), "unsupported is not an answer"),
    (_raising(TypeError("expected a tensor, got a unique list")), "does not name the argument 'q'"),
], ids=["no-exception", "runtime-error", "undocumented-type", "not-implemented", "argument-not-named"])
def test_every_other_answer_fails_saying_which(fn, says):
    with pytest.raises(AssertionError, match=says):
        check_invalid_call(fn, CALL)


def test_a_written_out_buffer_or_a_changed_state_fails():
    out = torch.zeros(3)

    def writes(x, *, out):
        out.fill_(1.0)
        raise ValueError("x is bad")

    with pytest.raises(AssertionError, match="elements of out written"):
        check_invalid_call(writes, InvalidCall("x-bad", (1,), {"out": out}, argument="x"))
    counter = torch.zeros(1)

    class Engine:
        def step(self, x):
            counter.add_(1)
            raise ValueError("x is bad")

    call = InvalidCall("x-bad", (1,), argument="x", function="step", on=lambda impl: Engine(),
                       state=lambda e: (counter,))
    with pytest.raises(AssertionError, match="state after the rejected call"):
        check_invalid_call(None, call)


def test_a_refused_setup_is_refused_not_failed():
    def refuse(impl):
        raise NotImplementedError("no 4-bit")

    with pytest.raises(Refused, match="no 4-bit"):
        check_invalid_call(None, InvalidCall("x-bad", refuse, argument="x"))


def test_names_is_not_fooled_by_a_longer_identifier():
    assert names("q must be a tensor", "q") and names("bad q.shape", ("k", "q"))
    assert not names("unique values required", "q") and not names("seq_lens bad", "seq")


def test_every_contract_documents_invalid_calls_with_distinct_ids():
    from inference_conformance.properties.test_contract_generic import _invalid_calls

    for technique in registry.contracts():
        calls = _invalid_calls(technique, "cpu")
        assert calls, f"{technique}: Contract.invalid gives no calls"
        whats = [call.what for call in calls]
        assert len(set(whats)) == len(whats), f"{technique}: repeated ids {whats}"
        assert all(call.raises and call.argument != "" for call in calls), technique


def test_outside_verifiers_judged_by_type_and_argument_not_wording(tmp_path):
    """Through ``--impl``: a verifier saying "must be a tensor" passes every invalid call; one
    raising RuntimeError fails every one, the message saying so."""
    from inference_conformance.conformance.results import read_rows

    good, bad = "tests.outside_verifiers:tensor_wording", "tests.outside_verifiers:runtime_errors"
    env = dict(os.environ, CI="true", HYPOTHESIS_PROFILE="ci")
    env.pop("PYTEST_XDIST_WORKER", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--device", "cpu",
           "properties/test_contract_generic.py", "tests/test_speculative_errors.py", "-k", "invalid_call",
           "--impl", f"speculative={good}", "--impl", f"speculative={bad}", "--results", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    rows = [r for r in read_rows(tmp_path) if "test_invalid_call_raises" in r.check]
    expected = len(registry.invalid_calls("speculative", "cpu"))
    verdicts = {impl: sorted({r.verdict for r in rows if r.implementation == impl}) for impl in (good, bad)}
    assert verdicts == {good: ["pass"], bad: ["fail"]}, (verdicts, out[-4000:])
    assert {r.implementation for r in rows} == {good, bad}, "only the --impl verifiers are judged"
    assert all(r.check.startswith("properties/") for r in rows), "the suite's wording tests do not run on --impl"
    assert len(rows) == 2 * expected, (len(rows), expected)
    assert all("raised RuntimeError" in r.message for r in rows if r.implementation == bad)
