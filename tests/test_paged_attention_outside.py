"""An outside paged-attention kernel is checked with no change to the suite: ``--impl
paged_attention=module:fn`` runs the paged-attention laws on the named implementations only.
One run with two outside kernels (the reference, and one whose table walk stops at 64 blocks):
the first passes, the second fails, and the exit status is 1."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOOD = "inference_conformance.reference.paged_attention:paged_attention"
BAD = "inference_conformance.properties.paged_attention.zoo:walk_capped_64_blocks"


def test_outside_paged_attention_kernels_are_checked():
    env = dict(os.environ, CI="true", HYPOTHESIS_PROFILE="ci")
    env.pop("PYTEST_XDIST_WORKER", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rf", "--device", "cpu",
           "properties/paged_attention/laws/decode.py", "--impl", f"paged_attention={GOOD}", "--impl",
           f"paged_attention={BAD}", "-k", "pa1_paged_equals_contiguous and float64"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    assert "1 failed, 1 passed" in out, out[-4000:]
    failed = out.split(" conformance failures: ")[-1].splitlines()[1:-1]      # one line per failing law
    assert len(failed) == 1 and failed[0].startswith("PA-1 test_pa1_paged_equals_contiguous [2]: 1 failed"), out[-4000:]
    assert f"\n[2] {BAD}\n" in out, out[-4000:]                                  # the table's column [2]
