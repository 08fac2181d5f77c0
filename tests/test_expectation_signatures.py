"""An expected failure names its failure (``--expect``): the exception type, the failing check,
its tolerance rule and a band of the measured error. Under the entry ``expect update`` writes for
one bug, the same bug is an expected failure, while another failure of the same test (a second
bug of the same law, a failure of another check, a crash) is a new failure, a refusal of the
listed input is a stale expectation (strict) and the fix an unexpected pass. The runs are
subprocesses (as a kernel project runs the suite) on one tiny law."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from inference_conformance.conformance import expectations
from inference_conformance.conformance.failures import LawFailure, ToleranceFailure, failure_kind
from inference_conformance.conformance.results import read_rows
from inference_conformance.conformance.tolerance import check_close
from inference_conformance.reports import expect

ROOT = Path(__file__).resolve().parent.parent
TARGET = "nan_attention:attention"
KEY = f"test_nan_rows[{TARGET}-float32]"

LAW = '''
import pytest
import torch

from inference_conformance.conformance.outcomes import refusal_is_unsupported
from inference_conformance.conformance.tolerance import assert_close, assert_exact


@pytest.mark.technique("attention")
@pytest.mark.parametrize("dtype", [torch.float32], ids=["float32"])
def test_nan_rows(impl, dtype):
    q = torch.randn(1, 1, 4, 8, generator=torch.Generator().manual_seed(0)).to(dtype)
    v = q.clone()
    q[0, 0, 1, 3] = float("nan")                    # query and key 1: rows 1..3 see it
    with refusal_is_unsupported("the implementation"):
        out = impl(q, q, v, causal=True, scale=0.5)
    want = torch.zeros(out.shape, dtype=torch.bool)
    want[0, 0, 1:, :] = True
    assert_exact(torch.isnan(out), want, what="the NaN elements of the output")
    assert_close(out[0, 0, :1], v[0, 0, :1], what="the rows that do not see the NaN")
'''

IMPL = '''
import os
import torch

def attention(q, k, v, *, causal, scale):
    mode = os.environ["NAN_MODE"]
    if mode == "refuse":
        raise NotImplementedError("no NaN inputs")
    if mode == "crash":
        raise RuntimeError("kernel launch failed")
    s = q.double() @ k.double().transpose(-1, -2) * scale
    s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.softmax(s, -1) @ v.double()
    if mode == "nan_row_zero":                      # the listed bug: the NaN query's own row comes out 0
        out[..., 1, :] = 0.0
    elif mode == "every_row_zeroed":                # another bug of the same law: every NaN row 0
        out = torch.nan_to_num(out, nan=0.0)
    elif mode == "offset":                          # another check fails: rows without the NaN move
        out[..., 0, :] += 0.5
    return out.to(q.dtype)
'''


def _run(tmp_path: Path, mode: str, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "nan_attention.py").write_text(IMPL)
    laws = tmp_path / "laws"
    laws.mkdir(exist_ok=True)
    (laws / "test_nan_law.py").write_text(LAW)
    installed = any(ep.value == "inference_conformance.conformance.plugin" for ep in entry_points(group="pytest11"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.update(CI="true", NAN_MODE=mode, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]),
               INFERENCE_CONFORMANCE_DIR=str(tmp_path / "storage"))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfExXs", "--device", "cpu",
                           "-W", "ignore::pytest.PytestWarning",
                           *([] if installed else ["-p", "inference_conformance.conformance.plugin"]),
                           str(laws), "--impl", f"attention={TARGET}", *args],
                          cwd=laws, env=env, capture_output=True, text=True, timeout=600)


def _verdict(folder: Path) -> tuple[str, str]:
    (row,) = [r for r in read_rows(folder) if expect.test_id(r.check) == KEY]
    return row.verdict, row.message


def test_only_the_listed_failure_is_expected(tmp_path):
    r = _run(tmp_path, "nan_row_zero", "--results", str(tmp_path / "run1"))
    assert r.returncode == 1, r.stdout[-3000:]
    out = tmp_path / "exp"
    expect.update(read_rows(tmp_path / "run1"), out)
    (exp,) = expectations.load([out])
    entry = exp.entries[KEY]
    assert (entry.exception, entry.check, entry.rule, entry.error) == \
        ("AssertionError", "the NaN elements of the output", "exact", (4.0, 16.0)), (out / "nan_attention_attention.toml").read_text()

    def run(mode, *args):
        folder = tmp_path / f"run-{mode}-{len(args)}"
        return _run(tmp_path, mode, "--expect", str(out), "--results", str(folder), *args), folder

    # the listed bug: an expected failure, green
    r, folder = run("nan_row_zero")
    assert r.returncode == 0 and "1 xfailed" in r.stdout, r.stdout[-3000:]
    assert _verdict(folder)[0] == "expected fail"
    # another bug of the same law and check (every NaN row zeroed: 24 elements, not 8), a failure
    # of another check, a crash: each a new failure, red, saying how it differs
    for mode, words in (("every_row_zeroed", "measured error 24 outside the band [4, 16]"),
                        ("offset", "failed check 'the rows that do not see the NaN'"),
                        ("crash", "raised RuntimeError, expected AssertionError")):
        r, folder = run(mode)
        assert r.returncode == 1 and "1 failed" in r.stdout and words in r.stdout, (mode, r.stdout[-3000:])
        verdict, message = _verdict(folder)
        assert verdict == "fail" and message.startswith("new failure, not the expected one") and words in message
    # the implementation now refuses the input it failed: a stale expectation, strict by default
    r, folder = run("refuse")
    assert r.returncode == 1 and "STALE(strict)" in r.stdout, r.stdout[-3000:]
    assert _verdict(folder)[0] == "stale expectation"
    r, folder = run("refuse", "--allow-unexpected-pass")
    assert r.returncode == 0, r.stdout[-3000:]
    verdict, message = _verdict(folder)
    assert verdict == "stale expectation" and "now unsupported" in message
    # refreshing from that run lists the refusal as what it is
    expect.update(read_rows(folder), out)
    assert expectations.load([out])[0].entries[KEY].expected == "unsupported"


def test_a_skip_before_the_test_ran_is_not_stale():
    """A listed failure of an implementation whose package is missing here is skipped at setup
    (its skip marker): "skip", never a stale expectation, so a run without the package is green."""
    from inference_conformance.conformance import verdicts

    class Report:
        skipped, passed, failed, when = True, False, False, "setup"
        longrepr = ("x.py", 1, "Skipped: needs vllm")

    class Call:
        excinfo = None

    entry = expectations.Entry(key="t", expected="fail", reason="r", exception="AssertionError")
    report = Report()
    assert verdicts.outcome(report, Call(), entry, "", False) == ("skip", "Skipped: needs vllm")
    assert report.skipped


def test_failure_kind_reads_the_failing_comparison():
    v = check_close(__import__("torch").ones(3), __import__("torch").zeros(3), what="attention output (Case(B=1, D=8))")
    assert failure_kind(ToleranceFailure(v.message(), v)) == {
        "exception": "AssertionError", "check": "attention output", "rule": v.rule.split(":")[0], "error": v.error}
    law = LawFailure("B=1", "attention output: measured error inf EXCEEDS bound 1.000e-03 (rule float16); worst", "x:y")
    assert failure_kind(law) == {"exception": "AssertionError", "check": "attention output", "rule": "float16",
                                 "error": math.inf}
    assert failure_kind(AssertionError("max abs error 0.52 > 0.05\nassert 0.52 < 0.05")) == \
        {"exception": "AssertionError", "check": "max abs error N > N", "error": 0.52}
    assert failure_kind(AssertionError("3 certain case(s) wrong: row 0 of float32"))["check"] == "N certain case(s) wrong"
    crash = failure_kind(MemoryError("out of memory"))
    assert crash["exception"] == "MemoryError" and "Exception" in crash["mro"]


def test_admits_names_the_first_difference():
    e = expectations.Entry(key="t", expected="fail", reason="r", exception="AssertionError", check="out",
                           rule="float16", error=(0.1, 0.4))
    kind = {"exception": "AssertionError", "check": "out", "rule": "float16", "error": 0.2}
    assert e.admits(kind) == ""
    assert "outside the band" in e.admits(dict(kind, error=0.5))
    assert "expected rule float16" in e.admits(dict(kind, rule="bfloat16"))
    assert "failed check 'other'" in e.admits(dict(kind, check="other"))
    assert "raised RuntimeError" in e.admits({"exception": "RuntimeError", "mro": ["RuntimeError", "Exception"]})
    unsigned = expectations.Entry(key="t", expected="fail", reason="r")
    assert unsigned.admits(kind) == "" and "raised RuntimeError" in unsigned.admits({"exception": "RuntimeError"})
    crash_listed = expectations.Entry(key="t", expected="fail", reason="r", exception="RuntimeError")
    assert crash_listed.admits({"exception": "OutOfMemoryError", "mro": ["OutOfMemoryError", "RuntimeError"]}) == ""


SIGNED = '''[implementation]
name = "x"
[tests."test_law[x-float16]"]
expected = "fail"
reason = "r"
exception = "AssertionError"
check = "attention output"
rule = "float16"
error = [0.001, inf]
'''


def test_a_signature_reads_back_and_a_damaged_one_names_its_field():
    exp = expectations.parse(SIGNED, "s.toml")
    e = exp.entries["test_law[x-float16]"]
    assert e.signed and e.error == (0.001, math.inf) and e.check == "attention output"
    again = expectations.parse(expectations.dumps(exp), "again.toml").entries[e.key]
    assert (again.exception, again.check, again.rule, again.error) == (e.exception, e.check, e.rule, e.error)
    for bad, words in ((SIGNED.replace("[0.001, inf]", "[1, 0.5]"), "'error' must be a band"),
                       (SIGNED.replace("[0.001, inf]", "0.3"), "'error' must be a band"),
                       (SIGNED.replace("[0.001, inf]", '["a", 1]'), "'error' must be a band"),
                       (SIGNED.replace('"AssertionError"', '"not a type"'), "'exception' must be"),
                       (SIGNED.replace('"fail"', '"unsupported"'), "only an entry with expected = \"fail\"")):
        with pytest.raises(ValueError) as err:
            expectations.parse(bad, "s.toml")
        assert str(err.value).startswith("s.toml: entry 'test_law[x-float16]'") and words in str(err.value), str(err.value)


def test_the_suites_own_failures_are_signed():
    """Every "fail" entry of expectations/ names its failure (no whole-law excuse) and no key
    is a bare law name or a wildcard over a fail entry's dtypes; an intermittent one (a race,
    which may hit any request of a call) may leave out the check, never the rule and band."""
    for exp in expectations.load([expectations.BUILTIN]):
        for key, e in exp.entries.items():
            if e.expected != "fail":
                continue
            assert e.signed and e.exception and (e.check or (e.intermittent and e.rule and e.error)), \
                f"{exp.source}: {key}: no signature"
            assert "[" in key and "*" not in key and "?" not in key, f"{exp.source}: {key}: covers more than one test"


def test_update_says_which_entries_it_changed(tmp_path, capsys):
    """A ratchet loosened shows in review: ``expect update`` turning a new failure into an
    expectation (or rewriting, re-listing or dropping an entry) prints one line per entry."""
    from inference_conformance.conformance.results import Row, write_rows

    def row(test, verdict, failure=None):
        return Row(claim="FA-3", check=f"properties/x.py::{test}[{TARGET}-float32]", technique="attention",
                   implementation=TARGET, dtype="float32", verdict=verdict, message="m", failure=failure or {})

    out = tmp_path / "exp.toml"
    out.write_text(SIGNED.replace('name = "x"', f'name = "{TARGET}"').replace("test_law[x-float16]", f"test_a[{TARGET}-float32]")
                   + f'[tests."test_b[{TARGET}-float32]"]\nexpected = "unsupported"\nreason = "r"\n'
                   + f'[tests."test_c[{TARGET}-float32]"]\nexpected = "unsupported"\nreason = "r"\n', encoding="utf-8")
    crash = {"exception": "IndexError", "check": "list index out of range"}
    write_rows([row("test_a", "fail", crash), row("test_b", "fail", {"exception": "AssertionError", "check": "out"}),
                row("test_c", "unsupported"), row("test_d", "fail", {"exception": "AssertionError", "check": "out",
                                                                     "rule": "float32", "error": 0.5}),
                row("test_e", "pass")], tmp_path / "run" / "rows-main-1.jsonl")
    assert expect.main(["update", str(tmp_path / "run"), "--out", str(out)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("changed: ")]
    assert lines == [
        f"changed: exp.toml: test_a[{TARGET}-float32]: a new failure now expected: IndexError of 'list index out of "
        "range', was AssertionError of 'attention output' under rule float16 with error in [0.001, inf]",
        f"changed: exp.toml: test_b[{TARGET}-float32]: expected 'fail', was 'unsupported' (AssertionError of 'out')",
        f"changed: exp.toml: test_d[{TARGET}-float32]: a new failure now expected: AssertionError of 'out' under rule "
        "float32 with error in [0.25, 1] (it was not listed)"], lines      # test_c unchanged, test_e never listed
    write_rows([row("test_a", "pass")], tmp_path / "run2" / "rows-main-1.jsonl")
    assert expect.main(["update", str(tmp_path / "run2"), "--out", str(out)]) == 0
    assert f"changed: exp.toml: test_a[{TARGET}-float32]: dropped: its tests ran without failing" in capsys.readouterr().out


def test_a_band_from_zero_to_inf_on_every_test_is_warned():
    lax = SIGNED.replace("test_law[x-float16]", "*").replace("[0.001, inf]", "[0, inf]")
    with pytest.warns(expectations.ExpectationWarning, match=r"s.toml: entry '\*': the error band \[0, inf\] on '\*'"):
        assert expectations.parse(lax, "s.toml").entries["*"].error == (0.0, math.inf)    # accepted, and said
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        expectations.parse(SIGNED.replace("test_law[x-float16]", "*"), "s.toml")        # a band that means something
        expectations.parse(SIGNED.replace("[0.001, inf]", "[0, inf]"), "s.toml")        # one test named
