"""An outside implementation is checked with no change to the suite: `--impl` on the command
line, exit status 0 when it conforms and non-zero when it does not (examples/my_attention.py)."""
import os
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def _run_attention_properties(target: str, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "examples"), os.environ.get("PYTHONPATH", "")]),
               CI="true", HYPOTHESIS_PROFILE="ci")
    env.pop("PYTEST_XDIST_WORKER", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--device", "cpu",
           "properties", "--impl", f"attention={target}", *extra]   # the README's command
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_outside_attention_that_conforms_exits_zero():
    proc = _run_attention_properties("my_attention:attention")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "passed" in out and "my_attention:attention" in out, out[-4000:]


def test_wrong_outside_attention_exits_nonzero():
    proc = _run_attention_properties("my_attention:wrong_attention", "-x")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    assert "test_fa3_matches_float64_reference" in out and "failed" in out, out[-4000:]


def test_outside_speculative_verifiers_checked(tmp_path):
    """`--impl speculative=module:fn` (repeatable) checks outside verifiers with the SD-1 laws: in
    one run, a conforming one passes the statistical law and one whose acceptance is scaled by
    0.97 fails it (exit status 1)."""
    from inference_conformance.conformance.results import read_rows

    good, bad = "inference_conformance.optimized.speculative:verify", "inference_conformance.properties.speculative.zoo:acceptance_times_097"
    env = dict(os.environ, CI="true", HYPOTHESIS_PROFILE="ci")
    env.pop("PYTEST_XDIST_WORKER", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--device", "cpu",
           "properties/speculative/test_speculative.py", "-k", "test_sd1_statistical",
           "--impl", f"speculative={good}", "--impl", f"speculative={bad}", "--results", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    verdicts = {(r.check.split("::")[-1].split("[")[0], r.implementation): r.verdict for r in read_rows(tmp_path)
                if r.implementation in (good, bad)}
    assert verdicts == {("test_sd1_statistical", good): "pass", ("test_sd1_statistical", bad): "fail"}, \
        (verdicts, out[-4000:])


def test_partial_support_is_reported_partial_with_what_was_refused(tmp_path):
    """An implementation that refuses every weight but 8-bit per channel passes QT-1 on what it
    accepts: the row says "partial" and names the refusal and the boundary classes only refused
    examples reached; the coverage check still runs (it would fail on classes no refusal explains)."""
    from inference_conformance.conformance.results import read_rows

    env = dict(os.environ, CI="true", HYPOTHESIS_PROFILE="ci")
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--device", "cpu",
                           "properties/quantization/test_quantization.py", "-k", "test_qt1_within_half_step",
                           "--impl", "quantization=tests.partial_quantization:IMPL",
                           "--results", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    rows = [r for r in read_rows(tmp_path) if r.check.split("::")[-1].startswith("test_qt1_within_half_step")]
    assert rows, out[-3000:]
    assert proc.returncode == 0, out[-3000:]
    for r in rows:
        assert r.verdict == "partial", (r.verdict, r.message)
        assert "only 8-bit per-channel" in r.message and "classes only refused" in r.message, r.message
        assert "granularity:group" in r.message or "granularity:tensor" in r.message, r.message


def test_outside_tree_verifiers_checked(tmp_path):
    """`--impl speculative_tree=module:fn` checks outside tree verifiers with the SD-11 law: the
    worked example (examples/my_tree_verifier.py) passes it and its variant that never updates the
    residual after a rejected sibling fails it (exit status 1), in float64 (the law's other dtypes
    run the same code of theirs)."""
    from inference_conformance.conformance.results import read_rows

    good, bad = "my_tree_verifier:verify_tree", "my_tree_verifier:wrong_tree_verifier"
    env = dict(os.environ, CI="true", HYPOTHESIS_PROFILE="ci",
               PYTHONPATH=os.pathsep.join([str(ROOT / "examples"), os.environ.get("PYTHONPATH", "")]))
    env.pop("PYTEST_XDIST_WORKER", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--device", "cpu",
           "properties/speculative_tree/test_speculative_tree.py", "-k", "test_sd11_statistical and float64 and not reference and not torch",
           "--impl", f"speculative_tree={good}", "--impl", f"speculative_tree={bad}", "--results", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    verdicts = {(r.check.split("::")[-1].split("[")[0], r.implementation): r.verdict for r in read_rows(tmp_path)
                if r.implementation in (good, bad)}
    assert verdicts == {("test_sd11_statistical", good): "pass", ("test_sd11_statistical", bad): "fail"}, \
        (verdicts, out[-4000:])


def test_outside_kv_transfer_checked(tmp_path):
    """`--impl kv_transfer=module:attr` checks outside KV transfers with PA-9's law: the worked
    example (examples/my_kv_transfer.py, written from docs/kv_transfer.md) passes it and its twin
    that sends whole blocks only (the partly filled last block dropped) fails it (exit status 1),
    its message giving the error, the bound and the rule."""
    from inference_conformance.conformance.results import read_rows

    good, bad = "my_kv_transfer:TRANSFER", "my_kv_transfer:BUGGY"
    env = dict(os.environ, CI="true", HYPOTHESIS_PROFILE="ci",
               PYTHONPATH=os.pathsep.join([str(ROOT / "examples"), os.environ.get("PYTHONPATH", "")]))
    env.pop("PYTEST_XDIST_WORKER", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--device", "cpu",
           "properties/kv_transfer/test_kv_transfer.py", "-k", "test_pa9_transfer_continues_as_one_engine",
           "--impl", f"kv_transfer={good}", "--impl", f"kv_transfer={bad}", "--results", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    rows = {r.implementation: r for r in read_rows(tmp_path) if r.implementation in (good, bad)}
    assert {k: r.verdict for k, r in rows.items()} == {good: "pass", bad: "fail"}, out[-4000:]
    assert all(w in rows[bad].message for w in ("measured error", "EXCEEDS bound", "rule float64")), rows[bad].message


def test_outside_tree_attention_checked(tmp_path):
    """`--impl tree_attention=module:fn` reaches SD-10 at the attention level and through the model:
    the worked example (examples/my_tree_attention.py, written from docs/tree_attention.md) passes
    both laws, and its twin whose mask is built from the flattened node index fails both (exit
    status 1), each failure stating the measured error, the bound and the rule."""
    from inference_conformance.conformance.results import read_rows

    good, bad = "my_tree_attention:tree_attention", "my_tree_attention:wrong_tree_attention"
    env = dict(os.environ, CI="true", HYPOTHESIS_PROFILE="ci",
               PYTHONPATH=os.pathsep.join([str(ROOT / "examples"), os.environ.get("PYTHONPATH", "")]))
    env.pop("PYTEST_XDIST_WORKER", None)
    laws = ("test_sd10_tree_attention_matches_paths", "test_sd10_tree_attention_equals_each_path_alone")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--device", "cpu",
           "properties/tree_attention/test_tree_attention.py",
           "properties/speculative_tree/test_speculative_tree_engine.py",
           "-k", f"({' or '.join(laws)}) and not bfloat16 and not float16",
           "--impl", f"tree_attention={good}", "--impl", f"tree_attention={bad}", "--results", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    rows = [r for r in read_rows(tmp_path) if r.implementation in (good, bad)]
    verdicts = {(r.check.split("::")[-1].split("[")[0], r.implementation, r.verdict) for r in rows}
    assert verdicts == {(law, impl, v) for law in laws for impl, v in ((good, "pass"), (bad, "fail"))}, \
        (verdicts, out[-4000:])
    for r in rows:
        if r.implementation == bad:
            assert "EXCEEDS bound" in r.message and "rule float" in r.message, r.message


def test_outside_fp8_casts_checked(tmp_path):
    """`--impl fp8_cast=module:fn` checks outside FP8 casts with QT-11's grid law: the worked
    example (examples/my_fp8_cast.py) passes it and its twin that rounds ties away from zero fails
    it (exit status 1), in float32, with the measured error, the bound and the rule."""
    from inference_conformance.conformance.results import read_rows

    good, bad = "my_fp8_cast:fp8_cast", "my_fp8_cast:wrong_fp8_cast"
    env = dict(os.environ, CI="true", HYPOTHESIS_PROFILE="ci",
               PYTHONPATH=os.pathsep.join([str(ROOT / "examples"), os.environ.get("PYTHONPATH", "")]))
    env.pop("PYTEST_XDIST_WORKER", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--device", "cpu",
           "properties/fp8_cast/test_fp8_cast.py", "-k", "test_qt11_cast_rounds_to_nearest_even and float32",
           "--impl", f"fp8_cast={good}", "--impl", f"fp8_cast={bad}", "--results", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    verdicts = {r.implementation: r.verdict for r in read_rows(tmp_path) if r.implementation in (good, bad)}
    assert verdicts == {good: "pass", bad: "fail"}, (verdicts, out[-4000:])
    assert "EXCEEDS bound 0.000e+00 (rule exact)" in out, out[-4000:]


def test_outside_kv_formats_checked(tmp_path):
    """`--impl kv_format=module:obj` checks outside KV-cache formats with QT-12's value law: the
    worked example (examples/my_kv_format.py) passes it and its twin that shares one scale among a
    token's heads fails it (exit status 1), in float32, with the measured error, the bound and the
    rule."""
    from inference_conformance.conformance.results import read_rows

    good, bad = "my_kv_format:my_kv_format", "my_kv_format:wrong_kv_format"
    env = dict(os.environ, CI="true", HYPOTHESIS_PROFILE="ci",
               PYTHONPATH=os.pathsep.join([str(ROOT / "examples"), os.environ.get("PYTHONPATH", "")]))
    env.pop("PYTEST_XDIST_WORKER", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--device", "cpu",
           "properties/kv_format/test_kv_format.py", "-k", "test_qt12_every_value_within_its_step and float32",
           "--impl", f"kv_format={good}", "--impl", f"kv_format={bad}", "--results", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    verdicts = {r.implementation: r.verdict for r in read_rows(tmp_path) if r.implementation in (good, bad)}
    assert verdicts == {good: "pass", bad: "fail"}, (verdicts, out[-4000:])
    assert "EXCEEDS bound 1.000e+00 (rule QT-12 half step)" in out, out[-4000:]


def test_outside_engine_serve_checked(tmp_path):
    """`--impl inference_engine=module:attr` checks an outside engine's ``serve`` with the serve
    laws (PA-6..PA-8 combined): the worked example (examples/my_engine.py, written from
    docs/inference_engine.md) passes and its twin whose fork forgets the parent's tokens fails
    (exit status 1), its message giving the error, the bound and the rule."""
    from inference_conformance.conformance.results import read_rows

    good, bad = "my_engine:ENGINE", "my_engine:BUGGY"
    env = dict(os.environ, CI="true", HYPOTHESIS_PROFILE="ci",
               PYTHONPATH=os.pathsep.join([str(ROOT / "examples"), os.environ.get("PYTHONPATH", "")]))
    env.pop("PYTEST_XDIST_WORKER", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--device", "cpu",
           "properties/inference_engine/test_serving.py", "-k", "test_serve_features_combined and my_engine",
           "--impl", f"inference_engine={good}", "--impl", f"inference_engine={bad}", "--results", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    rows = [r for r in read_rows(tmp_path) if r.implementation in (good, bad)]
    assert {r.implementation: r.verdict for r in rows} == {good: "pass", bad: "fail"}, out[-4000:]
    msg = next(r.message for r in rows if r.implementation == bad)
    assert all(w in msg for w in ("measured error", "EXCEEDS bound", "rule exact", "fork")), msg
