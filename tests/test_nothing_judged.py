"""An outside implementation that refuses every example of every claim's law (NotImplementedError:
"unsupported" cells) has conformed to no claim: the run exits 1 and says so, never 0."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
    assert "conformance: no claim's law judged refusing:fp8_cast: every one it was given is unsupported" in out, \
        out[-3000:]
    assert " failed" not in out.splitlines()[-1], "no test failed: the refusals alone make the exit status"


def test_an_implementation_judged_by_a_law_keeps_its_exit_status(tmp_path):
    code, out = _run(tmp_path, "    from inference_conformance.reference.fp8_cast import fp8_cast as ref\n"
                               "    return ref(x, format=format, saturate=saturate)")
    assert code == 0, out[-3000:]
    assert "no claim's law judged" not in out
