"""The regression gate's decision rule on synthetic samples: a clear 15% slowdown fails, a 2%
one passes, a too-noisy run warns, a clear improvement asks for a baseline update; and the
command compares a run with the latest entry of its device's series."""
from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

from inference_conformance.perf import gate, history, stats


def _samples(median: float, spread: float, n: int = 40, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return median * np.exp(rng.normal(0.0, spread, n))


BASE = _samples(1e-3, 0.02, seed=1)


def test_clear_15_percent_slowdown_fails():
    d = stats.compare(BASE, _samples(1.15e-3, 0.02, seed=2))
    assert d.status == "regression", d
    assert d.ratio == pytest.approx(1.15, rel=0.03) and d.p_slower < 0.01


def test_2_percent_slowdown_passes():
    d = stats.compare(BASE, _samples(1.02e-3, 0.02, seed=3))
    assert d.status == "ok", d


def test_too_noisy_run_warns_instead_of_deciding():
    d = stats.compare(BASE, _samples(1.15e-3, 0.6, seed=4))
    assert d.status == "noisy", d
    assert d.ci_high > 1.10


def test_few_rounds_beyond_threshold_cannot_be_significant():
    d = stats.compare(_samples(1e-3, 0.001, n=3, seed=5), _samples(1.3e-3, 0.001, n=3, seed=6))
    assert d.status == "noisy", d


def test_clear_improvement_asks_for_baseline_update():
    d = stats.compare(BASE, _samples(0.8e-3, 0.02, seed=7))
    assert d.status == "improvement" and "update the baseline" in d.reason


def test_threshold_and_alpha_are_configurable():
    run = _samples(1.15e-3, 0.02, seed=2)
    assert stats.compare(BASE, run, threshold=0.20).status == "ok"
    assert stats.compare(BASE, _samples(1.06e-3, 0.02, seed=8), threshold=0.03).status == "regression"


def test_rejects_empty_or_nonpositive_samples():
    with pytest.raises(ValueError, match="empty"):
        stats.compare([], [1.0])
    with pytest.raises(ValueError, match="positive"):
        stats.compare([1.0, 0.0], [1.0])


def _entry(date: str, commit: str, medians: dict[str, float], spread: float = 0.02) -> dict:
    fp = {"device": "cpu", "cpu": "Gate Test CPU", "gpu": None, "date": date, "commit": commit, "dirty": False}
    recs = []
    for i, (name, m) in enumerate(medians.items()):
        data = [float(x) for x in _samples(m, spread, seed=zlib.crc32(f"{date}{name}".encode()) % 1000 + i)]
        recs.append({"name": name, "fullname": f"benchmarks/bench_x.py::{name}", "technique": "x",
                     "extra_info": {}, "stats": {"median": float(np.median(data)), "rounds": len(data)},
                     "data": data})
    return history.make_entry(fp, recs, {"copy_bytes_per_s": 1e10})


def test_command_compares_with_latest_entry_of_the_series(tmp_path, capsys):
    h = tmp_path / "history"
    old = history.append(_entry("2026-01-01T00:00:00Z", "a" * 40, {"t1": 1e-3, "t2": 2e-3}), h)
    base = history.append(_entry("2026-01-02T00:00:00Z", "b" * 40, {"t1": 1e-3, "t2": 2e-3}), h)
    assert old.parent == base.parent and base.parent.name == "cpu-gate-test"
    ok = history.append(_entry("2026-01-03T00:00:00Z", "c" * 40, {"t1": 1.01e-3, "t2": 2e-3, "t3": 1e-3}), h)
    assert gate.main([str(ok), "--history", str(h)]) == stats.EXIT_PASS
    out = capsys.readouterr().out
    assert base.name in out and "NEW" in out
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps(_entry("2026-01-04T00:00:00Z", "d" * 40, {"t1": 1.6e-3, "t2": 2e-3})))
    # t3 of the latest entry is missing from the run: reported, and an input error unless allowed
    assert gate.main([str(slow), "--history", str(h), "--json", str(tmp_path / "d.json")]) == stats.EXIT_INPUT
    assert "t3" in capsys.readouterr().err
    assert gate.main([str(slow), "--history", str(h), "--allow-missing", "--json", str(tmp_path / "d.json")]) == 1
    decisions = {d["name"].split("::")[-1]: d["status"] for d in json.loads((tmp_path / "d.json").read_text())}
    # baseline: the latest entry; 3 earlier entries: the between-run model
    assert decisions == {"t1": "regression", "t2": "ok", "t3": "missing"}
    # an explicit baseline file: one entry up to it, so the rounds: inconclusive within the hard limit
    assert gate.main([str(slow), "--baseline", str(old), "--hard-limit", "2"]) == stats.EXIT_PASS
    assert gate.main([str(slow), "--baseline", str(old), "--hard-limit", "2", "--strict"]) == stats.EXIT_INCONCLUSIVE


def test_pytest_benchmark_json_is_accepted(tmp_path):
    data = [float(x) for x in _samples(1e-3, 0.02, seed=9)]
    doc = {"machine_info": {"cpu": {"brand_raw": "Gate Test CPU"}}, "commit_info": {"id": "e" * 40, "dirty": False},
           "benchmarks": [{"name": "t1", "fullname": "benchmarks/bench_x.py::t1", "group": None, "params": None,
                           "extra_info": {}, "stats": {"median": float(np.median(data)), "rounds": 40, "data": data}}]}
    p = tmp_path / "bench.json"
    p.write_text(json.dumps(doc))
    run = gate.load_run(p)
    assert run["benchmarks"][0]["data"] and run["fingerprint"]["commit"] == "e" * 40


def test_ceiling_drift_is_reported():
    run = {"ceilings": {"copy_bytes_per_s": 5e9, "matmul_flops_per_s": {"float32": 1e11}}}
    base = {"ceilings": {"copy_bytes_per_s": 1e10, "matmul_flops_per_s": {"float32": 1e11}}}
    drift = gate.ceiling_drift(run, base)
    assert drift["copy_bytes_per_s"] == pytest.approx(-0.5) and drift["matmul_flops_per_s[float32]"] == 0


def test_run_to_run_spread_of_the_history_widens_the_rule():
    def entry(median, seed):
        data = [float(x) for x in _samples(median, 0.01, seed=seed)]
        return {"benchmarks": [{"fullname": "b", "stats": {"median": float(np.median(data))}, "data": data}]}

    run = entry(1.15e-3, 1)
    stable = [entry(1e-3, 2), entry(1.01e-3, 3), entry(1e-3, 4)]
    jumpy = [entry(1.3e-3, 5), entry(0.9e-3, 6), entry(1e-3, 7)]
    assert gate.gate(run, stable[-1], history=stable)[0].status == "regression"
    d = gate.gate(run, jumpy[-1], history=jumpy)[0]
    assert d.status == "noisy" and "run-to-run spread" in d.reason
    # without history the rounds alone never call a +15% regression: inconclusive, see inference_conformance.perf.ab
    d = gate.gate(run, jumpy[-1])[0]
    assert d.status == "inconclusive" and d.basis == "rounds" and "inference-conformance ab" in d.reason


# ------------------------------------------------------------- between-run model, family-wise
def test_holm_adjusts_step_down_and_rejects_bad_pvalues():
    adj = stats.holm([0.01, 0.04, 0.03])
    assert adj.tolist() == pytest.approx([0.03, 0.06, 0.06])
    assert stats.holm([0.5]).tolist() == [0.5] and stats.holm([]).size == 0
    with pytest.raises(ValueError, match="p-values"):
        stats.holm([0.1, 1.5])


def _run_entry(medians: dict[str, float], n: int = 20, spread: float = 0.02, seed: int = 0) -> dict:
    recs = []
    for i, (name, m) in enumerate(medians.items()):
        data = [float(x) for x in _samples(m, spread, n=n, seed=seed * 1000 + i)]
        recs.append({"fullname": name, "stats": {"median": float(np.median(data))}, "data": data})
    return {"benchmarks": recs}


def test_between_run_model_needs_enough_history_else_falls_back_to_rounds():
    hist = [_run_entry({"b": 1e-3}, seed=s) for s in range(2)]
    d = gate.gate(_run_entry({"b": 1.2e-3}, seed=9), hist[-1], history=hist)[0]
    assert d.basis == "rounds"
    hist = [_run_entry({"b": 1e-3 * (1 + 0.01 * s)}, seed=s) for s in range(4)]
    d = gate.gate(_run_entry({"b": 1.2e-3}, seed=9), hist[-1], history=hist)[0]
    assert d.basis == "between-run" and d.status == "regression" and d.n_base == 4


def test_history_test_is_a_prediction_interval_on_log_medians():
    h = [1.0, 1.1, 0.9, 1.05, 0.95]
    t = stats.history_test(1.0, h, alpha=0.05)
    mu = np.mean(np.log(h))
    assert t.ratio == pytest.approx(np.exp(-mu)) and t.ci_low < 1 < t.ci_high
    assert t.p_slower == pytest.approx(1 - t.p_faster)
    # a run twice as slow as a history with 7% spread: far outside the prediction interval
    assert stats.history_test(2.0, h).p_slower < 1e-3
    with pytest.raises(ValueError, match="at least 2"):
        stats.history_test(1.0, [1.0])


def _simulated_runs(rng, n_runs: int, n_bench: int, between: float, within: float, slow: dict | None = None,
                    common: float = 0.0):
    """n_runs runs of n_bench benchmarks: each run shifts every benchmark by its own between-run
    factor and all of them by one ``common`` factor (the machine's speed in that run), and its 10
    rounds add within-run noise; ``slow``: benchmark index -> slowdown fraction."""
    runs = []
    for _ in range(n_runs):
        shift = rng.normal(0, between, n_bench) + rng.normal(0, common) if common else rng.normal(0, between, n_bench)
        recs = []
        for j in range(n_bench):
            m = 1e-3 * np.exp(shift[j]) * (1 + (slow or {}).get(j, 0.0))
            data = m * np.exp(rng.normal(0, within, 10))
            recs.append({"fullname": f"b{j}", "stats": {"median": float(np.median(data))}, "data": data.tolist()})
        runs.append({"benchmarks": recs})
    return runs


def test_family_wise_false_alarm_rate_is_controlled_where_the_rounds_rule_is_not():
    """27 benchmarks, 5% between-run noise, 1% within-run: the rounds rule (which sees only the
    1%) fails most unchanged runs; the between-run model with Holm stays near alpha."""
    rng = np.random.default_rng(0)
    trials, fa_model, fa_rounds = 100, 0, 0
    for i in range(trials):
        runs = _simulated_runs(rng, 11, 27, between=0.05, within=0.01)
        hist, run = runs[:10], runs[10]
        fa_model += any(d.status == "regression" for d in gate.gate(run, hist[-1], history=hist))
        if i < 20:  # the bootstrap of the rounds rule is the slow part
            base = {b["fullname"]: b["data"] for b in hist[-1]["benchmarks"]}
            tests = [stats.rounds_test(base[b["fullname"]], b["data"]) for b in run["benchmarks"]]
            fa_rounds += any(d.status == "regression" for d in stats.judge_family(
                [b["fullname"] for b in run["benchmarks"]], tests))
            # which is why the gate never calls a regression from the rounds (within the hard limit)
            assert not any(d.status == "regression" for d in gate.gate(run, hist[-1]))
    assert fa_rounds / 20 > 0.5
    assert fa_model / trials <= 0.10  # alpha 0.05 plus Monte-Carlo slack (100 trials)


def test_between_run_model_catches_a_15_percent_slowdown_on_a_quiet_machine():
    rng = np.random.default_rng(1)
    trials, caught = 100, 0
    for _ in range(trials):
        runs = _simulated_runs(rng, 11, 6, between=0.02, within=0.01, slow=None)
        slow = _simulated_runs(rng, 1, 6, between=0.02, within=0.01, slow={2: 0.15})[0]
        ds = {d.name: d.status for d in gate.gate(slow, runs[9], history=runs[:10])}
        caught += ds["b2"] == "regression"
    assert caught / trials >= 0.9


def test_rounds_fallback_warns_in_the_command_output(tmp_path, capsys):
    h = tmp_path / "history"
    history.append(_entry("2026-01-01T00:00:00Z", "a" * 40, {"t1": 1e-3}), h)
    run = history.append(_entry("2026-01-02T00:00:00Z", "b" * 40, {"t1": 1e-3}), h)
    assert gate.main([str(run), "--history", str(h)]) == stats.EXIT_PASS
    out = capsys.readouterr().out
    assert "INCONCLUSIVE" in out and "inference-conformance ab" in out


def test_runs_measured_differently_are_refused(tmp_path, capsys):
    """A history entry records how its benchmarks were measured; a run timed with another timer
    or environment than its baseline is refused (exit 2), each difference named."""
    from inference_conformance.perf import settings

    h = tmp_path / "history"
    e = _entry("2026-01-01T00:00:00Z", "a" * 40, {"t1": 1e-3})
    e["settings"] = {k: v for k, v in settings.bench_settings("cpu").items() if k != "pytest_args"}
    history.append(e, h)
    same = dict(e, fingerprint=dict(e["fingerprint"], date="2026-01-02T00:00:00Z", commit="b" * 40))
    p = history.append(same, h)
    assert gate.main([str(p), "--history", str(h)]) == stats.EXIT_PASS
    assert "measured differently" not in capsys.readouterr().err
    other = dict(same, fingerprint=dict(same["fingerprint"], date="2026-01-03T00:00:00Z", commit="c" * 40),
                 settings={k: v for k, v in settings.bench_settings("cpu", "wall", 0).items() if k != "pytest_args"})
    assert gate.main([str(history.append(other, h)), "--history", str(h)]) == stats.EXIT_INPUT
    err = capsys.readouterr().err
    assert "measured differently" in err and "timer differs: base process_time, new perf_counter" in err
    assert "pinned differs: base true, new false" in err


# ----------------------------------------------------------------- relative to the run's speed
def _caught(rng, trials: int, normalize: bool, slow: dict, **kw) -> tuple[float, float]:
    """Share of runs where benchmark b2 is a regression, and share where any row is."""
    caught = anything = 0
    for _ in range(trials):
        runs = _simulated_runs(rng, 10, 6, **kw)
        run = _simulated_runs(rng, 1, 6, slow=slow, **kw)[0]
        ds = {d.name: d.status for d in gate.gate(run, runs[-1], history=runs, normalize=normalize)}
        caught += ds.get("b2") == "regression"
        anything += "regression" in ds.values()
    return caught / trials, anything / trials


def test_run_speed_normalisation_cancels_the_shift_all_benchmarks_share():
    """8% machine-speed noise shared by the run's 6 benchmarks, 1.5% their own: the raw model
    misses most 15% slowdowns of one benchmark, the one relative to the run's speed catches them."""
    kw = dict(between=0.015, within=0.01, common=0.08)
    normed, _ = _caught(np.random.default_rng(3), 60, True, {2: 0.15}, **kw)
    raw, _ = _caught(np.random.default_rng(3), 60, False, {2: 0.15}, **kw)
    assert normed >= 0.9 and raw <= 0.5, (normed, raw)


def test_run_speed_normalisation_keeps_the_false_alarm_rate():
    _, fa = _caught(np.random.default_rng(4), 100, True, {}, between=0.015, within=0.01, common=0.08)
    assert fa <= 0.10  # alpha 0.05 plus Monte-Carlo slack (100 trials)


def test_a_change_that_slows_every_benchmark_fails_on_the_run_speed_row():
    rng = np.random.default_rng(5)
    runs = _simulated_runs(rng, 10, 6, between=0.01, within=0.01, common=0.01)
    run = _simulated_runs(rng, 1, 6, between=0.01, within=0.01, common=0.01, slow=dict.fromkeys(range(6), 0.3))[0]
    ds = {d.name: d for d in gate.gate(run, runs[-1], history=runs)}
    assert ds[gate.RUN_SPEED].status == "regression" and ds[gate.RUN_SPEED].ratio == pytest.approx(1.3, rel=0.05)
    assert "all 6 benchmarks shifted alike" in ds[gate.RUN_SPEED].reason
    assert all(ds[f"b{j}"].status != "regression" for j in range(6))
    raw = {d.name: d.status for d in gate.gate(run, runs[-1], history=runs, normalize=False)}
    assert gate.RUN_SPEED not in raw and all(raw[f"b{j}"] == "regression" for j in range(6))


def test_speed_test_predicts_each_benchmark_from_the_other_benchmarks_of_its_run():
    base = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}
    speeds = [1.0, 1.1, 0.9, 1.2, 0.95]  # the machine's speed in each history entry
    hist = [{n: m * s for n, m in base.items()} for s in speeds]
    run = {"a": 2.0, "b": 4.0, "c": 6.0, "d": 12.0}  # twice as slow a machine; d three times
    sp = stats.normalize_by_run_speed(run, hist)
    gmean = float(np.exp(np.mean(np.log(speeds))))
    assert sp.speed_run == pytest.approx(2.0 / gmean) and sp.speed_history == pytest.approx([s / gmean for s in speeds])
    d, a = stats.speed_test(sp, "d"), stats.speed_test(sp, "a")
    assert sp.fit("d")[1] == pytest.approx(1.0)  # every benchmark follows the machine: slope 1
    assert d.ratio == pytest.approx(1.5) and d.p_slower < 1e-6 and "slope 1.00" in d.detail
    assert a.ratio == pytest.approx(1.0)
    # too few benchmarks common to the run and every entry, or too few entries: no run speed
    assert stats.normalize_by_run_speed(run, hist + [{"a": 1.0, "b": 2.0, "c": 3.0}]) is None
    assert stats.normalize_by_run_speed(run, hist[:3]) is None


def test_command_judges_relative_to_the_run_speed_unless_told_not_to(tmp_path, capsys):
    """Four benchmarks in every one of 4 entries: the command judges each relative to the run's
    speed and prints the run-speed row; a run on a 25% slower machine fails there, not on each
    benchmark."""
    h = tmp_path / "history"
    names = {f"t{j}": 1e-3 * (j + 1) for j in range(4)}
    for day in range(1, 5):
        history.append(_entry(f"2026-01-0{day}T00:00:00Z", f"{day}" * 40,
                              {n: m * (1 + 0.01 * ((day * (j + 2)) % 3)) for j, (n, m) in enumerate(names.items())}), h)
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps(_entry("2026-01-09T00:00:00Z", "e" * 40, {n: m * 1.25 for n, m in names.items()})))
    assert gate.main([str(slow), "--history", str(h), "--json", str(tmp_path / "d.json")]) == 1
    out = capsys.readouterr().out
    assert "relative to the run's speed" in out and gate.RUN_SPEED in out
    decisions = {d["name"].split("::")[-1]: d["status"] for d in json.loads((tmp_path / "d.json").read_text())}
    # the run speed fails; each benchmark is not a regression (its prediction at a speed the
    # history never saw is wide: ok or noisy)
    assert decisions[gate.RUN_SPEED] == "regression" and all(decisions[n] in ("ok", "noisy") for n in names)
    assert gate.main([str(slow), "--history", str(h), "--no-normalize", "--json", str(tmp_path / "r.json")]) == 1
    raw = {d["name"].split("::")[-1]: d["status"] for d in json.loads((tmp_path / "r.json").read_text())}
    assert gate.RUN_SPEED not in raw and all(raw[n] == "regression" for n in names)


def test_a_change_that_slows_most_benchmarks_still_fails_the_gate():
    """4 of 6 benchmarks 30% slower: relative to the run's speed (the median of the others, now
    mostly slowed too) they look unchanged, but the run-speed row fails the run."""
    rng = np.random.default_rng(6)
    runs = _simulated_runs(rng, 10, 6, between=0.01, within=0.01, common=0.01)
    run = _simulated_runs(rng, 1, 6, between=0.01, within=0.01, common=0.01, slow=dict.fromkeys(range(4), 0.3))[0]
    ds = gate.gate(run, runs[-1], history=runs)
    assert stats.print_decisions(ds) == 1
    assert {d.name: d.status for d in ds}[gate.RUN_SPEED] == "regression"
