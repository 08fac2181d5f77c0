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

    good = "inference_conformance.optimized.speculative:verify"
    bad = "inference_conformance.properties.speculative.zoo:acceptance_times_097"
    env = dict(os.environ, CI="true", HYPOTHESIS_PROFILE="ci")
    env.pop("PYTEST_XDIST_WORKER", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--device", "cpu",
           "properties/speculative/laws/verify.py", "-k", "test_sd1_statistical",
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
    examples reached; the coverage check still runs (it would fail on classes no refusal explains).
    Under ci it accepts about 11 of 215 examples in each dtype: the terminal and the report read
    every row "not enough evidence", and as the run judged nothing else it exits 1 saying why."""
    from inference_conformance.conformance.results import read_rows
    from inference_conformance.reports import build

    env = dict(os.environ, CI="true", HYPOTHESIS_PROFILE="ci")
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--device", "cpu",
                           "properties/quantization/laws/integer.py", "-k", "test_qt1_within_half_step",
                           "--impl", "quantization=tests.partial_quantization:IMPL",
                           "--results", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    rows = [r for r in read_rows(tmp_path) if r.check.split("::")[-1].startswith("test_qt1_within_half_step")]
    assert rows, out[-3000:]
    assert proc.returncode == 1, out[-3000:]
    assert (f"conformance: no claim's law judged tests.partial_quantization:IMPL: of its {len(rows)} results on "
            f"claims' laws, {len(rows)} not enough evidence") in out, out[-3000:]
    for r in rows:
        ev = r.evidence
        assert r.verdict == "partial" and 0 < ev["accepted"] < ev["examples"] / 4, (r.verdict, ev)
        assert "only 8-bit per-channel" in r.message and "classes only refused" in r.message, r.message
        assert "granularity:group" in r.message or "granularity:tensor" in r.message, r.message
        assert f"{ev['accepted']} of {ev['examples']} examples" in r.message and "bits:4" in ev["refused_classes"]
        assert len(ev["judged"]) == ev["accepted"], ev          # what a merge matches an older failure's input with
    assert "thin" in out.split("conformance verdicts")[-1], out[-3000:]
    qt1 = next(c for c in build.claim_verdicts(rows) if c["id"] == "QT-1")
    assert qt1["verdict"] == "not enough evidence", qt1


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
           "properties/speculative_tree/laws.py", "-k", "test_sd11_statistical and float64 and not reference and not "
                                                                         "torch",
           "--impl", f"speculative_tree={good}", "--impl", f"speculative_tree={bad}", "--results", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    verdicts = {(r.check.split("::")[-1].split("[")[0], r.implementation): r.verdict for r in read_rows(tmp_path)
                if r.implementation in (good, bad)}
    assert verdicts == {("test_sd11_statistical", good): "pass", ("test_sd11_statistical", bad): "fail"}, \
        (verdicts, out[-4000:])


#: The worked outside examples of the newer techniques and their one-bug twins (examples/my_*.py,
#: each written from its technique's docs page): (technique, good, bad, test file, law, what only
#: the twin's message must hold). One pytest process runs them all (one start-up, one collection).
EXAMPLES = (
    ("kv_transfer", "my_kv_transfer:TRANSFER", "my_kv_transfer:BUGGY", "properties/kv_transfer/laws.py",
     "test_pa9_transfer_continues_as_one_engine", ("measured error", "EXCEEDS bound", "rule float64")),
    ("tree_attention", "my_tree_attention:tree_attention", "my_tree_attention:wrong_tree_attention",
     "properties/tree_attention/laws.py", "test_sd10_tree_attention_matches_paths",
     ("EXCEEDS bound", "rule float")),
    ("tree_attention", "my_tree_attention:tree_attention", "my_tree_attention:wrong_tree_attention",
     "properties/speculative_tree/laws.py", "test_sd10_tree_attention_equals_each_path_alone",
     ("EXCEEDS bound", "rule float")),
    ("fp8_cast", "my_fp8_cast:fp8_cast", "my_fp8_cast:wrong_fp8_cast", "properties/fp8_cast/laws.py",
     "test_qt11_cast_rounds_to_nearest_even", ("EXCEEDS bound 0.000e+00", "rule exact")),
    ("kv_format", "my_kv_format:my_kv_format", "my_kv_format:wrong_kv_format", "properties/kv_format/laws.py",
     "test_qt12_every_value_within_its_step", ("EXCEEDS bound 1.000e+00", "rule QT-12 half step")),
    ("inference_engine", "my_engine:ENGINE", "my_engine:BUGGY", "properties/inference_engine/laws/serving.py",
     "test_serve_features_combined", ("measured error", "EXCEEDS bound", "rule exact", "fork")),
    ("drafter", "my_drafter:DRAFTER", "my_drafter:BUGGY", "properties/drafter/laws.py",
     "test_sd12_greedy_drafts_emit_greedy_decoding", ("malformed tree", "parents[1] = 1", "-1 <= parents[i] < i")),
)


def test_outside_examples_pass_and_their_twins_fail(tmp_path):
    """`--impl technique=module:attr` reaches each newer technique's law: every worked example of
    :data:`EXAMPLES` passes its law and its one-bug twin fails it (exit status 1), in float32 (the
    engine in its own dtype), its message giving the measured error, the bound and the rule."""
    from inference_conformance.conformance.results import read_rows

    env = dict(os.environ, CI="true", HYPOTHESIS_PROFILE="ci",
               PYTHONPATH=os.pathsep.join([str(ROOT / "examples"), os.environ.get("PYTHONPATH", "")]))
    env.pop("PYTEST_XDIST_WORKER", None)
    pairs = dict.fromkeys((t, good, bad) for t, good, bad, *_ in EXAMPLES)
    impls = [a for t, good, bad in pairs for a in ("--impl", f"{t}={good}", "--impl", f"{t}={bad}")]
    laws = " or ".join(sorted({law for *_, law, _ in EXAMPLES}))
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--device", "cpu",
           *sorted({path for *_, path, _, _ in EXAMPLES}),
           "-k", f"({laws}) and my_ and not bfloat16 and not float16 and not float64", *impls, "--results", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    rows = read_rows(tmp_path)
    for technique, good, bad, path, law, words in EXAMPLES:
        mine = [r for r in rows if r.check.startswith(path) and law in r.check and r.implementation in (good, bad)]
        assert {(r.implementation, r.verdict) for r in mine} == {(good, "pass"), (bad, "fail")}, \
            (technique, law, [(r.check, r.implementation, r.verdict) for r in mine], out[-3000:])
        for r in mine:
            if r.implementation == bad:
                assert all(w in r.message for w in words), (technique, law, words, r.message)
