"""The plugin is inert for a project's own tests: installed, it is loaded by every pytest run in
the environment, yet a project with its own Hypothesis ``ci`` profile (500 examples), its own
``benchmarks/``, ``tests/``, ``reports/`` and ``expectations/`` packages and a test that must not
see Triton's interpreter collects the same tests, runs them with the same settings (the examples
each property draws), the same example database, environment and option values, and ends the
same, with the plugin and without it. The suite's own tests (this one) run under the suite's
profile."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.plugin_project import check_inert, make_project

ROOT = Path(__file__).resolve().parent.parent


def test_a_projects_tests_see_no_difference(tmp_path):
    project = make_project(tmp_path / "kernel_project")
    check_inert(project, ROOT, ROOT)


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

    assert is_suite_path(ROOT / "properties" / "attention" / "test_attention.py")
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


@pytest.mark.parametrize("given, env, want", [
    ("ci", {}, "inference_conformance.ci"), ("thorough", {}, "inference_conformance.thorough"),
    ("theirs", {}, "theirs"), (None, {"HYPOTHESIS_PROFILE": "compat"}, "inference_conformance.compat"),
    (None, {"CI": "true"}, "inference_conformance.ci"), (None, {"CI": ""}, "inference_conformance.dev")])
def test_the_suites_profile_is_named_for_its_own_tests(monkeypatch, given, env, want):
    import types

    from inference_conformance.conformance.plugin_profiles import profile_name

    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    config = types.SimpleNamespace(getoption=lambda name, default=None: given)
    assert profile_name(config) == want


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")  # registered in a test
def test_a_short_name_is_registered_only_where_the_project_has_none():
    import types

    from hypothesis import settings

    from inference_conformance.conformance.plugin_profiles import alias_requested

    settings.register_profile("compat", max_examples=123)          # the project's own "compat"
    alias_requested(types.SimpleNamespace(getoption=lambda name, default=None: "compat"))
    assert settings.get_profile("compat").max_examples == 123
