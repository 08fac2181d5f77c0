"""An outside paged-attention kernel is checked with no change to the suite: ``--impl
paged_attention=module:fn`` runs the PA-1 laws on it alone; exit status 0 when it conforms, 1
when it does not (here the reference, and a kernel whose table walk stops at 64 blocks)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(target: str, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, CI="true", HYPOTHESIS_PROFILE="ci")
    env.pop("PYTEST_XDIST_WORKER", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--device", "cpu",
           "properties/test_paged_attention.py", "--impl", f"paged_attention={target}", "-k",
           "pa1_paged_equals_contiguous and float32 or invalid_calls", *extra]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_outside_paged_attention_that_conforms_exits_zero():
    proc = _run("reference.paged:paged_attention")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "2 passed" in out, out[-4000:]


def test_wrong_outside_paged_attention_exits_nonzero():
    proc = _run("properties.zoo_paged:walk_capped_64_blocks", "-x")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    assert "test_pa1_paged_equals_contiguous" in out and "failed" in out, out[-4000:]
