"""Outside implementations that crash, fail to import or return the wrong thing: every collected
test still runs and the failure is said in one line (pytest run as a subprocess, as a user would)."""
from __future__ import annotations

import os
import subprocess
from importlib.metadata import entry_points
import sys
from pathlib import Path

import pytest
import torch

from inference_conformance.conformance import registry

ROOT = Path(__file__).resolve().parent.parent

CRASHING = '''
import os
def attention(q, k, v, *, causal, scale):
    os._exit(1)
'''
BROKEN = "def attention(q, k, v, *, causal, scale)\n    return q\n"          # a syntax error
RAISING = "raise RuntimeError('the vendor library is missing')\n"


def _pytest(tmp_path: Path, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.update(CI="true", PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]),
               INFERENCE_CONFORMANCE_DIR=str(tmp_path / "storage"))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--device", "cpu", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


TINY_LAWS = '''
import pytest
import torch

@pytest.mark.technique("attention")
@pytest.mark.parametrize("n", range(5))
def test_calls_the_implementation(impl, n):
    q = torch.zeros(1, 1, 2, 4)
    impl(q, q, q, causal=False, scale=0.5)
'''


def test_a_crashing_implementation_does_not_stop_the_run(tmp_path):
    """os._exit in the implementation under -n 1: every collected test runs (five, more than
    xdist's default restart limit of 4 for one worker) and each reports the crash as its failure."""
    (tmp_path / "crashing_attention.py").write_text(CRASHING)
    laws = tmp_path / "laws"
    laws.mkdir()
    (laws / "test_tiny_laws.py").write_text(TINY_LAWS)
    installed = any(ep.value == "inference_conformance.conformance.plugin" for ep in entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "inference_conformance.conformance.plugin"]
    r = _pytest(tmp_path, "-n", "1", *plugin, str(laws), "--impl", "attention=crashing_attention:attention",
                cwd=laws)
    out = r.stdout + r.stderr
    crashed = [line for line in out.splitlines() if line.startswith("FAILED") and "crashed" in line]
    assert len(crashed) == 5, out[-3000:]
    assert "maximum crashed workers reached" not in out, out[-3000:]
    assert r.returncode == 1


@pytest.mark.parametrize("source, words", [(BROKEN, ["SyntaxError", "line 1"]),
                                           (RAISING, ["RuntimeError", "the vendor library is missing"])])
def test_an_implementation_that_cannot_be_imported_is_one_line(tmp_path, source, words):
    (tmp_path / "bad_attention.py").write_text(source)
    r = _pytest(tmp_path, "properties/attention/laws.py", "--impl", "attention=bad_attention:attention")
    err = r.stdout + r.stderr
    assert r.returncode == 4 and "INTERNALERROR" not in err and "Traceback" not in err, err[-3000:]
    line = next(x for x in err.splitlines() if "--impl attention=bad_attention:attention" in x)
    assert all(w in line for w in words), line


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has CUDA")
def test_device_cuda_without_cuda_is_a_usage_error(tmp_path):
    r = _pytest(tmp_path, "--device", "cuda", "tests/test_fields.py")
    err = r.stdout + r.stderr
    assert r.returncode == 4 and "INTERNALERROR" not in err, err[-3000:]
    assert "--device cuda" in err and "torch.cuda.is_available() is False" in err, err[-2000:]


@pytest.mark.parametrize("result", [None, ("a", "tuple"), "numpy"])
def test_a_result_of_the_wrong_type_is_a_type_error_naming_the_function(result):
    import numpy as np

    def attention(q, k, v, *, causal, scale):
        return np.zeros(3) if result == "numpy" else result

    impl = registry.Implementation("attention", "wrong", "tests:wrong", "outside",
                                   registry._namespace(registry.contract("attention"), attention, "tests:wrong"),
                                   ("attention",), returns=registry.contract("attention").returns)
    q = torch.zeros(1, 1, 2, 4)
    with pytest.raises(TypeError, match=r"wrong\.attention returned .*the contract returns Tensor"):
        impl(q, q, q, causal=False, scale=0.5)


def test_runs_leave_no_hypothesis_or_benchmark_folder_in_the_project(tmp_path):
    """`--pyargs inference_conformance.properties` from another project writes its Hypothesis database and benchmark
    storage under the suite's own folder, never into that project."""
    project = tmp_path / "project"
    project.mkdir()
    installed = any(ep.value == "inference_conformance.conformance.plugin" for ep in entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "inference_conformance.conformance.plugin"]
    r = _pytest(tmp_path, "--pyargs", "inference_conformance.properties.attention.test_softmax", *plugin, "--hypothesis-profile", "dev",
                cwd=project)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert not (project / ".hypothesis").exists() and not (project / ".benchmarks").exists(), \
        sorted(p.name for p in project.iterdir())
