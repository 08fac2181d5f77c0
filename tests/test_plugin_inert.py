"""The plugin is inert for a project's own tests: installed, it is loaded by every pytest run in
the environment, yet a project with its own Hypothesis ``ci`` profile (500 examples), its own
``benchmarks/``, ``tests/``, ``reports/`` and ``expectations/`` packages and a test that must not
see Triton's interpreter collects the same tests, runs them with the same settings (the examples
each property draws), the same example database, environment and option values, and ends the
same, with the plugin and without it. The suite's own tests (this one) run under the suite's
profile."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = "inference_conformance.conformance.plugin"

CONFTEST = '''
import json, os
import pytest
from hypothesis import settings

settings.register_profile("ci", max_examples=500)
settings.register_profile("dev", max_examples=7)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture(autouse=True)
def observe(request):
    yield
    seen = {"test": request.node.nodeid, "profile": settings.get_current_profile_name(),
            "max_examples": settings.default.max_examples, "database": repr(settings.default.database),
            "env": {k: v for k, v in os.environ.items() if k not in ("PYTEST_CURRENT_TEST", "OBSERVED")},
            "options": {k: repr(v) for k, v in sorted(vars(request.config.option).items())},
            "calls": getattr(request.node.module, "CALLS", {}).get(request.node.name)}
    with open(os.environ["OBSERVED"], "a") as f:
        f.write(json.dumps(seen) + "\\n")
'''

PROPERTY = '''
from hypothesis import given, strategies as st

CALLS = {}


@given(st.integers())
def test_draws_what_the_profile_says(x):
    CALLS["test_draws_what_the_profile_says"] = CALLS.get("test_draws_what_the_profile_says", 0) + 1


def test_their_reports_and_expectations_are_theirs():
    import expectations.table
    import reports.expect

    assert reports.expect.OWN and expectations.table.OWN
'''

TRITONLESS = '''
import os


def test_no_interpreter_asked_for():
    assert "TRITON_INTERPRET" not in os.environ
'''

BENCH = '''
def test_their_benchmark(benchmark):
    benchmark(sum, range(10))
'''


def _project(root: Path) -> Path:
    for package in ("tests", "benchmarks", "reports", "expectations"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
    (root / "conftest.py").write_text(CONFTEST)
    (root / "tests" / "test_props.py").write_text(PROPERTY)
    (root / "tests" / "test_tritonless.py").write_text(TRITONLESS)
    (root / "benchmarks" / "test_speed.py").write_text(BENCH)
    (root / "reports" / "expect.py").write_text("OWN = True\n")
    (root / "expectations" / "table.py").write_text("OWN = True\n")
    (root / "pyproject.toml").write_text('[tool.pytest.ini_options]\ntestpaths = ["tests", "benchmarks"]\n')
    return root


def _installed() -> bool:
    return any(ep.value == PLUGIN for ep in entry_points(group="pytest11"))


def _run(project: Path, with_plugin: bool, tag: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    observed = project / f"observed-{tag}.jsonl"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "HYPOTHESIS_", "TRITON_", "INFERENCE_CONFORMANCE_"))}
    env.update(CI="true", OBSERVED=str(observed), PYTHONPATH=os.pathsep.join([str(ROOT), str(project)]))
    if with_plugin:
        plugin = [] if _installed() else ["-p", PLUGIN]
    else:
        plugin = ["-p", "no:inference_conformance"] if _installed() else []
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *plugin],
                       cwd=project, env=env, capture_output=True, text=True, timeout=300)
    rows = [json.loads(line) for line in observed.read_text().splitlines()] if observed.exists() else []
    return r, rows


def test_a_projects_tests_see_no_difference(tmp_path):
    project = _project(tmp_path / "kernel_project")
    without, seen_without = _run(project, False, "without")
    with_, seen_with = _run(project, True, "with")
    assert without.returncode == 0, without.stdout + without.stderr
    assert with_.returncode == 0, with_.stdout + with_.stderr
    assert without.stdout.splitlines()[-1].split(" in ")[0] == with_.stdout.splitlines()[-1].split(" in ")[0]
    by_test = {row["test"]: row for row in seen_without}
    assert sorted(by_test) == sorted(row["test"] for row in seen_with) and len(by_test) == 4, by_test
    for row in seen_with:
        before = by_test[row["test"]]
        for key in ("profile", "max_examples", "database", "env", "calls"):
            assert row[key] == before[key], (row["test"], key, row[key], before[key])
        common = (set(row["options"]) & set(before["options"])) - {"plugins"}   # -p differs: the point
        assert {k: row["options"][k] for k in common} == {k: before["options"][k] for k in common}, row["test"]
    prop = next(r for r in seen_with if r["test"].endswith("test_draws_what_the_profile_says"))
    assert prop["profile"] == "ci" and prop["max_examples"] == 500 and prop["calls"] >= 400, prop
    assert not any(k.startswith(("TRITON_", "HYPOTHESIS_")) for k in prop["env"])


def test_the_suites_own_tests_run_under_the_suites_profile(request):
    """This file is the suite's: its tests take the suite's profile (``ci`` under CI=true, else
    ``dev``, or the one named), whatever profile the process loaded."""
    from hypothesis import settings

    from inference_conformance.conformance.plugin_state import state

    name = state(request.config).profile
    assert name.startswith("inference_conformance.") or os.environ.get("HYPOTHESIS_PROFILE") \
        or request.config.getoption("hypothesis_profile", default=None)
    assert settings.default == settings.get_profile(name)
    assert settings.get_profile(name).deadline is None


def test_suite_paths_are_told_by_path_not_by_name(tmp_path):
    from inference_conformance.conformance.plugin_state import is_suite_path

    assert is_suite_path(ROOT / "properties" / "test_attention.py")
    assert is_suite_path(ROOT / "benchmarks")
    assert not is_suite_path(tmp_path / "benchmarks" / "bench_x.py")
    assert not is_suite_path(tmp_path / "properties")


@pytest.mark.parametrize("option", ["gpu", "", None])
def test_device_options_are_checked_without_state(option):
    from inference_conformance.conformance.device import resolve_device

    if option == "gpu":
        with pytest.raises(ValueError, match="'gpu'"):
            resolve_device(option)
    else:
        assert resolve_device(option) in ("cpu", "cuda")
