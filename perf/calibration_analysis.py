"""The analysis behind ``python -m inference_conformance.perf.calibrate analyse``: from the passes of A/A and
injected sessions (:func:`inference_conformance.perf.calibrate.collect`), the run-level false-alarm rate and the power
of each mode of the gate, with 95% Clopper-Pearson intervals, the between-run noise per benchmark
and the slowdown each mode catches with 90% power (see :mod:`inference_conformance.perf.calibrate`)."""
from __future__ import annotations

import time

import numpy as np

from inference_conformance.perf import ab, gate
from inference_conformance.perf.records import merge_passes
from inference_conformance.perf.stats import (DEFAULT_ALPHA, MIN_HISTORY, binomial_rate, detectable_slowdown, judge_family,
                        normalize_by_run_speed, pairs_needed, rounds_test)

#: Passes per history run the analysis also tries (``python -m inference_conformance.reports --bench-passes``).
HISTORY_PASSES = (3, 5)


def _history_key(m: int, normalize: bool) -> str:
    """The result key of history mode at ``m`` passes per run, normalised by the run's speed
    (the gate's default) or on raw medians."""
    return "history" + (f"_{m}_passes" if m > 1 else "") + ("" if normalize else "_raw")


#: A readable name of each mode the analysis measures, by its result key.
MODE_LABELS = {"ab": "interleaved A/B", "ab_resampled": "interleaved A/B, sessions resampled from all pairs",
               **{_history_key(m, norm): "history, {}{}".format(
                   "1 pass per run" if m == 1 else f"{m} passes per run",
                   ", relative to the run's speed" if norm else ", raw medians")
                  for m in (1,) + HISTORY_PASSES for norm in (True, False)},
               "one_baseline": "one baseline (fewer than 3 earlier entries: no verdict)",
               "rounds_only": "rounds only (former rule)"}
#: Fewer earlier entries than the window the false-alarm rate of the history modes is also
#: measured at (a young series): the gate quotes the nearest one not above its own count.
SHORT_WINDOWS = (3, 4, 8)


def _ab_passes(passes: list[dict], pairs: int | None = None) -> list[dict]:
    """A session's compact passes as :mod:`inference_conformance.perf.ab` reads them (side, pair, records with the
    medians); only the first ``pairs`` pairs when given."""
    return [{"side": p["side"], "pair": p["pair"],
             "records": [{"fullname": n, "stats": {"median": b["median"]}} for n, b in p["benchmarks"].items()]}
            for p in passes if pairs is None or p["pair"] < pairs]


def _entry(benchmarks: dict[str, dict]) -> dict:
    """A pass's compact benchmarks as a history-like entry the gate reads."""
    return {"benchmarks": [{"fullname": n, "stats": {"median": b["median"]}, "data": b["data"]}
                           for n, b in benchmarks.items()]}


def passes_in_order(sessions: list[dict]) -> list[dict]:
    """Every pass of every session, oldest first, with ``injected`` (the B side of an injected
    session), the session's kind and its index in ``sessions`` (unique across collect runs,
    whose own session numbers restart at 0)."""
    out = []
    for i, s in enumerate(sessions):
        for p in s["passes"]:
            out.append(dict(p, session=i, kind=s["kind"],
                            injected=s["kind"] == "injected" and p["side"] == "b"))
    return sorted(out, key=lambda p: p["start"])


def runs_of(passes: list[dict], m: int) -> list[dict]:
    """The passes merged into history runs of ``m`` passes each (a run that repeats its benchmark
    process ``m`` times, ``python -m inference_conformance.reports --bench-passes m``): per benchmark the geometric mean
    of the ``m`` medians (:func:`inference_conformance.perf.records.merge_passes`). Unchanged passes are grouped in
    time order, injected passes within their session; a run's time is its last pass's."""
    if m == 1:
        return passes
    clean = [p for p in passes if not p["injected"]]
    groups = [clean[i:i + m] for i in range(0, len(clean) - m + 1, m)]
    by_session: dict[int, list[dict]] = {}
    for p in passes:
        if p["injected"]:
            by_session.setdefault(p["session"], []).append(p)
    for ps in by_session.values():
        groups += [ps[i:i + m] for i in range(0, len(ps) - m + 1, m)]
    out = []
    for g in groups:
        merged = merge_passes([[{"fullname": n, "stats": {"median": b["median"]}, "data": b["data"]}
                                      for n, b in p["benchmarks"].items()] for p in g])
        out.append({"start": g[-1]["start"], "injected": g[0]["injected"], "session": g[0]["session"],
                    "benchmarks": {r["fullname"]: {"median": r["stats"]["median"], "data": r["data"]} for r in merged}})
    return sorted(out, key=lambda r: r["start"])


def rounds_rule(run: dict, base: dict, *, threshold: float, alpha: float) -> list:
    """The former rule the calibration keeps measuring: every benchmark of ``run`` judged from its
    rounds against the one ``base`` entry (:func:`inference_conformance.perf.stats.rounds_test`, Holm over the family,
    no hard limit). The gate itself no longer calls regressions this way (too few entries:
    inconclusive)."""
    base_by = {b["fullname"]: b for b in base["benchmarks"]}
    names, tests = [], []
    for b in run["benchmarks"]:
        ref = base_by.get(b["fullname"])
        if ref is not None:
            names.append(b["fullname"])
            tests.append(rounds_test(gate.samples(ref), gate.samples(b), alpha=alpha))
    return judge_family(names, tests, threshold=threshold, alpha=alpha)


def history_mode(passes: list[dict], targets: list[str], *, threshold: float, alpha: float, window: int,
                 rounds_only: bool = False, normalize: bool = True) -> dict:
    """Each pass (or run of passes, :func:`runs_of`) judged against the ``window`` unchanged ones
    before it from *earlier sessions* (between-run model, relative to each run's speed unless
    ``normalize`` is false), or, ``rounds_only``, against the one unchanged pass before it from an
    earlier session by the rounds (former rule). Earlier sessions only: a CI series' entries come
    from other jobs, minutes to days apart, not from the minute of the run (the passes of one
    session, and the two lockstep sides of a pair, share the machine's state of that minute)."""
    clean: list[dict] = []
    fa, n_fa = 0, 0
    caught = {t: 0 for t in targets}
    n_inj = 0
    false_in_injected = 0
    need = 1 if rounds_only else window
    for p in passes:
        pool = [q for q in clean if q["session"] != p["session"]]
        if len(pool) >= need:
            hist = [_entry(q["benchmarks"]) for q in pool[-window:]]
            if rounds_only:
                decisions = rounds_rule(_entry(p["benchmarks"]), hist[-1], threshold=threshold, alpha=alpha)
            else:
                decisions = gate.gate(_entry(p["benchmarks"]), hist[-1], threshold=threshold, alpha=alpha,
                                      history=hist, normalize=normalize)
            regressed = {d.name for d in decisions if d.status == "regression"}
            if p["injected"]:
                n_inj += 1
                for t in targets:
                    caught[t] += any(t in name for name in regressed)
                false_in_injected += any(not any(t in name for t in targets) for name in regressed)
            else:
                n_fa += 1
                fa += bool(regressed)
        if not p["injected"]:
            clean.append(p)
    return {"false_alarm": binomial_rate(fa, n_fa), "power": {t: binomial_rate(caught[t], n_inj) for t in targets},
            "other_regressions_in_injected_runs": binomial_rate(false_in_injected, n_inj)}


def ab_mode(sessions: list[dict], targets: list[str], *, threshold: float, alpha: float,
            pairs: int | None = None) -> dict:
    """Each A/A session's false alarm and each injected session's detection (first ``pairs`` pairs)."""
    fa = n_fa = n_inj = false_in_injected = 0
    caught = {t: 0 for t in targets}
    for s in sessions:
        regressed = {d.name for d in ab.decide(_ab_passes(s["passes"], pairs), threshold=threshold, alpha=alpha)
                     if d.status == "regression"}
        if s["kind"] == "aa":
            n_fa += 1
            fa += bool(regressed)
        else:
            n_inj += 1
            for t in targets:
                caught[t] += any(t in name for name in regressed)
            false_in_injected += any(not any(t in name for t in targets) for name in regressed)
    return {"false_alarm": binomial_rate(fa, n_fa), "power": {t: binomial_rate(caught[t], n_inj) for t in targets},
            "other_regressions_in_injected_runs": binomial_rate(false_in_injected, n_inj)}


def _session_pairs(s: dict) -> list[dict[str, dict[str, float]]]:
    """A session's pairs as [{"a": {name: median}, "b": {...}}, ...]."""
    by_pair: dict[int, dict] = {}
    for p in s["passes"]:
        by_pair.setdefault(p["pair"], {})[p["side"]] = {n: b["median"] for n, b in p["benchmarks"].items()}
    return [v for _, v in sorted(by_pair.items()) if len(v) == 2]


def ab_resampled(sessions: list[dict], targets: list[str], *, threshold: float, alpha: float, pairs: int,
                 draws: int = 2000, seed: int = 0) -> dict:
    """The A/B rule on ``draws`` synthetic sessions of ``pairs`` pairs drawn with replacement from
    all the A/A pairs (false alarms) and all the injected pairs (power) of the calibration:
    many more decisions than there are sessions, at the price of a model (pairs independent of
    their session). Rates only: the draws re-use the same pairs, so no binomial interval."""
    rng = np.random.default_rng(seed)
    pools = {k: [pr for s in sessions if s["kind"] == k for pr in _session_pairs(s)] for k in ("aa", "injected")}

    def regressed(pool):
        picks = rng.integers(0, len(pool), pairs)
        ps = [{"side": side, "pair": i, "records": [{"fullname": n, "stats": {"median": m}}
                                                      for n, m in pool[j][side].items()]}
              for i, j in enumerate(picks) for side in ("a", "b")]
        return {d.name for d in ab.decide(ps, threshold=threshold, alpha=alpha) if d.status == "regression"}

    out = {"false_alarm": {"hits": 0, "n": 0, "rate": None, "ci95": None},
           "power": {t: {"hits": 0, "n": 0, "rate": None, "ci95": None} for t in targets},
           "other_regressions_in_injected_runs": {"hits": 0, "n": 0, "rate": None, "ci95": None}}
    if len(pools["aa"]) >= pairs:
        hits = sum(bool(regressed(pools["aa"])) for _ in range(draws))
        out["false_alarm"] = {"hits": hits, "n": draws, "rate": hits / draws, "ci95": None}
    if len(pools["injected"]) >= pairs:
        caught, other = {t: 0 for t in targets}, 0
        for _ in range(draws):
            r = regressed(pools["injected"])
            for t in targets:
                caught[t] += any(t in name for name in r)
            other += any(not any(t in name for t in targets) for name in r)
        out["power"] = {t: {"hits": c, "n": draws, "rate": c / draws, "ci95": None} for t, c in caught.items()}
        out["other_regressions_in_injected_runs"] = {"hits": other, "n": draws, "rate": other / draws, "ci95": None}
    return out


def noise(passes: list[dict], sessions: list[dict]) -> dict:
    """Per benchmark: sd of ln(median) over the unchanged passes, raw, relative to each pass's
    speed (:func:`inference_conformance.perf.stats.normalize_by_run_speed`, the gate's default) and normalised by the
    pass's own copy bandwidth and float32 matmul peak; sd of the paired log ratios of the A/A
    sessions (the noise the A/B mode sees, for one pair)."""
    clean = [p for p in passes if not p["injected"]]
    names = sorted(set().union(*(p["benchmarks"] for p in clean))) if clean else []
    meds = [{n: b["median"] for n, b in p["benchmarks"].items()} for p in clean]
    speed = normalize_by_run_speed(meds[0], meds) if meds else None
    out = {}
    for n in names:
        rows = [(p["benchmarks"][n]["median"], p.get("ceilings") or {}) for p in clean if n in p["benchmarks"]]
        lm = np.log([m for m, _ in rows])
        entry = {"passes": len(rows), "sd_ln_median": float(np.std(lm, ddof=1))}
        if speed and n in speed.y_hist:
            entry["sd_ln_median_run_speed"] = speed.fit(n)[2]  # residual sd around the run-speed line
        for key, get in (("copy", lambda c: c.get("copy_bytes_per_s")),
                         ("matmul_float32", lambda c: (c.get("matmul_flops_per_s") or {}).get("float32"))):
            v = [(m, get(c)) for m, c in rows if get(c)]
            if len(v) >= 3:
                entry[f"sd_ln_median_x_{key}"] = float(np.std([np.log(m) + np.log(x) for m, x in v], ddof=1))
                # the raw spread over the same passes (those with ceilings), to compare like with like
                entry["passes_with_ceilings"] = len(v)
                entry["sd_ln_median_passes_with_ceilings"] = float(np.std(np.log([m for m, _ in v]), ddof=1))
        d = []
        for s in sessions:
            if s["kind"] != "aa":
                continue
            d += ab.paired_log_ratios(_ab_passes(s["passes"])).get(n, [])
        if len(d) >= 3:
            entry["sd_paired_log_ratio"] = float(np.std(d, ddof=1))
        out[n] = entry
    return out


def injected_effect(sessions: list[dict], targets: list[str]) -> dict:
    """Per target: the mean and sd of the paired log ratios ln(B / A) in the injected sessions
    (ln(1.15) = 0.140 when the injection works), as a check of the injection itself; "control":
    the same over the benchmarks not slowed down, in the same sessions (0 expected)."""
    out = {}
    for t in targets + ["control"]:
        d = []
        for s in sessions:
            if s["kind"] != "injected":
                continue
            lr = ab.paired_log_ratios(_ab_passes(s["passes"]))
            if t == "control":
                d += [x for k, v in lr.items() if not any(q in k for q in targets) for x in v]
            else:
                d += next((v for k, v in lr.items() if t in k), [])
        out[t] = {"pairs": len(d), "mean_ln_ratio": float(np.mean(d)) if d else None,
                  "sd_ln_ratio": float(np.std(d, ddof=1)) if len(d) > 1 else None,
                  "se_mean": float(np.std(d, ddof=1) / np.sqrt(len(d))) if len(d) > 1 else None}
    return out


def detectable(noise: dict, n_bench: int, *, threshold: float, alpha: float, window: int, pairs: int,
               fraction: float) -> dict:
    """From the measured noise, per benchmark: the slowdown each mode catches with 90% power
    (:func:`inference_conformance.perf.stats.detectable_slowdown` at the worst Holm step alpha / n_bench), and the
    interleaved pairs the A/B mode would need to catch ``fraction`` with 90% power
    (:func:`inference_conformance.perf.stats.pairs_needed`)."""
    out = {}
    step = alpha / n_bench
    for name, e in noise.items():
        row = {}
        for key, sd_h in (("history_90pct", e.get("sd_ln_median_run_speed")), ("history_raw_90pct", e.get("sd_ln_median"))):
            if sd_h:
                row[key] = detectable_slowdown(sd_h * np.sqrt(1 + 1 / window), df=window - 1, alpha=step,
                                               threshold=threshold)
        sd_d = e.get("sd_paired_log_ratio")
        if sd_d:
            row["ab_90pct"] = detectable_slowdown(sd_d / np.sqrt(pairs), df=pairs - 1, alpha=step, threshold=threshold)
            row[f"ab_pairs_for_{fraction:.0%}"] = pairs_needed(sd_d, fraction, alpha=step, threshold=threshold)
        out[name] = row
    return out


def analyse(sessions: list[dict], *, threshold: float = 0.10, alpha: float = DEFAULT_ALPHA,
            window: int = gate.DEFAULT_WINDOW, resample_draws: int = 2000) -> dict:
    """Measured false-alarm rates and power per mode (see the module docstring)."""
    if not sessions:
        raise ValueError("no sessions to analyse")
    targets = sessions[0]["targets"]
    passes = passes_in_order(sessions)
    pairs = max(s["pairs"] for s in sessions)
    res = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "python -m inference_conformance.perf.calibrate collect; python -m inference_conformance.perf.calibrate analyse",
        "subset_k": sessions[0]["k"], "benchmarks": sorted({n for p in passes for n in p["benchmarks"]}),
        "timer": sessions[0].get("timer", "wall"), "lockstep": bool(sessions[0].get("lockstep", False)),
        "max_time": sessions[0].get("max_time", 0.2), "targets": targets, "fraction": max(s["fraction"] for s in sessions),
        "threads": sessions[0].get("threads"),
        "sessions": {"aa": sum(s["kind"] == "aa" for s in sessions),
                     "injected": sum(s["kind"] == "injected" for s in sessions)},
        "pairs": pairs, "passes": len(passes),
        "seconds_per_pass": float(np.median([p["seconds"] for p in passes])),
        "seconds_per_session": float(np.median([s["seconds"] for s in sessions])),
        "loadavg_1min": [float(min(s["loadavg"][0] for s in sessions)), float(max(s["loadavg"][0] for s in sessions))],
        "settings": {"threshold": threshold, "alpha": alpha, "window": window, "min_history": MIN_HISTORY,
                     "family": "Holm over the run's benchmarks; alpha = run-level family-wise level"},
        "modes": {
            **{_history_key(m, norm): history_mode(runs_of(passes, m), targets, threshold=threshold, alpha=alpha,
                                                   window=window, normalize=norm)
               for m in (1,) + HISTORY_PASSES for norm in (True, False)},
            "ab": ab_mode(sessions, targets, threshold=threshold, alpha=alpha),
            "ab_resampled": ab_resampled(sessions, targets, threshold=threshold, alpha=alpha, pairs=pairs,
                                         draws=resample_draws),
            "rounds_only": history_mode(passes, targets, threshold=threshold, alpha=alpha, window=window,
                                        rounds_only=True),
            # the gate's own rule with one earlier entry (gate B --baseline A): no verdict, so no false alarm
            "one_baseline": history_mode(passes, targets, threshold=threshold, alpha=alpha, window=1),
        },
        "false_alarm_by_window": {
            _history_key(m, True): {str(w): history_mode(runs_of(passes, m), targets, threshold=threshold, alpha=alpha,
                                                         window=w)["false_alarm"] for w in SHORT_WINDOWS if w < window}
            for m in (1,) + HISTORY_PASSES},
        "noise": noise(passes, sessions),
        # passes whose ceilings probe failed (recorded, never fatal): no ceilings normalisation from them
        "ceilings_errors": sorted({(p.get("ceilings") or {}).get("error") for p in passes} - {None}),
        "ceilings_missing": sum(not (p.get("ceilings") or {}).get("copy_bytes_per_s") for p in passes),
        "injected_effect": injected_effect(sessions, targets),
        "sensitivity": [],
    }
    res["detectable"] = detectable(res["noise"], len(res["benchmarks"]), threshold=threshold, alpha=alpha,
                                   window=window, pairs=pairs, fraction=res["fraction"] or 0.15)
    for al in (0.01, 0.05):
        for th in (0.05, 0.10):
            row = {"alpha": al, "threshold": th}
            h = history_mode(passes, targets, threshold=th, alpha=al, window=window)
            row["history"] = {"false_alarm": h["false_alarm"]["rate"], "power": {t: v["rate"] for t, v in h["power"].items()}}
            for k in sorted({3, pairs}):
                if k <= pairs:
                    m = ab_mode(sessions, targets, threshold=th, alpha=al, pairs=k)
                    row[f"ab_{k}_pairs"] = {"false_alarm": m["false_alarm"]["rate"],
                                            "power": {t: v["rate"] for t, v in m["power"].items()}}
            res["sensitivity"].append(row)
    return res
