"""A kernel project laid out as flash-attention, vLLM and FlashInfer are (its own ``tests/``,
``benchmarks/``, ``reports/`` and ``expectations/`` packages, its own Hypothesis ``ci`` profile of
500 examples, a test that must not see Triton's interpreter), and a pytest run of it that
records what each of its tests saw: the tests the plugin must leave alone
(tests/test_plugin_inert.py from this checkout, tests/test_installed_project.py from the wheel).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

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
    if not os.environ.get("OBSERVED"):   # a run of the suite's laws from this project
        return
    seen = {"test": request.node.nodeid, "profile": settings.get_current_profile_name(),
            "max_examples": settings.default.max_examples, "database": repr(settings.default.database),
            "env": {k: v for k, v in os.environ.items() if k not in ("PYTEST_CURRENT_TEST", "OBSERVED", "PYTHONPATH")},
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
    import properties.laws
    import reports.expect

    assert reports.expect.OWN and expectations.table.OWN and properties.laws.OWN
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


def make_project(root: Path) -> Path:
    """Write the project into ``root`` (created); returns ``root``."""
    for package in ("tests", "benchmarks", "reports", "expectations", "properties"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
    (root / "conftest.py").write_text(CONFTEST)
    (root / "tests" / "test_props.py").write_text(PROPERTY)
    (root / "tests" / "test_tritonless.py").write_text(TRITONLESS)
    (root / "benchmarks" / "test_speed.py").write_text(BENCH)
    (root / "reports" / "expect.py").write_text("OWN = True\n")
    (root / "expectations" / "table.py").write_text("OWN = True\n")
    (root / "properties" / "laws.py").write_text("OWN = True\n")
    (root / "pyproject.toml").write_text('[tool.pytest.ini_options]\ntestpaths = ["tests", "benchmarks"]\n')
    return root


def installed() -> bool:
    """Whether this environment registers the plugin by its entry point."""
    return any(ep.value == PLUGIN for ep in entry_points(group="pytest11"))


def run_project(project: Path, suite: Path | None, with_plugin: bool, tag: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run the project's tests under CI=true with the suite found at ``suite`` (first on
    PYTHONPATH: a checkout or an install target; None: not on it), with its plugin or without
    (blocked by name where an installed one would load);
    returns the run and what each test recorded."""
    observed = project / f"observed-{tag}.jsonl"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "HYPOTHESIS_", "TRITON_", "INFERENCE_CONFORMANCE_"))}
    env.update(CI="true", OBSERVED=str(observed), PYTHONPATH=os.pathsep.join([str(p) for p in (suite, project) if p]))
    if with_plugin:
        plugin = [] if installed() else ["-p", PLUGIN]
    else:
        plugin = ["-p", "no:inference_conformance"] if installed() else []
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *plugin],
                       cwd=project, env=env, capture_output=True, text=True, timeout=300)
    rows = [json.loads(line) for line in observed.read_text().splitlines()] if observed.exists() else []
    return r, rows


def assert_same(seen_without: list[dict], seen_with: list[dict]) -> None:
    """Each test of the project saw the same profile, examples, database, environment and option
    values in both runs (the ``-p`` options and PYTHONPATH, set by the caller, aside), and its property drew the project's 500."""
    by_test = {row["test"]: row for row in seen_without}
    assert sorted(by_test) == sorted(row["test"] for row in seen_with) and len(by_test) == 4, by_test
    for row in seen_with:
        before = by_test[row["test"]]
        for key in ("profile", "max_examples", "database", "calls"):
            assert row[key] == before[key], (row["test"], key, row[key], before[key])
        changed = {k: (before["env"].get(k), row["env"].get(k)) for k in set(row["env"]) | set(before["env"])
                   if row["env"].get(k) != before["env"].get(k)}
        assert not changed, (row["test"], "environment (without, with)", changed)
        common = (set(row["options"]) & set(before["options"])) - {"plugins"}   # -p differs: the point
        assert {k: row["options"][k] for k in common} == {k: before["options"][k] for k in common}, row["test"]
    prop = next(r for r in seen_with if r["test"].endswith("test_draws_what_the_profile_says"))
    assert prop["profile"] == "ci" and prop["max_examples"] == 500 and prop["calls"] >= 400, prop
    assert not any(k.startswith(("TRITON_", "HYPOTHESIS_")) for k in prop["env"])


def summary_line(run: subprocess.CompletedProcess) -> str:
    """pytest's last line without its duration: "4 passed"."""
    return run.stdout.splitlines()[-1].split(" in ")[0] if run.stdout.strip() else ""


def check_inert(project: Path, without: Path | None, with_: Path) -> None:
    """Run the project's tests without the suite's plugin (the suite at ``without``, or not on
    PYTHONPATH) and with it (the suite at ``with_``): both pass alike, and each test saw the same
    (:func:`assert_same`)."""
    plain, seen_plain = run_project(project, without, False, "without")
    plugged, seen_plugged = run_project(project, with_, True, "with")
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert plugged.returncode == 0, plugged.stdout + plugged.stderr
    assert summary_line(plain) == summary_line(plugged) == "4 passed"
    assert_same(seen_plain, seen_plugged)
