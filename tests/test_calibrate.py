"""The A/A calibration, the interleaved A/B mode and the injected slowdown, on synthetic passes:
the paired rule catches a consistent 15% slowdown and passes unchanged code, the analysis counts
false alarms and detections with exact binomial intervals, the injection slows a call by the
stated fraction and stays off unless asked for."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from inference_conformance.perf import ab, calibrate, calibration_analysis, inject, stats

NAMES = [f"benchmarks/bench_x.py::t{j}" for j in range(4)]


def _passes(rng, pairs: int, slow: dict | None = None, between: float = 0.03, start: float = 0.0) -> list[dict]:
    """Interleaved passes: each pair shares a machine-state factor (per benchmark); side B is
    slower by ``slow[j]`` on benchmark j."""
    out = []
    for i in range(pairs):
        state = rng.normal(0, 0.2, len(NAMES))  # large drift between pairs, shared by the pair
        for side in ("a", "b") if i % 2 == 0 else ("b", "a"):
            meds = {}
            for j, n in enumerate(NAMES):
                m = 1e-3 * np.exp(state[j] + rng.normal(0, between))
                if side == "b":
                    m *= 1 + (slow or {}).get(j, 0.0)
                meds[n] = m
            out.append({"side": side, "pair": i, "start": start + len(out), "seconds": 1.0, "ceilings": None,
                        "records": [{"fullname": n, "stats": {"median": m}, "data": [m] * 5} for n, m in meds.items()]})
    return out


def test_paired_log_ratios_pair_the_two_sides_of_each_pair():
    ps = [{"side": "a", "pair": 0, "records": [{"fullname": "x", "stats": {"median": 1.0}}]},
          {"side": "b", "pair": 0, "records": [{"fullname": "x", "stats": {"median": 2.0}}]},
          {"side": "b", "pair": 1, "records": [{"fullname": "x", "stats": {"median": 3.0}}]},
          {"side": "a", "pair": 1, "records": [{"fullname": "x", "stats": {"median": 3.0}},
                                                {"fullname": "only_a", "stats": {"median": 1.0}}]}]
    assert ab.paired_log_ratios(ps) == {"x": pytest.approx([np.log(2.0), 0.0])}


def test_ab_catches_a_consistent_15_percent_slowdown_despite_drift_between_pairs():
    rng = np.random.default_rng(3)
    decisions = {d.name: d for d in ab.decide(_passes(rng, 5, slow={1: 0.15}, between=0.02))}
    assert decisions[NAMES[1]].status == "regression" and decisions[NAMES[1]].basis == "pairs"
    assert all(decisions[n].status != "regression" for n in NAMES if n != NAMES[1])


def test_ab_false_alarm_and_power_on_simulated_sessions():
    """Between-pair drift 20% (shared by both sides), 2% noise within a pair: the paired rule's
    run-level false-alarm rate stays near alpha and it catches 15% nearly always."""
    rng = np.random.default_rng(4)
    fa = sum(any(d.status == "regression" for d in ab.decide(_passes(rng, 5, between=0.02))) for _ in range(200))
    power = sum({d.name: d.status for d in ab.decide(_passes(rng, 5, slow={0: 0.15}, between=0.02))}[NAMES[0]]
                == "regression" for _ in range(100))
    assert fa / 200 <= 0.08 and power / 100 >= 0.9


def test_ab_needs_two_pairs():
    with pytest.raises(ValueError, match="at least 2"):
        ab.decide(_passes(np.random.default_rng(0), 1))


def test_resolve_checkout_takes_a_folder_and_rejects_an_unknown_revision(tmp_path):
    assert ab.resolve_checkout(str(tmp_path), tmp_path, "a") == (tmp_path.resolve(), False)
    with pytest.raises(ValueError, match="neither a folder nor a git revision"):
        ab.resolve_checkout("no-such-revision-xyz", tmp_path, "b")
    with pytest.raises(ValueError, match="timer"):
        ab.timer_args("sundial")


def test_resolve_checkout_makes_and_removes_a_worktree(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "f.txt").write_text("one")
    subprocess.run(git + ["add", "f.txt"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "one"], check=True)
    path, created = ab.resolve_checkout("HEAD", tmp_path, "a", repo=repo)
    assert created and (path / "f.txt").read_text() == "one"
    ab.remove_checkout(path, repo=repo)
    assert not path.exists()


def test_inject_parses_its_variable_and_rejects_bad_items():
    assert inject.parse("a[1]=0.15, b=0.3") == [("a[1]", 0.15), ("b", 0.3)]
    assert inject.parse(None) == [] and inject.parse("") == []
    assert inject.fraction_for("x::a[1]", inject.parse("a[1]=0.15")) == 0.15
    assert inject.fraction_for("x::c", inject.parse("a[1]=0.15")) == 0.0
    for bad, msg in (("a", "PATTERN=FRACTION"), ("=0.1", "PATTERN=FRACTION"), ("a=x", "number"), ("a=-1", r"\(0, 10\]")):
        with pytest.raises(ValueError, match=msg):
            inject.parse(bad)


def test_injected_slowdown_is_proportional_to_the_call():
    def work():
        return sum(range(20000))

    # this thread's CPU time (a process clock also counts the worker's other threads, torch's
    # pool among them), the plain and the slowed call alternating so that drift hits both alike
    slowed = inject.slowed(work, 1.0, time.thread_time)
    plain_ts, slowed_ts = [], []
    for _ in range(31):
        for fn, ts in ((work, plain_ts), (slowed, slowed_ts)):
            t0 = time.thread_time()
            fn()
            ts.append(time.thread_time() - t0)
    ratio = float(np.median(slowed_ts)) / float(np.median(plain_ts))
    assert 1.6 < ratio < 2.5  # +100% asked


def test_rate_gives_clopper_pearson_intervals():
    r = stats.binomial_rate(0, 10)
    assert r["rate"] == 0 and r["ci95"][0] == 0 and r["ci95"][1] == pytest.approx(0.3085, abs=1e-3)
    r = stats.binomial_rate(5, 10)
    assert r["ci95"] == pytest.approx([0.187, 0.813], abs=1e-3)
    assert stats.binomial_rate(0, 0)["rate"] is None


def _sessions(rng, n: int, pairs: int = 4, between: float = 0.02) -> list[dict]:
    out = []
    for s in range(n):
        kind = "aa" if s % 2 == 0 else "injected"
        ps = _passes(rng, pairs, slow={1: 0.3} if kind == "injected" else None, between=between, start=100.0 * s)
        out.append({"session": s, "kind": kind, "pairs": pairs, "k": "x", "targets": ["t1"], "threads": 1,
                    "timer": "cpu", "fraction": 0.3 if kind == "injected" else 0.0, "start": 100.0 * s,
                    "seconds": 8.0, "loadavg": [1.0, 1.0, 1.0],
                    "passes": [{"side": p["side"], "pair": p["pair"], "start": p["start"], "seconds": 1.0,
                                "ceilings": {"copy_bytes_per_s": 1e10, "matmul_flops_per_s": {"float32": 1e11}},
                                "benchmarks": calibrate._compact(p["records"])} for p in ps]})
    return out


def test_analyse_counts_false_alarms_and_detections_per_mode():
    rng = np.random.default_rng(5)
    res = calibration_analysis.analyse(_sessions(rng, 8), window=5, resample_draws=200)
    ab_mode, hist = res["modes"]["ab"], res["modes"]["history"]
    rs = res["modes"]["ab_resampled"]  # synthetic sessions drawn from all pairs: many more decisions
    assert rs["false_alarm"]["n"] == 200 and rs["power"]["t1"]["rate"] >= 0.9 and rs["false_alarm"]["ci95"] is None
    assert ab_mode["false_alarm"]["n"] == 4 and ab_mode["power"]["t1"]["n"] == 4
    assert ab_mode["power"]["t1"]["hits"] == 4  # +30% with 2% noise in a pair: always caught
    assert hist["power"]["t1"]["n"] > 0 and hist["false_alarm"]["n"] > 0
    # history mode sees the 20% drift between pairs: the +30% is not always separable from it
    assert res["noise"][NAMES[0]]["sd_ln_median"] > res["noise"][NAMES[0]]["sd_paired_log_ratio"] / 2
    assert res["sensitivity"] and "calibration (cpu timer)" in calibrate.summary_text(res)
    eff = res["injected_effect"]
    assert eff["t1"]["mean_ln_ratio"] == pytest.approx(np.log(1.3), abs=0.03)
    assert abs(eff["control"]["mean_ln_ratio"]) < 0.03 and eff["control"]["pairs"] == 3 * eff["t1"]["pairs"]
    assert res["detectable"][NAMES[0]]["ab_90pct"] > 0.10
    assert res["ceilings_missing"] == 0 and "WARNING" not in calibrate.summary_text(res)
    broken = _sessions(rng, 2)
    broken[0]["passes"][0]["ceilings"] = {"error": "ModuleNotFoundError: x"}
    res = calibration_analysis.analyse(broken, window=2, resample_draws=10)
    assert res["ceilings_missing"] == 1 and "1 of 16 passes have no ceilings (ModuleNotFoundError: x)" in \
        calibrate.summary_text(res)
    with pytest.raises(ValueError, match="no sessions"):
        calibration_analysis.analyse([])


def test_report_shows_the_committed_calibration(tmp_path):
    """``analyse`` stores the table the report shows in its result JSON; the report reads that
    file as data (no import of the calibration)."""
    import json

    from inference_conformance.reports import build

    res = calibration_analysis.analyse(_sessions(np.random.default_rng(6), 4), window=3)
    doc = {"machine": {"cpu": "Test CPU", "cores": 2}, "calibrations": [res]}
    doc["report"] = calibrate.report_table(doc)
    path = tmp_path / "gate_calibration.json"
    path.write_text(json.dumps(doc))
    table = build.gate_calibration(path)
    assert {r["mode"] for r in table["rows"]} == set(calibration_analysis.MODE_LABELS.values())
    assert table["targets"] == ["t1"] and "A/A" not in table["rows"][0]["false_alarm"]
    assert table["file"] == str(path)
    ctx = build.context([], [], fp=None)
    ctx["gate_calibration"] = table
    build.render(ctx, tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    html = (tmp_path / "out" / "index.html").read_text()
    assert "| cpu | sequential passes | interleaved A/B | 0/2 = 0%" in md
    assert "gate-calibration" in html and "Test CPU" in html
    assert build.gate_calibration(tmp_path / "absent.json") is None
    path.write_text(json.dumps({"calibrations": [res]}))  # written before the report part existed
    assert build.gate_calibration(path) is None


def test_committed_calibration_carries_its_report_table():
    """The committed result's report part is what ``analyse`` would store for its calibrations."""
    import json

    doc = json.loads(calibrate.RESULT.read_text())
    assert doc["report"] == calibrate.report_table(doc)


def test_detectable_slowdown_and_pairs_needed_agree():
    """The pairs the A/B mode needs for a slowdown are the fewest whose detectable slowdown is at
    most that slowdown; more noise, a smaller alpha or fewer degrees of freedom detect less."""
    kw = dict(alpha=0.05 / 4, threshold=0.10)
    k = stats.pairs_needed(0.05, 0.15, **kw)
    assert k is not None and k > 3
    assert stats.detectable_slowdown(0.05 / np.sqrt(k), df=k - 1, **kw) <= 0.15 + 1e-12
    assert stats.detectable_slowdown(0.05 / np.sqrt(k - 1), df=k - 2, **kw) > 0.15
    assert stats.detectable_slowdown(0.02, df=9, **kw) < stats.detectable_slowdown(0.04, df=9, **kw)
    assert stats.detectable_slowdown(0.08, df=9, alpha=0.05, threshold=0.10) < stats.detectable_slowdown(0.08, df=9, **kw)
    assert stats.detectable_slowdown(0.08, df=4, **kw) > stats.detectable_slowdown(0.08, df=9, **kw)
    assert stats.detectable_slowdown(0.001, df=50, **kw) == pytest.approx(0.10, abs=0.01)  # the threshold binds
    assert stats.pairs_needed(1.0, 0.15, **kw) > 500 and stats.pairs_needed(1.0, 0.15, max_pairs=100, **kw) is None


def test_ab_command_rejects_too_few_pairs_and_unknown_revisions(capsys):
    with pytest.raises(SystemExit):
        ab.main(["--a", ".", "--b", ".", "--pairs", "2"])
    assert ab.main(["--a", "no-such-revision-xyz", "--b", "."]) == 2
    assert "neither a folder nor a git revision" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ab.main(["--a", ".", "--b", ".", "--python-b", "/no/such/python"])
    assert "--python-b" in capsys.readouterr().err


def test_each_side_can_run_its_own_interpreter(tmp_path):
    """Two virtual environments on one checkout (two installed versions of a package): each pass
    runs its side's interpreter."""
    cmd, env = ab.pass_command(tmp_path, tmp_path / "p.json", python="/venv-b/bin/python", k="decode")
    assert cmd[0] == "/venv-b/bin/python" and cmd[1:3] == ["-m", "pytest"] and "decode" in cmd
    assert ab.pass_command(tmp_path, tmp_path / "p.json")[0][0] == sys.executable
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path)


def test_merge_passes_takes_the_geometric_mean_of_the_pass_medians():
    from inference_conformance.perf.records import merge_passes

    p1 = [{"fullname": "x", "stats": {"median": 1.0, "rounds": 3}, "data": [1.0, 1.0, 1.0]},
          {"fullname": "only_first", "stats": {"median": 5.0}, "data": [5.0]}]
    p2 = [{"fullname": "x", "stats": {"median": 4.0, "rounds": 2}, "data": [4.0, 4.0]}]
    merged = {r["fullname"]: r for r in merge_passes([p1, p2])}
    assert merged["x"]["stats"]["median"] == pytest.approx(2.0) and merged["x"]["passes"] == [1.0, 4.0]
    assert merged["x"]["data"] == [1.0, 1.0, 1.0, 4.0, 4.0] and merged["only_first"]["stats"]["median"] == pytest.approx(5.0)


def test_runs_of_groups_clean_passes_in_time_and_injected_passes_by_session():
    def p(t, injected, session, med):
        return {"start": t, "injected": injected, "session": session, "benchmarks": {"x": {"median": med, "data": [med]}}}

    passes = [p(0, False, 0, 1.0), p(1, False, 0, 4.0), p(2, False, 1, 1.0), p(2, True, 1, 2.0),
              p(3, False, 1, 1.0), p(3, True, 1, 8.0)]
    runs = calibration_analysis.runs_of(passes, 2)
    assert [(r["injected"], r["benchmarks"]["x"]["median"]) for r in runs] == \
        [(False, pytest.approx(2.0)), (False, pytest.approx(1.0)), (True, pytest.approx(4.0))]
    assert calibration_analysis.runs_of(passes, 1) is passes


def test_ab_command_says_which_side_produced_nothing(monkeypatch, capsys):
    """A side whose pytest fails (wrong interpreter, broken checkout) is an error naming the side,
    not an empty verdict."""
    rec = [{"fullname": "x", "stats": {"median": 1.0}}]
    monkeypatch.setattr(ab, "session", lambda *a, **k: [
        {"side": s, "pair": i, "records": rec if s == "a" else [], "seconds": 1.0} for i in range(3) for s in "ab"])
    assert ab.main(["--a", ".", "--b", "."]) == 2
    assert "no benchmark results from side B (pair 1)" in capsys.readouterr().err


def test_history_mode_judges_a_run_only_against_earlier_sessions():
    """A CI series' entries come from other jobs: the passes of the run's own session (the same
    minute of the machine) are not its history."""
    def p(t, session, med):
        return {"start": t, "injected": False, "session": session,
                "benchmarks": {"x": {"median": med, "data": [med]}}}

    passes = [p(t, 0, 1.0 + 0.01 * t) for t in range(4)] + [p(4 + t, 1, 1.0 + 0.01 * t) for t in range(4)]
    res = calibration_analysis.history_mode(passes, ["x"], threshold=0.1, alpha=0.05, window=3)
    assert res["false_alarm"]["n"] == 4  # only session 1's passes, each against session 0's last 3
