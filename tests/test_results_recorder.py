"""Result rows come from the running test's own recorder: nothing recorded by one test reaches
another's row, whatever the order, and a comparison made outside any test is nobody's."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch

from inference_conformance.conformance import results, tolerance

ROOT = Path(__file__).resolve().parent.parent

TESTS = '''
import pytest
import torch
from inference_conformance.conformance import results, tolerance

@pytest.mark.claim("AI-1")
def test_records_a_figure():
    results.record("AI-1", measured=42.0, lecture=42.0, unit="x")
    tolerance.check_close(torch.ones(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64))

@pytest.mark.claim("AI-2")
def test_records_nothing():
    assert True
'''


def test_recording_scopes_what_is_recorded():
    rec = results.Recorder()
    with results.recording(rec):
        results.record("AI-1", measured=1.0)
        tolerance.check_close(torch.zeros(2, dtype=torch.float64) + 1, torch.ones(2, dtype=torch.float64))
    assert [f["claim"] for f in rec.figures] == ["AI-1"] and rec.count == 1 and rec.worst.ok
    outside = results.recorder()
    assert outside is not rec and not outside.figures
    with pytest.raises(TypeError, match="Recorder"):
        with results.recording(object()):
            pass


def test_the_running_test_has_its_own_recorder(recorder):
    assert not recorder.figures and recorder.count == 0
    results.record("AI-3", measured=3.0)
    assert recorder.figures[-1]["measured"] == 3.0 and results.recorder() is recorder


@pytest.mark.parametrize("order", ["declared", "reversed"])
def test_rows_do_not_leak_between_tests_in_any_order(tmp_path, order):
    (tmp_path / "test_two.py").write_text(TESTS, encoding="utf-8")
    ids = ["test_two.py::test_records_a_figure", "test_two.py::test_records_nothing"]
    if order == "reversed":
        ids.reverse()
    out = tmp_path / "rows"
    installed = any(ep.value == "inference_conformance.conformance.plugin" for ep in entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "inference_conformance.conformance.plugin"]
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--results", str(out),
                        *plugin, *ids],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(line) for f in out.glob("*.jsonl") for line in f.read_text().splitlines()]
    by_claim = {row["claim"]: row for row in rows}
    assert by_claim["AI-1"]["measured"] == 42.0 and by_claim["AI-1"]["examples"] == 1
    assert by_claim["AI-2"]["measured"] is None and by_claim["AI-2"]["examples"] == 0, by_claim["AI-2"]


def test_a_failed_comparison_beside_figures_is_a_row_of_its_own():
    """A test that records figures and then fails a comparison: the failing comparison is a row
    (its error, bound and rule), so the summary cell shows it, not a figure that held."""
    from inference_conformance.conformance import plugin
    from inference_conformance.conformance.summary import _cell

    class Item:
        nodeid, stash = "t.py::test_x", {}

        def get_closest_marker(self, name):
            return pytest.mark.claim("KV-4").mark if name == "claim" else None

    item = Item()
    rec = item.stash[plugin._RECORDER] = results.Recorder()
    with results.recording(rec):
        results.record("KV-4", measured=2.3, bound=2.3, unit="x")
        with pytest.raises(AssertionError):
            tolerance.assert_close(torch.full((2,), 3.3, dtype=torch.float64), torch.zeros(2, dtype=torch.float64))
    rows = plugin._rows_for(item, "fail", "boom")
    failed = [r for r in rows if r.unit == "max abs error"]
    assert len(failed) == 1 and failed[0].measured == pytest.approx(3.3) and failed[0].rule, rows
    assert "3.3e+00>" in _cell([(r.verdict, r.measured, r.bound) for r in rows])
    assert len(plugin._rows_for(item, "pass", "")) == 1, "a passing test keeps its figure rows only"


def test_a_failure_whose_comparisons_held_shows_no_figure():
    """A failure of a check that is not a comparison (a malformed result) after comparisons that
    held is a plain "fail" cell: never "fail(6.2e-15>7.6e-12)", a figure that held shown as a failure."""
    from inference_conformance.conformance.summary import _cell

    assert _cell([("fail", 6.2e-15, 7.6e-12)]) == "fail"
    assert _cell([("fail", 6.2e-15, 7.6e-12), ("fail", 2.0, 1.0)]) == "fail(2.0e+00>1.0e+00)"
    assert _cell([("fail", float("nan"), 1.0)]) == "fail(nan>1.0e+00)"
