"""``python -m inference_conformance.perf.gate`` fails loudly and never silently passes: damaged run files and history
entries, bad options, missing benchmarks, no baseline, too little history and another device's
baseline each give their exit code (0 pass, 1 regression, 2 usage or input error, 3 inconclusive
with --strict) and one line naming the file, the entry and the field. The command runs as a
subprocess on files this module writes (and on the committed history, read only)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inference_conformance.perf import env, gate, history, settings, stats
from inference_conformance.perf.env import ROOT
from tests.test_gate import _entry, _simulated_runs

COMMITTED = ROOT / "history" / "cpu-amd-epyc"
COMMITTED_ENTRIES = sorted(COMMITTED.glob("*.json"))


def _gate(*args, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "inference_conformance.perf.gate", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The one error line the command printed (no traceback)."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [ln for ln in lines if "error:" in ln]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def _series(tmp_path: Path, days: int, medians: dict[str, float]) -> tuple[Path, list[Path]]:
    h = tmp_path / "history"
    paths = [history.append(_entry(f"2026-01-0{d}T00:00:00Z", f"{d}" * 40, medians), h) for d in range(1, days + 1)]
    return h, paths


def _write(path: Path, doc) -> Path:
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return path


# ------------------------------------------------------------------ damaged run files: exit 2
GOOD = {"benchmarks": [{"fullname": "b::t1", "stats": {"median": 1e-3}}]}


@pytest.mark.parametrize("content, says", [
    ('{"benchmarks": [{"fullname": "b::t1", "stats": {"med', "not valid JSON"),
    ("", "empty file"),
    ("[1, 2, 3]", "the top level is a JSON list"),
    ('{"benchmarks": []}', "field 'benchmarks': is empty"),
    ('{"benchmarks": [{"name": "t1", "stats": {"median": 0.001}}]}', "benchmarks[0] 't1': field 'fullname'"),
    ('{"benchmarks": [{"fullname": "b::t1", "stats": {"median": NaN}}]}', "benchmarks[0] 'b::t1': field 'stats.median': is nan"),
    ('{"benchmarks": [{"fullname": "b::t1", "stats": {"median": -0.001}}]}', "field 'stats.median': is -0.001"),
    ('{"benchmarks": [{"fullname": "b::t1", "stats": {"median": 0}}]}', "field 'stats.median': is 0"),
    ('{"benchmarks": [{"fullname": "b::t1", "stats": {"median": 1e-3}, "data": [1e-3, -1]}]}', "field 'data[1]'"),
], ids=["truncated", "empty", "list", "no-benchmark", "no-fullname", "nan", "negative", "zero", "bad-sample"])
def test_a_damaged_run_file_is_an_input_error_naming_file_entry_and_field(tmp_path, content, says):
    run = _write(tmp_path / "run.json", content)
    proc = _gate(run, "--history", tmp_path / "history")
    assert proc.returncode == stats.EXIT_INPUT, proc.stdout + proc.stderr
    line = _one_error_line(proc)
    assert str(run) in line and says in line, line


def test_a_missing_run_file_is_an_input_error(tmp_path):
    proc = _gate(tmp_path / "nope.json")
    assert proc.returncode == stats.EXIT_INPUT and "nope.json: no such file" in _one_error_line(proc)


@pytest.mark.parametrize("option, value, says", [
    ("--threshold", "-1", "must be > 0"), ("--threshold", "0", "must be > 0"),
    ("--alpha", "2", "must be in (0, 1)"), ("--alpha", "0", "must be in (0, 1)"), ("--alpha", "1", "must be in (0, 1)"),
    ("--hard-limit", "0.9", "ratio > 1"), ("--window", "-3", ">= 0"),
])
def test_out_of_range_options_are_usage_errors(tmp_path, option, value, says):
    proc = _gate(_write(tmp_path / "run.json", GOOD), option, value)
    assert proc.returncode == stats.EXIT_INPUT
    assert option in proc.stderr and says in proc.stderr, proc.stderr


def test_help_documents_the_exit_codes():
    out = _gate("--help").stdout
    for code, word in ((0, "pass"), (1, "regression"), (2, "usage or input error"), (3, "inconclusive")):
        assert f"  {code}  {word}" in out, out
    assert "--strict" in out and "--allow-missing" in out and "--allow-new-series" in out


# ------------------------------------------------------- never silently pass: exit 2 unless allowed
def test_a_run_with_no_benchmark_in_common_with_the_baseline_fails(tmp_path):
    """'3 new, 2 missing': nothing was compared."""
    h, _ = _series(tmp_path, 2, {"t1": 1e-3, "t2": 2e-3})
    run = _write(tmp_path / "run.json", _entry("2026-01-09T00:00:00Z", "e" * 40, {"x1": 1e-3, "x2": 1e-3, "x3": 1e-3}))
    proc = _gate(run, "--history", h, "--allow-missing")
    assert proc.returncode == stats.EXIT_INPUT and "no benchmark of the run is in the baseline" in _one_error_line(proc)
    assert _gate(run, "--history", h, "--allow-missing", "--allow-new-series").returncode == stats.EXIT_PASS


def test_a_benchmark_of_the_baseline_missing_from_the_run_fails_unless_allowed(tmp_path):
    h, _ = _series(tmp_path, 4, {"t1": 1e-3, "t2": 2e-3})
    run = _write(tmp_path / "run.json", _entry("2026-01-09T00:00:00Z", "e" * 40, {"t1": 1e-3}))
    proc = _gate(run, "--history", h)
    assert proc.returncode == stats.EXIT_INPUT
    line = _one_error_line(proc)
    assert str(run) in line and "bench_x.py::t2" in line and "--allow-missing" in line
    assert "MISSING" in proc.stdout  # the verdicts are still printed
    assert _gate(run, "--history", h, "--allow-missing").returncode == stats.EXIT_PASS


def test_no_baseline_fails_unless_a_new_series_is_allowed(tmp_path):
    run = _write(tmp_path / "run.json", _entry("2026-01-09T00:00:00Z", "e" * 40, {"t1": 1e-3}))
    proc = _gate(run, "--history", tmp_path / "empty")
    assert proc.returncode == stats.EXIT_INPUT and "no baseline" in _one_error_line(proc)
    ok = _gate(run, "--history", tmp_path / "empty", "--allow-new-series")
    assert ok.returncode == stats.EXIT_PASS and "no baseline" in ok.stdout
    proc = _gate(run, "--baseline", tmp_path / "absent")
    assert proc.returncode == stats.EXIT_INPUT and "--baseline: no such file or folder" in _one_error_line(proc)


def test_a_truncated_newest_history_entry_is_named_and_fails(tmp_path):
    """It is never skipped without a word (the baseline would silently become the entry before)."""
    h = tmp_path / "history"
    shutil.copytree(COMMITTED, h / COMMITTED.name)
    newest = sorted((h / COMMITTED.name).glob("*.json"))[-1]
    run = _write(tmp_path / "run.json", newest.read_text())
    newest.write_text(newest.read_text()[:5000])
    proc = _gate(run, "--history", h)
    assert proc.returncode == stats.EXIT_INPUT
    line = _one_error_line(proc)
    assert str(newest) in line and "not valid JSON" in line and "--allow-corrupt-history" in line
    proc = _gate(run, "--history", h, "--allow-corrupt-history")
    assert proc.returncode != stats.EXIT_INPUT and "skipped an unusable history entry" in proc.stdout
    assert str(newest) in proc.stdout and newest.name not in proc.stdout.split("vs baseline")[1].split("(")[0]


def test_series_listing_names_every_unusable_entry(tmp_path, capsys):
    h, paths = _series(tmp_path, 3, {"t1": 1e-3})
    paths[1].write_text('{"benchmarks": [{"fullname": "x", "stats": {"median": -1}}], "series": "s", "fingerprint": {}}')
    errors: list = []
    assert [p for p, _ in history.series(paths[0].parent.name, h, errors)] == [paths[0], paths[2]]
    assert len(errors) == 1 and str(paths[1]) in str(errors[0]) and errors[0].field in ("fingerprint", "stats.median")
    history.series(paths[0].parent.name, h)  # without a list: said on stderr
    assert str(paths[1]) in capsys.readouterr().err


# ------------------------------------------------- too little history: inconclusive, hard limit
def test_fewer_than_3_earlier_entries_is_inconclusive_and_points_to_the_ab_mode(tmp_path):
    h, _ = _series(tmp_path, 2, {"t1": 1e-3, "t2": 2e-3})
    run = _write(tmp_path / "run.json", _entry("2026-01-09T00:00:00Z", "e" * 40, {"t1": 1.3e-3, "t2": 2e-3}))
    proc = _gate(run, "--history", h)
    assert proc.returncode == stats.EXIT_PASS, proc.stdout
    assert "INCONCLUSIVE" in proc.stdout and "inference-conformance ab" in proc.stdout and "REGRESSION" not in proc.stdout
    assert _gate(run, "--history", h, "--strict").returncode == stats.EXIT_INCONCLUSIVE


def test_with_the_shipped_3_entry_history_even_2_6x_is_inconclusive(tmp_path):
    """The committed series: the newest entry with one benchmark 2.6x slower, judged against the
    two entries before it: no run-to-run spread is measured (the committed entries of unchanged
    code differ by 0.49x-1.44x), so no verdict, not even beyond the hard limit: exit 0, 3 with
    --strict, and the output says this mode calls no regression."""
    assert len(COMMITTED_ENTRIES) == 3
    doc = json.loads(COMMITTED_ENTRIES[-1].read_text())
    slowed = doc["benchmarks"][3]
    slowed["stats"]["median"] *= 2.6
    slowed["data"] = [x * 2.6 for x in slowed["data"]]
    run = _write(tmp_path / "run.json", doc)
    proc = _gate(run, "--baseline", COMMITTED_ENTRIES[-2], "--json", tmp_path / "d.json")
    assert proc.returncode == stats.EXIT_PASS, proc.stdout + proc.stderr
    decisions = {d["name"]: d for d in json.loads((tmp_path / "d.json").read_text())}
    assert decisions[slowed["fullname"]]["status"] == "inconclusive" and decisions[slowed["fullname"]]["ratio"] > 2.6
    assert "mode: one baseline" in proc.stdout and "calls no regression" in proc.stdout
    assert _gate(run, "--baseline", COMMITTED_ENTRIES[-2], "--strict").returncode == stats.EXIT_INCONCLUSIVE


def test_the_hard_limit_applies_only_where_the_measured_spread_is_well_below_it():
    """b2 swings by e^+-0.5 from run to run: 1.8x is within its spread and fails in no mode (raw,
    relative to the run's speed, the rounds); in a quiet history (1% spread) 1.8x fails on the
    hard limit even where Holm's test would not reject (alpha 1e-12)."""
    def entry(medians):
        return {"benchmarks": [{"fullname": n, "stats": {"median": m}, "data": [m * (1 + 0.001 * k) for k in range(-5, 6)]}
                               for n, m in medians.items()]}

    names = [f"b{j}" for j in range(6)]
    jumpy = [entry({n: 1e-3 * (np.exp(0.5 * (-1) ** h) if n == "b2" else 1.0) for n in names}) for h in range(8)]
    rng = np.random.default_rng(7)
    quiet = [entry({n: 1e-3 * float(np.exp(rng.normal(0, 0.01))) for n in names}) for _ in range(8)]
    run = entry({n: 1.8e-3 if n == "b2" else 1e-3 for n in names})
    base = entry({n: 1e-3 for n in names})
    for history_, normalize, basis in ((jumpy, True, "between-run"), (jumpy, False, "between-run"), (None, False, "rounds")):
        d = {x.name: x for x in gate.gate(run, base, history=history_, normalize=normalize)}["b2"]
        assert d.basis == basis and d.ratio == pytest.approx(1.8, rel=0.05), d
        assert d.status in ("noisy", "inconclusive"), d
    for normalize in (True, False):
        d = {x.name: x for x in gate.gate(run, base, history=quiet, normalize=normalize, alpha=1e-12)}["b2"]
        assert d.status == "regression" and "hard limit" in d.reason, d
        d = {x.name: x for x in gate.gate(run, base, history=quiet, normalize=normalize, alpha=1e-12, hard_limit=None)}["b2"]
        assert d.status != "regression", d
    # the criterion itself: t_{0.999, df} * spread <= ln(limit)
    t = stats.Test(1.8, 1.0, 2.0, 0.5, 0.5, 1, 20, "between-run", spread=0.05, df=19)
    assert stats.hard_limit_applies(t, 1.5) and not stats.hard_limit_applies(dict_replace(t, spread=0.2), 1.5)
    assert not stats.hard_limit_applies(dict_replace(t, spread=None, df=None), 1.5)


def dict_replace(t, **kw):
    from dataclasses import replace

    return replace(t, **kw)


# ------------------------------------------------------------ the run's speed: uniform slowdowns
def _uniform(rng, slowdown: float, n_bench: int = 20, n_hist: int = 8, common: float = 0.15) -> bool:
    kw = dict(between=0.03, within=0.01, common=common)
    runs = _simulated_runs(rng, n_hist, n_bench, **kw)
    run = _simulated_runs(rng, 1, n_bench, slow=dict.fromkeys(range(n_bench), slowdown) if slowdown else None, **kw)[0]
    return any(d.status == "regression" for d in gate.gate(run, runs[-1], history=runs))


def test_a_uniform_2x_slowdown_is_caught_at_machine_speed_spread_015():
    """The synthetic check: 20 benchmarks, 8 history entries, machine-speed sd 0.15 (the spread of
    whole runs measured on the calibration machine: 0.09-0.21), 100 runs each."""
    rng = np.random.default_rng(22)
    caught = sum(_uniform(rng, 1.0) for _ in range(100))
    false_alarms = sum(_uniform(rng, 0.0) for _ in range(100))
    assert caught >= 95, caught
    assert false_alarms <= 10, false_alarms  # alpha 0.05 plus Monte-Carlo slack


def test_the_run_speed_row_holds_half_of_alpha_without_the_hard_limit():
    """Without the hard limit the run-speed row alone still catches most uniform 2x slowdowns:
    it is not one of 21 equal rows of Holm's family (each benchmark's own row, relative to the
    run's speed, cancels a uniform shift)."""
    def caught(share):
        rng = np.random.default_rng(33)
        hits = 0
        for _ in range(60):
            kw = dict(between=0.03, within=0.01, common=0.15)
            runs = _simulated_runs(rng, 8, 20, **kw)
            run = _simulated_runs(rng, 1, 20, slow=dict.fromkeys(range(20), 1.0), **kw)[0]
            ds = {d.name: d for d in gate.gate(run, runs[-1], history=runs, hard_limit=None, speed_share=share)}
            hits += ds[gate.RUN_SPEED].status == "regression"
        return hits

    weighted, equal = caught(gate.RUN_SPEED_SHARE), caught(1 / 21)
    assert weighted >= 54 and equal < weighted, (weighted, equal)


def test_weighted_holm_gives_each_hypothesis_its_share_of_alpha():
    # equal weights: the plain method
    assert stats.holm([0.01, 0.04, 0.03], [1, 1, 1]).tolist() == pytest.approx(stats.holm([0.01, 0.04, 0.03]).tolist())
    # weight 2 of 4 on the first: p * 4 / 2 at the first step, then the rest share the remainder
    adj = stats.holm([0.02, 0.01, 0.5], [2, 1, 1])
    assert adj.tolist() == pytest.approx([0.04, 0.04, 0.5])
    with pytest.raises(ValueError, match="weights"):
        stats.holm([0.1, 0.2], [1, 0])


# --------------------------------------------------------- series keyed by device and settings
def test_series_key_holds_the_device_count_and_the_pinned_settings():
    fp = {"device": "cpu", "cpu": "AMD EPYC", "cpu_count": 2}
    pinned = settings.bench_settings("cpu")
    key = env.series_key(fp, pinned)
    assert key.startswith("cpu-amd-epyc-2cores-pinned-") and key != env.series_key(fp)
    assert env.series_key(dict(fp, cpu_count=4), pinned) != key
    assert env.series_key(fp, settings.bench_settings("cpu", "wall")) != key
    assert env.series_key(fp, dict(pinned, pytest_args=["x"])) == key  # how pytest is called is not the setting
    gpu = {"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3", "gpu_count": 1, "cpu": "AMD EPYC", "cpu_count": 2}
    assert env.series_key(gpu, settings.bench_settings("cuda")).startswith("gpu-nvidia-h100-80gb-hbm3-1gpu-pinned-")
    # a new entry never lands in the committed folder, which stays readable with its own key
    assert history.make_entry(fp, [], settings=pinned)["series"] != COMMITTED.name
    assert {history.load(p)["series"] for p in COMMITTED_ENTRIES} == {COMMITTED.name}


def test_a_baseline_of_another_device_is_an_error_naming_both(tmp_path):
    """A GPU entry against the committed CPU folder, and the same CPU model with 4 cores."""
    doc = json.loads(COMMITTED_ENTRIES[-1].read_text())
    gpu = dict(doc, fingerprint=dict(doc["fingerprint"], device="cuda", gpu="NVIDIA H100 80GB HBM3", gpu_count=1))
    gpu["series"] = env.series_key(gpu["fingerprint"], settings.bench_settings("cuda"))
    proc = _gate(_write(tmp_path / "gpu.json", gpu), "--baseline", COMMITTED)
    assert proc.returncode == stats.EXIT_INPUT
    line = _one_error_line(proc)
    assert "gpu NVIDIA H100 80GB HBM3 (1 GPU)" in line and "cpu AMD EPYC (2 cores)" in line, line
    four = dict(doc, fingerprint=dict(doc["fingerprint"], cpu_count=4))
    four["series"] = env.series_key(four["fingerprint"], settings.bench_settings("cpu"))
    path = _write(tmp_path / "four.json", four)
    proc = _gate(path, "--baseline", COMMITTED)
    assert proc.returncode == stats.EXIT_INPUT and "(4 cores)" in _one_error_line(proc)
    # without --baseline its own series is looked up: not the committed entries
    proc = _gate(path, "--history", ROOT / "history")
    assert proc.returncode == stats.EXIT_INPUT and "no baseline" in _one_error_line(proc)
    assert four["series"] in _one_error_line(proc)
