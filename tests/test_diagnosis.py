"""Diagnosis by the zoo: a failing law names the known bug that reproduces the implementation's
output (``conformance/diagnosis.py``), in the failure, the terminal and the result row.

The implementations are the one-bug ones of ``tests/one_bug_impls.py``, written apart from the
zoo: a top-left causal mask, the caller's scale dropped for 1/sqrt(D), floor for round."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from hypothesis import strategies as st

from inference_conformance.conformance import diagnosis, expectations, registry
from inference_conformance.conformance.failures import LawFailure, ToleranceFailure
from inference_conformance.conformance.laws import Law
from inference_conformance.conformance.results import read_rows
from inference_conformance.properties.attention.cases import Case, call, check_against_reference, make_inputs
from inference_conformance.reports import expect

ROOT = Path(__file__).resolve().parents[1]
CASE = Case(B=1, Hq=2, Hkv=1, Tq=3, Tk=9, D=8, causal=True, scale=0.3)


def law_one_call(run, device, dtype, case, seed):
    """One attention call judged against the float64 reference (this test's own law)."""
    q, k, v = make_inputs(case, seed, dtype, device)
    check_against_reference(call(run.impl, q, k, v, case, run=run), q, k, v, case)


ONE_CALL = Law(claim="FA-3", technique="attention", body=law_one_call,
               given={"case": st.just(CASE), "seed": st.just(1)}, examples=(dict(case=CASE, seed=1),),
               explicit_only=True, dtypes=(torch.float64,))


def _outside(fn, name="tests:outside"):
    return registry.Implementation("attention", name, name, "outside", types.SimpleNamespace(attention=fn),
                                   ("attention",))


@pytest.mark.parametrize("target, bug", [("top_left_attention", "top_left_causal"),
                                         ("default_scale_attention", "ignores_scale")])
def test_a_failing_law_names_the_known_bug(target, bug):
    impl = registry.load_outside("attention", f"tests.one_bug_impls:{target}")
    with pytest.raises(LawFailure) as info:
        ONE_CALL(impl, "cpu", torch.float64)
    lines = str(info.value).splitlines()
    assert len(lines) == 4, lines
    assert lines[0] == "case: B=1 Hq=2 Hkv=1 Tq=3 Tk=9 D=8 causal=True scale=0.3 seed=1 dtype=float64", lines
    assert lines[1].startswith(f"diagnosis: same output as known bug {bug}: "), lines
    assert "EXCEEDS bound" in lines[2] and "(rule float64)" in lines[2] and "worst element" in lines[2], lines
    assert lines[3] == f"implementation: tests.one_bug_impls:{target}", lines
    assert isinstance(info.value, AssertionError)


def test_an_output_no_known_bug_gives_says_so():
    wrong = _outside(lambda q, k, v, *, causal, scale: 1.5 * registry.load_outside(
        "attention", "tests.one_bug_impls:default_scale_attention")(q, k, v, causal=causal, scale=scale))
    with pytest.raises(LawFailure, match="\ndiagnosis: no known bug reproduces this output\n"):
        ONE_CALL(wrong, "cpu", torch.float64)


def test_a_zoo_entry_that_raises_is_skipped(monkeypatch):
    def raises(q, k, v, *, causal, scale):
        raise RuntimeError("a zoo entry that crashes on this case")

    zoo = registry.zoo
    monkeypatch.setattr(registry, "zoo", lambda technique: [_outside(raises, "raises")] + zoo(technique))
    impl = registry.load_outside("attention", "tests.one_bug_impls:top_left_attention")
    with pytest.raises(LawFailure, match="diagnosis: same output as known bug top_left_causal"):
        ONE_CALL(impl, "cpu", torch.float64)


def test_the_replays_stop_at_the_time_allowed(monkeypatch):
    monkeypatch.setattr(diagnosis, "SECONDS", 0.0)
    impl = registry.load_outside("attention", "tests.one_bug_impls:top_left_attention")
    with pytest.raises(LawFailure) as info:
        ONE_CALL(impl, "cpu", torch.float64)
    n = len(registry.zoo("attention"))
    assert re.search(rf"no known bug reproduces this output \([01] of {n} known bugs replayed in the 0 s allowed\)",
                     str(info.value)), str(info.value)


def test_a_zoo_entry_keeps_the_laws_own_failure():
    """A zoo test's rejection is the law's own check (its text is the kill-rate table's)."""
    bad = next(b for b in registry.zoo("attention") if b.name == "top_left_causal")
    with pytest.raises(ToleranceFailure, match="EXCEEDS bound"):
        ONE_CALL(bad, "cpu", torch.float64)


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.update(CI="true", PYTHONPATH=str(ROOT), INFERENCE_CONFORMANCE_DIR=str(tmp_path / "storage"))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--device", "cpu", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("technique, target, law, bug", [
    ("attention", "top_left_attention", "properties/attention/laws.py::test_fa3_matches_float64_reference", "top_left_causal"),
    ("quantization", "floor_quantization", "properties/quantization/laws/integer.py::test_qt1_within_half_step", "floor_not_round"),
])
def test_an_outside_implementation_is_diagnosed_by_name(tmp_path, technique, target, law, bug):
    """pytest --impl, as a user runs it: the terminal's line for the law and the result rows name
    the known bug (the single-bug kernel that drops the scale: test_a_failing_law_names_the_known_bug)."""
    r = _pytest(tmp_path, law, "-k", "not float32 and not float16 and not bfloat16",  # float64 (the name holds it)
                "--impl", f"{technique}=tests.one_bug_impls:{target}",
                "--results", str(tmp_path / "rows"))
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    assert re.search(rf"^{law.split('::')[1]}: 1 failed \(.*\); known bug: {bug}$", _section(out), re.M), out[-3000:]
    said = f"diagnosis: same output as known bug {bug}"
    assert said in (tmp_path / "rows" / "failures.txt").read_text(encoding="utf-8")
    rows = read_rows(tmp_path / "rows")
    failed = [row for row in rows if row.verdict == "fail"]
    assert failed and all(said in row.message for row in failed), [row.message for row in failed]
    # the expectation file written from the run carries the case and the diagnosis
    (written,) = expect.update(rows, tmp_path / "expected.toml")
    entries = expectations.parse(written.read_text(encoding="utf-8")).entries.values()
    assert entries and all("case: " in e.measured and said in e.measured for e in entries), list(entries)


def _section(out: str) -> str:
    """The terminal's "conformance failures" section (its lines without the claim in front)."""
    part = out.split(" conformance failures: ", 1)[1].split("\n", 1)[1]
    return "\n".join(line.split(" ", 1)[1] for line in part.splitlines() if re.match(r"[A-Z]{2}-\d+ ", line))


def test_a_kernel_with_three_known_bugs_fails_in_a_screen_naming_each(tmp_path):
    """A top-left causal mask, the scale dropped for 1/sqrt(D) and the sinks ignored, at once
    (``tests.one_bug_impls:three_bug_attention``): no single known bug reproduces its output, the
    diagnosis names each on the example with one feature left; the run prints in at most 40 lines
    of at most 100 columns, one per failing law (many tests of one law: test_compact_failures.py),
    and the full failures go to the results folder."""
    impl = "tests.one_bug_impls:three_bug_attention"
    r = _pytest(tmp_path, f"properties/attention/laws.py::test_fa3_matches_float64_reference[{impl}-float64]",
                f"properties/attention/laws.py::test_fa8_options_match_float64_reference[{impl}-float64]",
                "--impl", f"attention={impl}", "--results", str(tmp_path / "rows"))
    out = r.stdout + r.stderr
    detail = (tmp_path / "rows" / "failures.txt").read_text(encoding="utf-8")
    assert r.returncode == 1, out[-3000:]
    lines = out.rstrip("\n").splitlines()
    assert len(lines) <= 40 and max(map(len, lines)) <= 100, out
    section = _section(out).splitlines()
    assert len(section) == 2 and section[0].startswith("test_fa3_matches_float64_reference: ") \
        and section[1].startswith("test_fa8_options_match"), out           # a long line cuts the law's name
    named = {b for line in section for b in line.split("known bug")[1].split(":", 1)[1].replace(",", " ").split()}
    assert {"top_left_causal", "ignores_scale", "sinks_dropped_in_merge"} <= named, out
    assert "2 failed" in lines[-1] and "Traceback" not in out and detail.count("diagnosis: ") == 2, out + detail
