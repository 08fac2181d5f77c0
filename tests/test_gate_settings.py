"""Benchmarks are comparable or refused: every benchmark JSON records how it was measured (timer,
threads, pinned environment, device), and the gate and the A/B mode refuse (exit 2, each
difference named) to compare runs measured differently, warn (stderr, exit unaffected) about
inputs not taken with the pinned settings, and read old entries as what they were. The inputs
are fabricated JSON files; one pytest process records a real benchmark's settings."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inference_conformance.perf import ab, gate, settings, settings_compare, stats
from inference_conformance.perf.env import ROOT
from inference_conformance.perf.settings_record import settings_now

COMMITTED = sorted((ROOT / "history" / "cpu-amd-epyc").glob("*.json"))
DEVICE = {"kind": "cpu", "model": "Settings Test CPU", "count": 2, "torch": "2.13.0", "triton": "3.9.0",
          "python": "3.11.7"}
PINNED = {"timer": "process_time", "threads": 1, "pinned": True, "env": dict(settings.pinned_env("cpu")),
          "device": DEVICE}


def _bench_json(path: Path, recorded: dict | None, median: float = 1e-3, seed: int = 0) -> Path:
    """A pytest-benchmark JSON of two benchmarks (40 rounds each) with ``recorded`` settings."""
    rng = np.random.default_rng(seed)
    doc = {"machine_info": {"cpu": {"brand_raw": DEVICE["model"], "count": 2}}, "benchmarks": [
        {"name": n, "fullname": f"benchmarks/bench_x.py::{n}", "options": {"timer": "perf_counter"},
         "stats": {"median": median * k, "data": [float(x) for x in median * k * rng.lognormal(0, 0.02, 40)]}}
        for k, n in ((1, "t1"), (2, "t2"))]}
    if recorded is not None:
        doc["settings"] = recorded
    path.write_text(json.dumps(doc))
    return path


def _gate(tmp_path, base: dict | None, new: dict | None, capsys) -> tuple[int, str, str]:
    """The gate's exit status, stderr and stdout for a run recorded with ``new`` against a baseline
    recorded with ``base`` (None: no settings recorded)."""
    b = _bench_json(tmp_path / "base.json", base, seed=1)
    n = _bench_json(tmp_path / "new.json", new, seed=2)
    code = gate.main([str(n), "--baseline", str(b)])
    captured = capsys.readouterr()
    return code, captured.err, captured.out


def test_runs_with_the_same_settings_are_compared(tmp_path, capsys):
    code, err, _ = _gate(tmp_path, PINNED, dict(PINNED), capsys)
    assert code == stats.EXIT_PASS, err
    assert "differs" not in err and "warning" not in err


@pytest.mark.parametrize("field, value, says", [
    ("timer", "cuda_event", "timer differs: base process_time, new cuda_event"),
    ("threads", 2, "threads differs: base 1, new 2"),
    ("pinned", False, "pinned differs: base true, new false"),
])
def test_each_differing_setting_is_refused_and_named(tmp_path, capsys, field, value, says):
    code, err, _ = _gate(tmp_path, PINNED, dict(PINNED, **{field: value}), capsys)
    assert code == stats.EXIT_INPUT
    assert says in err and "not comparable" in err
    assert [f for f in settings_compare.COMPARED if f"{f} differs" in err] == [field]


def test_several_differences_are_all_named(tmp_path, capsys):
    code, err, _ = _gate(tmp_path, PINNED, dict(PINNED, timer="perf_counter", threads=2, pinned=False), capsys)
    assert code == stats.EXIT_INPUT
    assert all(f"{f} differs" in err for f in ("timer", "threads", "pinned"))


def test_unpinned_inputs_warn_without_changing_the_exit_status(tmp_path, capsys):
    plain = dict(PINNED, timer="perf_counter", threads=2, pinned=False, env={})
    code, err, _ = _gate(tmp_path, plain, dict(plain), capsys)
    assert code == stats.EXIT_PASS
    warnings = [ln for ln in err.splitlines() if "not taken with the pinned benchmark settings" in ln]
    assert len(warnings) == 2 and "the run" in warnings[0] and "the baseline" in warnings[1]


def test_a_library_version_change_is_noted_not_refused(tmp_path, capsys):
    newer = dict(PINNED, device=dict(DEVICE, torch="2.14.0"))
    code, err, out = _gate(tmp_path, PINNED, newer, capsys)
    assert code == stats.EXIT_PASS, err
    assert "library versions differ (torch base 2.13.0, new 2.14.0)" in out


def test_old_entries_are_read_as_what_they_were():
    assert COMMITTED, "the committed history entries are gone"
    for p in COMMITTED:
        doc = json.loads(p.read_text())
        assert "settings" not in doc
        s = settings_compare.measured(doc)
        assert (s["timer"], s["threads"], s["pinned"]) == ("perf_counter", 2, False)
    # a plain pytest-benchmark JSON: the timer its benchmarks' options name, unpinned
    plain = {"benchmarks": [{"options": {"timer": "time.process_time"}}]}
    assert settings_compare.measured(plain, {"cpu_count": 4})["timer"] == "process_time"
    # an entry of the report: its pinned settings, threads from OMP_NUM_THREADS
    report = {"fingerprint": {"device": "cpu", "cpu": "X", "cpu_count": 2},
              "settings": {k: v for k, v in settings.bench_settings("cpu").items() if k != "pytest_args"}}
    assert {k: settings_compare.measured(report)[k] for k in ("timer", "threads", "pinned")} == {
        "timer": "process_time", "threads": 1, "pinned": True}


def test_the_committed_history_still_gates_with_a_warning():
    proc = subprocess.run([sys.executable, "-m", "inference_conformance.perf.gate", str(COMMITTED[-1])],
                          capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == stats.EXIT_PASS, proc.stderr
    assert "not taken with the pinned benchmark settings (timer perf_counter, threads 2" in proc.stderr


def test_an_old_entry_against_a_pinned_run_is_refused(tmp_path, capsys):
    code, err, _ = _gate(tmp_path, None, PINNED, capsys)
    assert code == stats.EXIT_INPUT
    assert "timer differs: base perf_counter, new process_time" in err and "pinned differs" in err


def test_a_recorded_device_is_the_run_s_device(tmp_path):
    gpu = dict(PINNED, timer="perf_counter", device={"kind": "cuda", "model": "NVIDIA H200", "count": 1})
    run = gate.load_run(_bench_json(tmp_path / "gpu.json", gpu))
    assert run["fingerprint"]["device"] == "cuda" and run["fingerprint"]["gpu"] == "NVIDIA H200"
    assert run["series"].startswith("gpu-nvidia-h200")


def _passes(sa: dict | None, sb: dict | None, pairs: int = 3) -> list[dict]:
    recs = [{"fullname": "b::t1", "stats": {"median": 1e-3}}]
    return [{"side": side, "pair": i, "records": recs, "settings": s, "seconds": 1.0}
            for i in range(pairs) for side, s in (("a", sa), ("b", sb))]


def test_ab_refuses_sides_measured_differently(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(ab, "session", lambda *a, **kw: _passes(PINNED, dict(PINNED, timer="cuda_event")))
    assert ab.main(["--a", str(tmp_path), "--b", str(tmp_path), "--pairs", "3"]) == 2
    err = capsys.readouterr().err
    assert "timer differs: A process_time, B cuda_event" in err and err.count("differs") == 1


def test_ab_reads_a_pass_without_settings_as_what_it_applied_and_warns_when_unpinned():
    applied = {"timer": "cpu", "env": settings.pinned_env("cpu")}
    fp = {"device": "cpu", "cpu": DEVICE["model"], "cpu_count": 2}
    diffs, warns = settings_compare.check_passes(_passes(None, PINNED), applied, fp)
    assert diffs == [] and warns == []
    diffs, warns = settings_compare.check_passes(_passes(None, PINNED), {"timer": "cpu", "env": {}}, fp)
    assert "pinned differs: A false, B true" in diffs and warns and "side A" in warns[0]
    devices = settings_compare.check_passes(_passes(PINNED, dict(PINNED, device=dict(DEVICE, model="Other"))),
                                            applied, fp)[0]
    assert devices == ["device differs: A cpu Settings Test CPU x2, B cpu Other x2"]
    within = [dict(PINNED, threads=1 + (i == 2)) for i in range(3)]
    passes = [dict(p, settings=within[p["pair"]]) for p in _passes(None, None)]
    assert "threads differs: A pass 1 1, A pass 3 2" in settings_compare.check_passes(passes, applied, fp)[0]


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="timer"):
        settings_compare.timer_name(None)
    with pytest.raises(ValueError, match="device"):
        settings.is_pinned("tpu", {})
    assert settings_compare.timer_name("time.perf_counter") == "perf_counter" == settings_compare.timer_name("wall")


def test_the_recording_follows_the_environment():
    pinned = settings_now(environ=settings.pinned_env("cpu"))
    assert pinned["pinned"] and pinned["env"]["OMP_NUM_THREADS"] == "1"
    assert not settings_now(environ={})["pinned"]
    assert settings_now()["timer"] == "perf_counter"  # no pytest config: pytest-benchmark's default


def test_a_benchmark_json_records_its_settings(tmp_path):
    """A real pytest-benchmark run with the pinned environment and CPU timer records them."""
    (tmp_path / "test_b.py").write_text("def test_b(benchmark):\n    benchmark(sum, [1, 2])\n")
    out = tmp_path / "b.json"
    # without the xdist worker's variables: pytest-benchmark disables itself when it sees them
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT_TEST"))}
    env.update(PYTHONPATH=str(ROOT), **settings.pinned_env("cpu"))
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                    "inference_conformance.perf.settings_record", "--rootdir", str(tmp_path), f"--benchmark-json={out}",
                    "--benchmark-max-time=0.01", *settings.bench_settings("cpu")["pytest_args"], str(tmp_path / "test_b.py")],
                   env=env, cwd=tmp_path, check=True, capture_output=True, timeout=120)
    s = json.loads(out.read_text())["settings"]
    assert (s["timer"], s["threads"], s["pinned"], s["device"]["kind"]) == ("process_time", 1, True, "cpu")
    assert s["device"]["torch"] and s["device"]["model"]
