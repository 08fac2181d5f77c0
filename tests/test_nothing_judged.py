"""An outside implementation that refuses every example of every claim's law (NotImplementedError:
"unsupported" cells), or all but a few of them ("not enough evidence"), has conformed to no
claim: the run exits 1 and says so in one line, never 0; one law judged is enough to keep the
run's own exit status (the report's --strict judges the rest)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from inference_conformance.conformance import plugin_results
from inference_conformance.conformance.plugin_state import state

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path, body: str):
    (tmp_path / "refusing.py").write_text(f"def fp8_cast(x, *, format, saturate):\n{body}\n", encoding="utf-8")
    env = dict(os.environ, CI="true", PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--device", "cpu", "properties/fp8_cast",
           "-k", "not invalid_call", "--impl", "fp8_cast=refusing:fp8_cast"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def test_an_implementation_refusing_every_law_fails_the_run(tmp_path):
    code, out = _run(tmp_path, "    raise NotImplementedError('no FP8 on this device')")
    assert code == 1, out[-3000:]
    assert ("conformance: no claim's law judged refusing:fp8_cast: of its 11 results on claims' laws, "
            "11 unsupported (every example refused); the run exits 1") in out, out[-3000:]
    assert " failed" not in out.splitlines()[-1], "no test failed: the refusals alone make the exit status"


def test_an_implementation_judged_by_a_law_keeps_its_exit_status(tmp_path):
    code, out = _run(tmp_path, "    from inference_conformance.reference.fp8_cast import fp8_cast as ref\n"
                               "    return ref(x, format=format, saturate=saturate)")
    assert code == 0, out[-3000:]
    assert "no claim's law judged" not in out


def _config(verdicts, target="kernels:attention"):
    config = SimpleNamespace(stash=pytest.Stash(), getoption=lambda name, default=None: [f"attention={target}"])
    state(config).verdicts.extend(verdicts)
    return config


def test_a_kernel_judged_on_too_few_examples_fails_the_run():
    """A kernel refusing about six of every seven shapes: FA-3 and FA-7 read "not enough
    evidence" in every dtype, one law unsupported; nothing was judged, the run exits 1."""
    thin = [("attention", law, claim, "kernels:attention", "not enough evidence", None, None)
            for law, claim in (("test_fa3_matches_float64_reference", "FA-3"), ("test_fa7_split_kv_equals_unsplit", "FA-7"))
            for _dtype in range(4)]
    refused = [("attention", "test_fa3_production_shapes", "FA-3", "kernels:attention", "unsupported", None, None)]
    config = _config(thin + refused)
    assert plugin_results.nothing_judged(config) == {"kernels:attention": {"not enough evidence": 8, "unsupported": 1}}
    assert plugin_results.nothing_judged_line("kernels:attention", {"not enough evidence": 8, "unsupported": 1}) == (
        "conformance: no claim's law judged kernels:attention: of its 9 results on claims' laws, 8 not enough "
        "evidence (fewer than 0.25 of the examples accepted), 1 unsupported (every example refused); the run exits 1")
    # one law judged (passed, partial with enough examples, or failed): the run keeps its exit status
    for verdict in ("pass", "partial", "fail"):
        judged = [("attention", "test_fa3_noncontiguous_inputs", "FA-3", "kernels:attention", verdict, None, None)]
        assert plugin_results.nothing_judged(_config(thin + judged)) == {}, verdict
