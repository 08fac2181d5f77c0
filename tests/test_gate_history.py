"""The gate reads the history where ``inference-conformance run`` writes it, never compares a run
with itself, and does not cry wolf on unchanged code: a benchmark of one round or below its
timer's resolution is never gated, the hard limit needs a measured spread, and each mode states
its measured false-alarm rate. Fabricated JSON files only (no benchmark runs)."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from inference_conformance.perf import gate, gate_modes, history, records, settings, stats

DEVICE = {"kind": "cpu", "model": "Gate Test CPU", "count": 2, "torch": "2.11.0", "python": "3.11.7"}
FP = {"device": "cpu", "cpu": "Gate Test CPU", "cpu_count": 2, "gpu": None}


def _bench_json(medians: dict[str, float], rounds: int = 20, seed: float = 1.0) -> dict:
    """A pytest-benchmark JSON as the suite's benchmarks write it (pinned settings recorded)."""
    pinned = settings.pinned_env("cpu")
    benches = []
    for i, (name, m) in enumerate(medians.items()):
        data = [m * (1 + 0.002 * seed * ((k * 7 + i) % 5 - 2)) for k in range(rounds)]
        benches.append({"name": name, "fullname": f"benchmarks/bench_x.py::{name}", "extra_info": {},
                        "stats": {"median": sorted(data)[len(data) // 2], "rounds": rounds, "iterations": 1,
                                  "data": data}})
    return {"benchmarks": benches, "settings": {"timer": "process_time", "threads": 1, "pinned": True,
                                                "env": pinned, "device": DEVICE}}


def _store(folder: Path, doc: dict, date: str, out: Path | None = None) -> tuple[Path, Path]:
    """What ``inference-conformance run`` does with a run: its history entry in the series folder
    and, with ``out``, its run folder's benchmarks.json and manifest naming the entry."""
    fp = dict(FP, date=date, commit="a" * 40, dirty=False)
    entry = history.make_entry(fp, records.records(doc), settings=dict(settings.bench_settings("cpu"), passes=1))
    path = history.append(entry, folder)
    bench = None
    if out is not None:
        run = out / "runs" / date.replace(":", "")
        run.mkdir(parents=True)
        bench = run / "benchmarks.json"
        bench.write_text(json.dumps(doc))
        (run / "manifest.json").write_text(json.dumps({"history_entry": str(path)}))
    return path, bench


def _gate(*args, cwd: Path, env: dict | None = None) -> SimpleNamespace:
    """The command in this process (no interpreter start-up): its exit status and output."""
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        mp.delenv(history.HISTORY_ENV, raising=False)
        for k, v in (env or {}).items():
            mp.setenv(k, v)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = gate.main([str(a) for a in args])
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


MEDIANS = {f"t{j}": 1e-3 * (j + 1) for j in range(5)}


# ------------------------------------------------------------------ 1. where the history is
def test_the_gate_reads_the_history_where_run_writes_it(tmp_path, monkeypatch):
    """run and gate share one default (history.default_folder): the configured folder, else the
    checkout's history/, else ./inference-conformance-out/history, never the installed package."""
    from inference_conformance.reports import publish

    assert history.OUT_NAME == publish.OUT_NAME
    assert history.default_folder({history.HISTORY_ENV: str(tmp_path / "h")}) == tmp_path / "h"
    monkeypatch.setattr(history, "ROOT", tmp_path / "site-packages" / "inference_conformance")
    monkeypatch.chdir(tmp_path)
    assert history.default_folder({}) == tmp_path / "inference-conformance-out" / "history"
    # the command: a benchmarks.json judged against the configured history's series, found by its settings
    h = tmp_path / "hist"
    for d in range(1, 3):
        _store(h, _bench_json(MEDIANS, seed=d), f"2026-01-0{d}T00:00:00Z")
    run = tmp_path / "benchmarks.json"
    run.write_text(json.dumps(_bench_json(MEDIANS, seed=3)))
    proc = _gate(run, cwd=tmp_path, env={history.HISTORY_ENV: str(h)})
    assert proc.returncode == stats.EXIT_PASS, proc.stdout + proc.stderr
    assert "vs baseline" in proc.stdout and "20260102T000000" in proc.stdout and "differs" not in proc.stdout


def test_no_baseline_names_the_folder_and_never_offers_to_skip_the_comparison(tmp_path):
    run = tmp_path / "benchmarks.json"
    run.write_text(json.dumps(_bench_json(MEDIANS)))
    proc = _gate(run, cwd=tmp_path, env={history.HISTORY_ENV: str(tmp_path / "empty")})
    assert proc.returncode == stats.EXIT_INPUT
    err = proc.stderr
    assert "no baseline" in err and str(tmp_path / "empty") in err and history.HISTORY_ENV in err
    assert "--allow-new-series" not in err and "Traceback" not in err


def test_an_entry_is_judged_against_its_own_series_folder(tmp_path):
    """An entry of a series folder outside the default history (a project's own) needs no --history."""
    h = tmp_path / "elsewhere"
    paths = [_store(h, _bench_json(MEDIANS, seed=d), f"2026-01-0{d}T00:00:00Z")[0] for d in range(1, 4)]
    proc = _gate(paths[-1], cwd=tmp_path)
    assert proc.returncode == stats.EXIT_PASS, proc.stdout + proc.stderr
    assert paths[1].name in proc.stdout.split("vs baseline")[1].splitlines()[0]


# ------------------------------------------------------------------ 2. never its own baseline
def test_a_run_is_never_its_own_baseline(tmp_path):
    """After a normal run the series' newest entry is that run: the gate leaves it out (by the
    run folder's manifest, or by its measurements alone), names the entry it compared against,
    and refuses the run itself as an explicit baseline."""
    h, out = tmp_path / "history", tmp_path / "out"
    first, _ = _store(h, _bench_json(MEDIANS, seed=1), "2026-01-01T00:00:00Z", out)
    own, bench = _store(h, _bench_json(MEDIANS, seed=2), "2026-01-02T00:00:00Z", out)
    proc = _gate(bench, "--baseline", own.parent, cwd=tmp_path)
    assert proc.returncode == stats.EXIT_PASS, proc.stdout + proc.stderr
    header = proc.stdout.split("vs baseline")[1].splitlines()[0]
    assert first.name in header and own.name not in header
    assert f"{own} is this run itself" in proc.stdout and "differs" not in proc.stdout + proc.stderr
    # no manifest: the same measurements identify it
    (bench.parent / "manifest.json").unlink()
    proc = _gate(bench, "--baseline", own.parent, cwd=tmp_path)
    assert proc.returncode == stats.EXIT_PASS and first.name in proc.stdout.split("vs baseline")[1].splitlines()[0]
    proc = _gate(bench, "--baseline", own, cwd=tmp_path)
    assert proc.returncode == stats.EXIT_INPUT and "this is the run itself" in proc.stderr
    first.unlink()  # only the run itself left: no baseline, said so
    proc = _gate(bench, "--baseline", own.parent, cwd=tmp_path)
    assert proc.returncode == stats.EXIT_INPUT and "other than the run itself" in proc.stderr


# ------------------------------------------------------------------ 7. no wolf on unchanged code
def _entry(medians: dict[str, float], rounds: dict[str, int] | None = None) -> dict:
    return {"benchmarks": [{"fullname": n, "stats": {"median": m, "rounds": (rounds or {}).get(n, 20)},
                            "data": [m] * (rounds or {}).get(n, 20)} for n, m in medians.items()]}


def test_one_round_or_below_the_timer_resolution_is_never_gated():
    hist = [_entry({"a": 1e-3, "b": 2e-3, "c": 3e-3, "d": 4e-3, "one": 5e-6, "tiny": 1e-7},
                   {"one": 1}) for _ in range(5)]
    for h, k in zip(hist, range(5)):
        for r in h["benchmarks"]:
            r["stats"]["median"] *= 1 + 0.01 * (k % 3)
    run = _entry({"a": 1e-3, "b": 2e-3, "c": 3e-3, "d": 4e-3, "one": 9e-6, "tiny": 5e-7}, {"one": 1})
    ds = {d.name: d for d in gate.gate(run, hist[-1], history=hist, timer="process_time")}
    assert ds["one"].status == "ungated" and "one timed round" in ds["one"].reason
    assert ds["tiny"].status == "ungated" and "ticks of the timer process_time" in ds["tiny"].reason
    assert all(ds[n].status != "ungated" for n in "abcd")
    assert stats.exit_code(list(ds.values()), strict=True) in (stats.EXIT_PASS, stats.EXIT_INCONCLUSIVE)
    assert stats.exit_code([ds["one"], ds["tiny"]], strict=True) == stats.EXIT_PASS


def test_the_reported_unchanged_runs_pass_each_against_the_one_before(tmp_path):
    """The report's four runs of one commit: torch decode at 0.83, 2.29, 1.62, 1.03 ms and a
    one-round benchmark of a few microseconds; each gated against the one before (defaults)."""
    decode = [0.83e-3, 2.29e-3, 1.62e-3, 1.03e-3]
    tpc = [4e-6, 7e-6, 4.2e-6, 7.5e-6]
    files = []
    for i, (d, t) in enumerate(zip(decode, tpc)):
        doc = _bench_json({"decode": d, "prefill": 2e-3 * (1 + 0.05 * i)}, seed=i + 1)
        doc["benchmarks"].append({"name": "tpc", "fullname": "benchmarks/bench_x.py::tpc",
                                  "stats": {"median": t, "rounds": 1, "data": [t]}})
        files.append(tmp_path / f"run{i}.json")
        files[-1].write_text(json.dumps(doc))
    for a, b in zip(files, files[1:]):
        proc = _gate(b, "--baseline", a, cwd=tmp_path)
        assert proc.returncode == stats.EXIT_PASS, proc.stdout + proc.stderr
        assert "REGRESSION" not in proc.stdout and "UNGATED" in proc.stdout and "mode: one baseline" in proc.stdout


def test_each_mode_states_its_measured_false_alarm_rate():
    """The committed calibration measures every mode; the CI recipe's history mode (5 passes per
    run) and the A/B mode stay within 5%, and the gate says so or warns."""
    for key in ("history", "history_5_passes", "one_baseline"):
        assert gate_modes.measured_rate(key, 20) is not None, key
    assert gate_modes.measured_rate("history_5_passes", 20)["rate"] <= gate_modes.CI_RATE
    assert gate_modes.measured_rate("one_baseline", 20)["hits"] == 0
    five = "\n".join(gate_modes.statement("history_5_passes", "history, 5 passes per run", 20))
    assert "false alarms on unchanged code" in five and "WARNING" not in five
    one = gate_modes.measured_rate("history", 20)
    text = "\n".join(gate_modes.statement("history", "history, 1 pass per run", 20))
    assert (one["rate"] > gate_modes.CI_RATE) == ("WARNING" in text) and "--bench-passes 5" in text * (one["rate"] > 0.05)
    ab = gate_modes.statement("ab", "interleaved A/B, 10 lockstep pairs", 10, prog="ab")
    assert len(ab) == 1 and ab[0].startswith("ab: mode:") and "0/24 sessions = 0%" in ab[0]
    missing = gate_modes.statement("history_9_passes", "history, 9 passes", 20)
    assert "not measured" in missing[0]
