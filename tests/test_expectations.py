"""Expectation files (``--expect``): an outside implementation with one known failure gates a CI
run on "no new failures"; ``python -m inference_conformance.reports.expect update`` writes the file from a run's rows.
The runs are subprocesses (as a kernel project would run the suite) on two tiny laws."""
from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from inference_conformance.conformance import expectations
from inference_conformance.conformance.results import read_rows
from inference_conformance.reports import expect

ROOT = Path(__file__).resolve().parent.parent

LAWS = '''
import pytest
import torch


def _reference(q, scale):
    q = q.double()
    return torch.softmax(q @ q.transpose(-1, -2) * scale, -1) @ q


@pytest.mark.technique("attention")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_matches_reference(impl, dtype):
    q = torch.randn(1, 1, 4, 8, generator=torch.Generator().manual_seed(0)).to(dtype)
    err = (impl(q, q, q, causal=False, scale=0.5).double() - _reference(q, 0.5)).abs().max().item()
    assert err < 0.05, f"max abs error {err:.3g} > 0.05"


@pytest.mark.technique("attention")
def test_scale_is_used(impl):
    q = torch.randn(1, 1, 4, 8, generator=torch.Generator().manual_seed(1))
    err = (impl(q, q, q, causal=False, scale=2.0).double() - _reference(q, 2.0)).abs().max().item()
    assert err < 1e-4, f"scale 2.0: max abs error {err:.3g}"
'''

IMPL = '''
import torch
BF16_BUG = {bf16}
SCALE_BUG = {scale}

def attention(q, k, v, *, causal, scale):
    s = q.double() @ k.double().transpose(-1, -2) * (min(scale, 1.0) if SCALE_BUG else scale)
    out = torch.softmax(s, -1) @ v.double()
    if BF16_BUG and q.dtype == torch.bfloat16:
        out = out + 0.5
    return out.to(q.dtype)
'''
TARGET = "my_attention:attention"


def _run(tmp_path: Path, *args: str, bf16: bool = True, scale: bool = False) -> subprocess.CompletedProcess:
    (tmp_path / "my_attention.py").write_text(IMPL.format(bf16=bf16, scale=scale))
    laws = tmp_path / "laws"
    laws.mkdir(exist_ok=True)
    (laws / "test_tiny_laws.py").write_text(LAWS)
    installed = any(ep.value == "inference_conformance.conformance.plugin" for ep in entry_points(group="pytest11"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.update(CI="true", PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]),
               INFERENCE_CONFORMANCE_DIR=str(tmp_path / "storage"))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfExX", "--device", "cpu",
                           "-W", "ignore::pytest.PytestWarning", *([] if installed else ["-p", "inference_conformance.conformance.plugin"]),
                           str(laws), "--impl", f"attention={TARGET}", *args],
                          cwd=laws, env=env, capture_output=True, text=True, timeout=600)


def _verdicts(folder: Path) -> dict[str, str]:
    return {expect.test_id(r.check): r.verdict for r in read_rows(folder)}


def test_known_failure_new_failure_and_fix(tmp_path):
    # day one: the bfloat16 bug fails the run; update writes the expectation file from its rows
    r = _run(tmp_path, "--results", str(tmp_path / "run1"))
    assert r.returncode == 1, r.stdout[-3000:]
    out = tmp_path / "expectations"
    cli = subprocess.run([sys.executable, "-m", "inference_conformance.reports.expect", "update", str(tmp_path / "run1"),
                          "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    (path,) = out.glob("*.toml")
    (exp,) = expectations.load([out])
    assert exp.name == TARGET and exp.technique == "attention"
    assert list(exp.entries) == [f"test_matches_reference[{TARGET}-bfloat16]"], path.read_text()
    (entry,) = exp.entries.values()
    assert entry.expected == "fail" and "max abs error" in entry.measured and entry.reason == expect.NEW_REASON
    path.write_text(path.read_text().replace(expect.NEW_REASON, "adds 0.5 in bfloat16 (bug 12)"))
    expect.update(read_rows(tmp_path / "run1"), out)          # refreshed: the reason is kept
    assert expectations.load([out])[0].entries[entry.key].reason == "adds 0.5 in bfloat16 (bug 12)"

    # with the file: green, the row says "expected fail"
    r = _run(tmp_path, "--expect", str(out), "--results", str(tmp_path / "run2"))
    assert r.returncode == 0, r.stdout[-3000:]
    assert "1 xfailed" in r.stdout, r.stdout[-3000:]
    v = _verdicts(tmp_path / "run2")
    assert v[entry.key] == "expected fail" and v[f"test_matches_reference[{TARGET}-float32]"] == "pass"

    # a second law breaks: red, naming it
    r = _run(tmp_path, "--expect", str(path), scale=True)
    assert r.returncode == 1, r.stdout[-3000:]
    failed = [line for line in r.stdout.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 1 and "test_scale_is_used" in failed[0], r.stdout[-3000:]

    # the bug fixed: the unexpected pass fails the run (strict) ...
    r = _run(tmp_path, "--expect", str(out), "--results", str(tmp_path / "run3"), bf16=False)
    assert r.returncode == 1 and "XPASS(strict)" in r.stdout, r.stdout[-3000:]
    assert _verdicts(tmp_path / "run3")[entry.key] == "unexpected pass"
    # ... and is reported, not failed, with --allow-unexpected-pass
    r = _run(tmp_path, "--expect", str(out), "--allow-unexpected-pass", "--results", str(tmp_path / "run4"), bf16=False)
    assert r.returncode == 0 and "1 xpassed" in r.stdout, r.stdout[-3000:]
    assert _verdicts(tmp_path / "run4")[entry.key] == "unexpected pass"
    # refreshing from the fixed run drops the entry (the ratchet)
    expect.update(read_rows(tmp_path / "run4"), out)
    assert expectations.load([out])[0].entries == {}


def test_an_intermittent_failure_may_pass_and_stays_listed(tmp_path):
    """``intermittent = true`` (a race): a failure in its signature is expected, a pass is a pass
    (not an unexpected pass: the run is green), and ``expect update`` from the passing run keeps it."""
    out = tmp_path / "expectations"
    out.mkdir()
    key = f"test_matches_reference[{TARGET}-bfloat16]"
    (out / "my.toml").write_text(f"[implementation]\nname = '{TARGET}'\n[tests.\"{key}\"]\nexpected = 'fail'\n"
                                 "reason = 'a race'\nintermittent = true\nexception = 'AssertionError'\n")
    r = _run(tmp_path, "--expect", str(out), "--results", str(tmp_path / "fails"))
    assert r.returncode == 0 and "1 xfailed" in r.stdout, r.stdout[-3000:]
    assert _verdicts(tmp_path / "fails")[key] == "expected fail"
    r = _run(tmp_path, "--expect", str(out), "--results", str(tmp_path / "passes"), bf16=False)
    assert r.returncode == 0, r.stdout[-3000:]
    assert _verdicts(tmp_path / "passes")[key] == "pass"
    expect.update(read_rows(tmp_path / "passes"), out / "my.toml")
    (entry,) = expectations.load([out])[0].entries.values()
    assert entry.intermittent and entry.reason == "a race"


def test_a_damaged_expectation_file_is_a_usage_error(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[implementation]\nname = "my_attention:attention"\n[tests."test_x"]\nexpected = "flaky"\nreason = ""\n')
    r = _run(tmp_path, "--expect", str(bad))
    err = r.stdout + r.stderr
    assert r.returncode == 4 and "Traceback" not in err, err[-3000:]
    assert "bad.toml" in err and "'test_x'" in err and "'expected'" in err and "flaky" in err, err[-3000:]


GOOD = '''
[implementation]
name = "pkg:attn"
technique = "attention"

[tests."test_law[pkg:attn-bfloat16]"]
expected = "fail"
reason = "rounds once too often"
measured = "max abs error 0.3 > 0.05"
link = "https://example.org/12"

[tests."test_other"]
expected = "unsupported"
reason = "no causal"
dtype = "float16"

[tests."test_glob[*-float32]"]
expected = "partial"
reason = "refuses odd head sizes"
'''


def test_parse_and_match():
    exp = expectations.parse(GOOD, "good.toml")
    assert exp.name == "pkg:attn" and len(exp.entries) == 3
    assert exp.find("test_law[pkg:attn-bfloat16]").link == "https://example.org/12"
    assert exp.find("test_law[pkg:attn-float32]") is None
    assert exp.find("test_other[pkg:attn-float16]", "test_other", "float16").expected == "unsupported"
    assert exp.find("test_other[pkg:attn-float32]", "test_other", "float32") is None
    assert exp.find("test_glob[pkg:attn-float32]").expected == "partial"
    assert exp.find("test_law[p]") is None                  # brackets are literal, not a character class
    assert expectations.lookup([exp], "other:impl", "test_law[pkg:attn-bfloat16]") is None


def test_dumps_reads_back():
    exp = expectations.parse(GOOD, "good.toml")
    exp.entries["test_q"] = expectations.Entry(key="test_q", expected="fail", reason='a "quote"\\ and\nline\x01',
                                               measured="é ✓", intermittent=True)
    again = expectations.parse(expectations.dumps(exp, "a header\nof two lines"), "again.toml")
    assert {k: (e.expected, e.reason, e.measured, e.link, e.dtype, e.intermittent) for k, e in again.entries.items()} == \
        {k: (e.expected, e.reason, e.measured, e.link, e.dtype, e.intermittent) for k, e in exp.entries.items()}


@pytest.mark.parametrize("text, words", [
    ("name = 'x'\n[tests]\n", ["missing [implementation]"]),
    ("[implementation]\nname = 'x'\nnmae = 'y'\n", ["[implementation]", "'nmae'"]),
    ("[implementation]\ntechnique = 'attention'\n", ["'name'", "missing"]),
    ("[implementation]\nname = 'x'\n[tests.t]\nreason = 'r'\n", ["entry 't'", "'expected' is missing"]),
    ("[implementation]\nname = 'x'\n[tests.t]\nexpected = 'pass'\nreason = 'r'\n", ["entry 't'", "'pass'", "fail, unsupported, partial"]),
    ("[implementation]\nname = 'x'\n[tests.t]\nexpected = 'fail'\n", ["entry 't'", "'reason' is missing"]),
    ("[implementation]\nname = 'x'\n[tests.t]\nexpected = 'fail'\nreason = 3\n", ["entry 't'", "'reason' must be a string"]),
    ("[implementation]\nname = 'x'\n[tests.t]\nexpected = 'fail'\nreason = ''\nexpcted = 1\n", ["entry 't'", "'expcted'"]),
    ("[implementation]\nname = 'x'\n[tests]\nt = 'fail'\n", ["entry 't'", "must be a table"]),
    ("[implementation\nname = 'x'\n", ["not valid TOML"]),
    ("[implementation]\nname = 'x'\n[tests.t]\nexpected = 'fail'\nreason = ''\nintermittent = 1\n",
     ["entry 't'", "'intermittent' must be true or false"]),
    ("[implementation]\nname = 'x'\n[tests.t]\nexpected = 'partial'\nreason = ''\nintermittent = true\n",
     ["entry 't'", "'intermittent'", "'partial'"]),
    ("[implementation]\nname = 'x'\n[extra]\n", ["unknown table", "'extra'"]),
])
def test_damaged_file_errors_name_file_entry_and_field(text, words):
    with pytest.raises(ValueError) as e:
        expectations.parse(text, "exp/my.toml")
    assert str(e.value).startswith("exp/my.toml: ") and all(w in str(e.value) for w in words), str(e.value)


def test_the_same_test_in_two_files_is_an_error(tmp_path):
    for n in ("a", "b"):
        (tmp_path / f"{n}.toml").write_text("[implementation]\nname = 'x'\n[tests.t]\nexpected = 'fail'\nreason = ''\n")
    with pytest.raises(ValueError, match=r"b\.toml: entry 't' for 'x' is listed in .*a\.toml too"):
        expectations.load([tmp_path])
    with pytest.raises(ValueError, match="no such expectation file"):
        expectations.load([tmp_path / "missing.toml"])


def test_the_suites_own_files_name_registered_builtins_and_existing_laws():
    """expectations/ (applied to the built-ins in every run): each file names a built-in of its
    technique, and each entry a law that exists, so that no entry silently stops applying."""
    from inference_conformance.conformance import registry

    loaded = expectations.load([expectations.BUILTIN])
    assert {(e.technique, e.name) for e in loaded} >= {("attention", "torch"), ("quantization", "torchao_int8"),
                                                        ("quantization", "torchao_intx")}
    laws = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "properties").rglob("*.py")
                     if p.name.startswith("test_") or p.name == "laws.py" or p.parent.name == "laws")
    for exp in loaded:
        regs, _ = registry.registrations(exp.technique)
        assert exp.name in {r.name for r in regs if r.origin == "builtin"}, exp.source
        assert exp.entries, exp.source
        for key, entry in exp.entries.items():
            law = key.split("[")[0]
            assert f"{law} = " in laws or f"def {law}(" in laws or f'test="{law}"' in laws or f'"{law}"' in laws, \
                f"{exp.source}: {key}: no such law"
            assert entry.reason and entry.link, f"{exp.source}: {key}"
            if "[" in key:
                params = key.split("[")[1]
                assert params.startswith(exp.name + "-") or params == exp.name + "]", \
                    f"{exp.source}: {key} is another implementation's"


def test_a_files_technique_narrows_its_name():
    torch_attention = expectations.parse('[implementation]\nname = "torch"\ntechnique = "attention"\n'
                                         '[tests.test_law]\nexpected = "fail"\nreason = "r"\n', "a.toml")
    assert expectations.lookup([torch_attention], "torch", "test_law[torch-float32]", law="test_law",
                               technique="attention") is not None
    assert expectations.lookup([torch_attention], "torch", "test_law[torch-float32]", law="test_law",
                               technique="quantization") is None
    assert expect.file_name("torch", "attention") == "attention-torch.toml"
    assert expect.file_name("my_pkg.mod:attn", "attention") == "my_pkg.mod_attn.toml"


def test_the_builtin_expectations_ship_in_a_non_editable_install():
    """``pip install .`` (not ``-e``) must carry expectations/: the built-ins' expected failures
    are read from beside the installed packages on every run, and a suite installed without them
    would fail PyTorch's known NaN finding as new. Read from pyproject.toml's own package pattern."""
    from setuptools import find_packages

    cfg = expectations.tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    name = f"inference_conformance.{expectations.BUILTIN.name}"

    assert name in find_packages(str(ROOT), include=cfg["packages"]["find"]["include"]), cfg["packages"]
    assert (ROOT / "inference_conformance" / expectations.BUILTIN.name).resolve() == expectations.BUILTIN.resolve()
    assert "*.toml" in cfg["package-data"].get(name, []), cfg["package-data"]
    assert sorted(expectations.BUILTIN.glob("*.toml")), expectations.BUILTIN
