"""Compact failures: a failing law prints its case by its fields, the failing comparison, the
implementation and the diagnosis, and nothing of the suite's own objects
(``conformance/failures.py``); a run of an outside attention with one bug over the attention laws
prints fewer than :data:`LINE_BOUND` lines."""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis.vendor.pretty import pretty

from inference_conformance.conformance import registry
from inference_conformance.conformance.coverage import CoverageClass
from inference_conformance.conformance.failures import LawFailure, PlainFailure, ToleranceFailure, case_line
from inference_conformance.conformance.laws import Run
from inference_conformance.conformance.tolerance import assert_close

ROOT = Path(__file__).resolve().parents[1]
#: The attention laws and checks an outside attention runs (``-k attention`` keeps the generic
#: contract checks of attention only).
LAW_FILES = ("properties/attention/laws.py::test_fa3_matches_float64_reference",
             "properties/attention/laws.py::test_fa7_split_kv_equals_unsplit",
             "properties/attention/laws.py::test_fa3_nan_in_exactly_the_rows_that_see_it", "properties/attention/test_attention.py",
             "properties/attention/test_attention_coverage.py", "properties/test_contract_generic.py")
#: Lines printed by the run of test_a_wrong_attention_over_the_attention_laws_is_short, and their
#: widest: measured 108 lines for 20 failing tests when each failing test printed its compact
#: failure (~150 lines each before that: the falsifying example with the whole Run), 29 lines of
#: at most 100 columns since the terminal shows one line per failing law (the failures in full:
#: -v, or --results' failures.txt).
LINE_BOUND, COLUMNS = 40, 100


@dataclasses.dataclass(frozen=True)
class _Drawn:
    B: int
    causal: bool
    magnitude: str = "normal"


def test_reprs_are_short_also_in_hypothesis_printer():
    """Hypothesis prints dataclasses field by field unless they give their own printer."""
    table = tuple(CoverageClass(f"class {i}", ("law",), lambda o: True) for i in range(60))
    impl = registry.Implementation("attention", "mine", "my:attention", "outside", object(), ("attention",))
    run = Run("law_x", "mine", impl, coverage=table)
    assert pretty(table[0]) == repr(table[0]) == "CoverageClass('class 0')"
    assert pretty(impl) == repr(impl) == "Implementation('attention', 'mine')"
    assert pretty(run) == repr(run) == "Run('law_x', 'mine')"


def test_the_case_line_gives_fields_not_objects():
    line = case_line({"case": _Drawn(B=2, causal=True), "seed": 7, "x": torch.zeros(2, 3)},
                     {"dtype": torch.float16})
    assert line == "B=2 causal=True seed=7 x=Tensor(2, 3):float32 dtype=float16"
    assert case_line({}) == "(no drawn arguments)"


def test_failures_are_assertion_errors_printed_as_their_message():
    failure = LawFailure("B=1", "output: measured error 1 EXCEEDS bound 0 (rule exact)", "mine", "none")
    assert isinstance(failure, AssertionError) and isinstance(failure, PlainFailure)
    assert str(failure).splitlines() == ["case: B=1", "diagnosis: none", "output: measured error 1 EXCEEDS bound 0 (rule exact)",
                                         "implementation: mine"]
    assert not failure.pytrace                   # pytest prints the message alone (--full-trace: the frames)
    failure.add_note("Falsifying example: test(x=1)")
    assert failure.pytrace                       # a note is printed with the traceback only
    with pytest.raises(ToleranceFailure, match="EXCEEDS") as info:
        assert_close(torch.ones(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64))
    assert info.value.verdict.error == 1.0 and isinstance(info.value, AssertionError)


def test_a_wrong_attention_over_the_attention_laws_is_short(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.update(CI="true", PYTHONPATH=str(ROOT), INFERENCE_CONFORMANCE_DIR=str(tmp_path / "storage"))
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--device", "cpu",
                        *LAW_FILES, "-k", "attention", "--impl", "attention=tests.one_bug_impls:top_left_attention"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = r.stdout + r.stderr
    lines = out.splitlines()
    failed = int(re.search(r"(\d+) failed", lines[-1])[1])
    laws = out.split(" conformance failures: ")[-1].splitlines()[1:-1]      # one line per failing law
    assert r.returncode == 1 and failed >= 20 and 2 <= len(laws) < failed, out[-3000:]
    assert len(lines) <= LINE_BOUND and max(map(len, lines)) <= COLUMNS, f"{len(lines)} lines for {failed} failures:\n{out}"
    assert "CoverageClass(" not in out and "Falsifying" not in out and "Run(" not in out, out[-6000:]
    assert sum(line.endswith(" known bug: top_left_causal") for line in laws) >= 2, out[-6000:]
