"""What the main job runs (reports/selection.py) and how its stages show progress
(reports/progress.py): the tests naming a claim, not the tooling tests; a progress line with the
tests done, the total and an estimate of the time left, under pytest-xdist too; the results taken
from the experiment cache listed."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from inference_conformance.conformance.results import Row
from inference_conformance.reports import progress, selection

ROOT = Path(__file__).resolve().parent.parent


def test_a_file_declares_a_claim_by_a_marker_not_by_the_word(tmp_path):
    cases = {"deco.py": "import pytest\n\n@pytest.mark.claim('WD-1')\ndef test_x(): pass\n",
             "module.py": "import pytest\npytestmark = [pytest.mark.claim('SD-1')]\n",
             "word.py": '"""Checks that record(claim=...) and mark.claim( work."""\ndef test_x(): pass\n',
             "none.py": "def test_x(): pass\n"}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
    assert {n for n in cases if selection.declares_claim(tmp_path / n)} == {"deco.py", "module.py"}


def test_the_main_job_runs_the_laws_and_the_analytic_tests_not_the_tooling():
    paths = selection.main_job_paths(ROOT)
    assert paths[0] == "properties"
    assert "tests/test_outside_vllm.py" in paths and "tests/test_world_models.py" not in paths   # the world's laws are in properties/world/
    tooling = {"tests/test_tox.py", "tests/test_browser.py", "tests/test_stacks.py", "tests/test_report.py",
               "tests/test_structure.py", "tests/test_attention_errors.py", "tests/test_selection.py"}
    assert not tooling & set(paths)
    assert all((ROOT / p).exists() for p in paths)


def test_without_a_tests_folder_only_the_laws_run(tmp_path):
    assert selection.main_job_paths(tmp_path) == ["properties"]


@pytest.mark.parametrize("given,expected", [([], ["-m", "claim"]), (["--maxfail=1", "-x"], ["-m", "claim"]),
                                            (["-m", "slow"], []), (["-mslow"], [])])
def test_the_claim_marker_is_added_unless_the_user_chose_one(given, expected):
    assert selection.marker_args(given) == expected


def test_marker_args_refuses_a_string():
    with pytest.raises(TypeError, match="user_args"):
        selection.marker_args("-m slow")


@pytest.mark.parametrize("seconds,text", [(0, "0s"), (59.4, "59s"), (61, "1m01s"), (3725, "1h02m")])
def test_clock(seconds, text):
    assert progress.clock(seconds) == text


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf")])
def test_clock_refuses_a_negative_or_non_finite_time(bad):
    with pytest.raises(ValueError, match="seconds"):
        progress.clock(bad)


def test_the_estimate_is_the_measured_time_per_test_times_the_tests_left():
    """Measured from the first finished test (the stage's start is not a test's time), once a few
    tests finished over a few seconds; "estimating" before; the load beside it when above the cores."""
    p = progress.Progress(total=100, start=0.0)
    p.finished(40.0)                                   # a slow start: imports, compilation
    assert p.line(now=41.0, load="") == "progress: 1/100 tests (1%), 41s elapsed, estimating the time left"
    for t in range(24):
        p.finished(41.0 + t)
    assert p.line(now=64.0, load="") == "progress: 25/100 tests (25%), 1m04s elapsed, about 1m15s left"
    assert p.line(now=64.0, load=progress.load_note(6.3, 2)).endswith("about 1m15s left, load 6.3 on 2 cores")
    assert progress.load_note(1.5, 2) == ""
    p.done = 100
    assert p.line(now=200.0) == "progress: 100/100 tests (100%), 3m20s elapsed"


def _suite(tmp_path: Path) -> Path:
    (tmp_path / "conftest.py").write_text(
        "def pytest_configure(config):\n    config.addinivalue_line('markers', 'claim(id): a claim')\n")
    (tmp_path / "test_a.py").write_text(
        "import pytest\n\n@pytest.mark.claim('WD-1')\n@pytest.mark.parametrize('i', range(5))\n"
        "def test_law(i): pass\n\ndef test_tool(): pass\n")
    return tmp_path


@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_a_stage_prints_its_progress_and_counts_what_the_workers_ran(tmp_path, workers):
    if workers and importlib.util.find_spec("xdist") is None:
        pytest.skip("pytest-xdist is not installed")
    env = dict(os.environ, **{progress.EVERY_ENV: "0", "PYTHONPATH": os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")])})
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "inference_conformance.reports.progress",
           "-p", "no:inference_conformance", *selection.marker_args(), *workers, str(_suite(tmp_path))]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("progress: ")]
    assert out.returncode == 0, out.stdout + out.stderr
    assert "5 passed" in out.stdout and "test_tool" not in out.stdout
    assert lines[0].startswith("progress: 1/5 tests (20%)") and "estimating the time left" in lines[0], lines
    assert lines[-1].startswith("progress: 5/5 tests (100%)")


def test_an_ordinary_run_prints_no_progress(tmp_path):
    env = dict(os.environ, **{progress.EVERY_ENV: "0"})
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:inference_conformance",
                          str(_suite(tmp_path))], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "6 passed" in out.stdout
    assert "progress:" not in out.stdout


def test_the_cached_results_are_listed(tmp_path):
    rows = [Row(claim="SD-3", check="benchmarks/x.py::test_sd3", extra={"cached": True, "cached_at": "T1"}),
            Row(claim="SD-3", check="benchmarks/x.py::test_sd3", extra={"cached": True, "cached_at": "T1"}),
            Row(claim="SD-9", check="benchmarks/y.py::test_sd9[greedy]", extra={}),
            Row(claim="SD-1", check="benchmarks/x.py::test_sd1", extra={"cached": "yes"})]
    (tmp_path / "bench").mkdir()
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows[2:]))
    (tmp_path / "bench" / "rows-main.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows[:2]))
    assert progress.cached_results(tmp_path) == ["SD-3: test_sd3 (computed T1)"]
    assert progress.cached_results(tmp_path / "missing") == []
