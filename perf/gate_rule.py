"""The gate's rule: how :mod:`inference_conformance.perf.gate` decides each benchmark of a run against
the earlier entries of its series.

Runs of unchanged code on one machine differ from each other (load, clocks, caches,
neighbours) by more than the rounds of one run show: rounds of one run share the machine's
state. So each benchmark is judged by the **between-run model** when the series holds at least
``MIN_HISTORY`` (3) earlier entries with it (``--window``, default the last 20 up to the
baseline): with m_1..m_n the ln(median) of those runs (mean mu, standard deviation s) and x the
run's ln(median),

- ratio r = exp(x - mu) (against the history's geometric mean), t = (x - mu) / (s sqrt(1 + 1/n)),
  one-sided p-values from Student's t with n - 1 degrees of freedom (the run as a new draw
  from the history's distribution of run medians: a prediction interval), and r's (1 - alpha)
  interval exp(x - mu +- t_{1-alpha/2} s sqrt(1 + 1/n)).

**Relative to the run's speed** (default; ``--no-normalize`` to judge raw medians): the
benchmarks of one run share much of their shift (the machine's speed in that run), so where at
least ``MIN_NORMALIZE`` (4) benchmarks are in the run and in every one of at least 4 entries of
the window, each one is judged against what the run's speed predicts: the run's speed as that
benchmark sees it is the median shift of the run's *other* benchmarks from their history means
(one regressed benchmark barely moves it), and over the history a least-squares line of the
benchmark's ln(median) on that speed gives the prediction and a t prediction interval with
n - 2 degrees of freedom (:func:`inference_conformance.perf.stats.speed_test`; the slope is measured: about 1 for a benchmark
that follows the machine, about 0 for one that does not). The run's speed itself,
exp(median shift of all benchmarks), is judged by the plain between-run model as one more
member of the family, ``(run speed: ...)``: a change that slows every benchmark alike fails
there (with the wider spread of the machine's speed; when most benchmarks slow down, the
unchanged rest look faster than the run's speed predicts and show as improvements). Each
benchmark's own row cancels a uniform shift by construction, so the run-speed row is the only
one that sees it: it holds half of alpha (:data:`RUN_SPEED_SHARE`, weighted Holm) rather than
1/(m+1) of it. Its measured effect is in the calibration.

With fewer entries a benchmark is **inconclusive**: the rounds of the run and of the baseline
give its ratio r = median(run) / median(baseline) (bootstrap interval, Mann-Whitney U), but the
rounds of one run do not see the variance between runs (that rule fails unchanged code often
on a shared machine), so they call no regression, whatever the ratio; the message points to
the A/B mode. A benchmark of **one timed round**, or whose round lasts fewer than
:data:`TIMER_TICKS` ticks of its timer, is **ungated**: reported, never judged.

Family-wise control: the p-values of all the run's judged benchmarks are adjusted by Holm's
step-down method, so ``alpha`` (default 0.05) bounds the **run-level** false-alarm rate, the
probability that the gate fails a run of unchanged code whatever the number of benchmarks, as
far as the model holds (its measured rate: ``perf/calibration/gate_calibration.json``). Then,
per benchmark, with p the Holm-adjusted p-value:

- **regression** (exit 1): r > 1 + threshold and p_slower < alpha: larger than the practical
  threshold and statistically significant; or r > ``--hard-limit`` (default 1.5) whatever the
  Holm step, only where the run-to-run spread is measured (between-run model) and well below the
  limit (:func:`inference_conformance.perf.stats.hard_limit_applies`: unchanged code passes it in
  fewer than 0.1% of runs under that spread); never from the rounds.
- **improvement**: r < 1 - threshold and p_faster < alpha: the baseline should be updated.
- **noisy** (a warning; exit 0, 3 with ``--strict``): neither of the above, and either the interval reaches past
  1 + threshold (a regression larger than the threshold can be neither shown nor ruled out) or
  r is beyond the threshold without significance: the run cannot decide.
- **ok**: otherwise: the interval rules out a slowdown larger than the threshold.
The command, its inputs and its refusals: :mod:`inference_conformance.perf.gate`.
"""
from __future__ import annotations

import numpy as np

from inference_conformance.perf import records
from inference_conformance.perf.stats import (DEFAULT_ALPHA, DEFAULT_HARD_LIMIT, MIN_HISTORY, Decision, decide,
                                              history_test, judge_family, normalize_by_run_speed, rounds_test,
                                              speed_test)

#: Earlier entries of the series the between-run model uses (the last ones before the run): 20
#: rather than 10 gave the run-speed fit more power at the same false-alarm rate in the calibration.
DEFAULT_WINDOW = 20
#: The pseudo-benchmark that judges the run's speed itself (the median shift of its benchmarks).
RUN_SPEED = "(run speed: the median shift of all benchmarks)"
#: The run-speed row's share of alpha in the weighted Holm family (the benchmarks share the rest).
#: It is the one row that sees a change slowing every benchmark alike (each benchmark's own row,
#: relative to the run's speed, cancels a uniform shift by construction): with an equal share,
#: 1 of 21 rows, a uniform 2x slowdown was caught in about half of the synthetic runs.
RUN_SPEED_SHARE = 0.5


#: A benchmark whose timed round (median x iterations) lasts fewer ticks of its timer than this
#: is never gated (pytest-benchmark's own calibration asks 10 ticks per round), nor one with a
#: single timed round: neither is a measurement of the code's speed.
TIMER_TICKS = 10
#: Each timer's resolution in seconds, as pytest-benchmark measures it on the project's 2-core
#: machine (process_time 0.22 us, perf_counter 0.04 us), rounded up; any other timer: 1 us.
TIMER_RESOLUTION = {"process_time": 2.5e-7, "perf_counter": 5e-8}
DEFAULT_RESOLUTION = 1e-6


def unmeasured(rec: dict | None, timer: str | None) -> str | None:
    """Why a benchmark record is not a measurement the gate can judge (one timed round, or a
    round shorter than :data:`TIMER_TICKS` ticks of ``timer``), None when it is one."""
    if rec is None:
        return None
    st = rec.get("stats") or {}
    rounds = st.get("rounds") if isinstance(st.get("rounds"), int) else len(rec.get("data") or []) or None
    if rounds == 1:
        return "one timed round"
    med = st.get("median") or (float(np.median(rec["data"])) if rec.get("data") else None)
    res = TIMER_RESOLUTION.get(timer or "", DEFAULT_RESOLUTION)
    per_round = (med or 0.0) * (st.get("iterations") if isinstance(st.get("iterations"), int) else 1)
    if med and per_round < TIMER_TICKS * res:
        return (f"a round of {per_round * 1e6:.3g} us, within {TIMER_TICKS} ticks of the timer "
                f"{timer or '(unknown)'} (resolution {res * 1e6:.2g} us)")
    return None


def samples(rec: dict) -> list[float]:
    """A benchmark record's per-round times in seconds (its raw ``data``, else its median alone)."""
    data = rec.get("data") or []
    if data:
        return [float(x) for x in data]
    med = (rec.get("stats") or {}).get("median")
    return [float(med)] if med else []



def history_medians(entries: list[dict]) -> dict[str, list[float]]:
    """benchmark fullname -> its median in each of ``entries`` (where present)."""
    out: dict[str, list[float]] = {}
    for e in entries:
        for b in e.get("benchmarks", []):
            med = (b.get("stats") or {}).get("median")
            if med:
                out.setdefault(b["fullname"], []).append(float(med))
    return out


def gate(run: dict, base: dict, *, threshold: float = 0.10, alpha: float = DEFAULT_ALPHA,
         history: list[dict] | None = None, min_history: int = MIN_HISTORY, normalize: bool = True,
         hard_limit: float | None = DEFAULT_HARD_LIMIT, speed_share: float = RUN_SPEED_SHARE,
         timer: str | None = None) -> list[Decision]:
    """Decide every benchmark of ``run`` against ``base``; ``history`` (earlier entries of the
    series, the baseline included, oldest first): benchmarks with at least ``min_history`` of
    them are judged by the between-run model; the others are **inconclusive** (the rounds of one
    run against ``base`` give their ratio, never a verdict).
    ``normalize`` (default): where at least :data:`MIN_NORMALIZE` benchmarks are in the run and
    in every history entry, they are judged relative to each run's speed
    (:func:`inference_conformance.perf.stats.normalize_by_run_speed`) and the run's speed itself is one more decision
    (:data:`RUN_SPEED`) holding the share ``speed_share`` of alpha in the weighted Holm family
    (the benchmarks share the rest). Holm's method over all judged benchmarks makes ``alpha``
    the run-level level; a ratio beyond ``hard_limit`` fails whatever the Holm step where the
    measured spread is well below it (:func:`inference_conformance.perf.stats.hard_limit_applies`).
    A benchmark of one timed round, or of rounds within :data:`TIMER_TICKS` ticks of ``timer``
    (the run's timer name), in the run or the baseline is **ungated**: reported, never judged,
    and left out of the run's speed."""
    base_by = {b["fullname"]: b for b in base.get("benchmarks", [])}
    ungated = {}
    for rec in run.get("benchmarks", []):
        why = unmeasured(rec, timer) or unmeasured(base_by.get(rec["fullname"]), timer)
        if why:
            ungated[rec["fullname"]] = Decision(rec["fullname"], "ungated", reason=f"not gated: {why}, in the "
                                                f"{'run' if unmeasured(rec, timer) else 'baseline'}: no measurement "
                                                f"of the code's speed to judge")
    order = [rec["fullname"] for rec in run.get("benchmarks", [])]
    run = dict(run, benchmarks=[r for r in run.get("benchmarks", []) if r["fullname"] not in ungated])
    history = [dict(e, benchmarks=[r for r in e.get("benchmarks", []) if r["fullname"] not in ungated])
               for e in (history or [])]
    meds = history_medians(history or [])
    run_meds = {}
    for rec in run.get("benchmarks", []):
        rs = samples(rec)
        med = (rec.get("stats") or {}).get("median") or (float(np.median(rs)) if rs else None)
        if med:
            run_meds[rec["fullname"]] = float(med)
    speed = None
    if normalize and history and len(history) >= max(2, min_history):
        speed = normalize_by_run_speed(run_meds, [{n: v[0] for n, v in history_medians([e]).items()}
                                                  for e in history])
    names, tests, weights, other = [], [], [], {}
    seen = set()
    for rec in run.get("benchmarks", []):
        name = rec["fullname"]
        seen.add(name)
        rs, b = samples(rec), base_by.get(name)
        h = meds.get(name, [])
        if speed and name in speed.y_run:
            tests.append(speed_test(speed, name, alpha=alpha))
        elif name in run_meds and len(h) >= max(2, min_history):
            tests.append(history_test(run_meds[name], h, alpha=alpha))
        elif b is not None and samples(b) and rs:
            other[name] = _few_history(name, rounds_test(samples(b), rs, alpha=alpha), len(h), threshold=threshold,
                                       alpha=alpha, hard_limit=hard_limit)
            continue
        else:
            other[name] = Decision(name, "new", reason="no baseline samples for this benchmark")
            continue
        names.append(name)
        weights.append(1.0)
    other.update(ungated)
    if speed:
        names.append(RUN_SPEED)
        order.append(RUN_SPEED)
        weights.append(len(tests) * speed_share / (1 - speed_share))
        tests.append(history_test(speed.speed_run, speed.speed_history, alpha=alpha, relative=(
            f" (all {len(speed.names)} benchmarks shifted alike: the machine, or a change that slows them all)")))
    decided = {d.name: d for d in judge_family(names, tests, threshold=threshold, alpha=alpha, weights=weights,
                                               hard_limit=hard_limit)}
    result = [decided.get(n) or other[n] for n in order]
    for name in base_by:
        if name not in seen and name not in ungated:
            result.append(Decision(name, "missing", reason="in the baseline, not in this run"))
    return result


def _few_history(name: str, t, n_history: int, *, threshold: float, alpha: float, hard_limit: float | None) -> Decision:
    """A benchmark with fewer than :data:`MIN_HISTORY` earlier entries: **inconclusive**, whatever
    its ratio (the rounds of one run do not see the between-run variance, and with no measured
    run-to-run spread the hard limit does not apply either)."""
    d = decide(name, t, t.p_slower, t.p_faster, threshold=threshold, alpha=alpha, hard_limit=hard_limit)
    d.status = "inconclusive"
    d.reason = (f"median {(t.ratio - 1) * 100:+.1f}% against the baseline's rounds (interval "
                f"[{t.ci_low:.3f}, {t.ci_high:.3f}], {t.detail}); {n_history} earlier "
                f"entr{'y holds' if n_history == 1 else 'ies hold'} this benchmark, fewer than {MIN_HISTORY}: its run-to-run "
                f"spread is not measured, so no verdict (use inference-conformance ab)")
    return d


def ceiling_drift(run: dict, base: dict) -> dict[str, float]:
    """Relative change of the measured ceilings (copy bandwidth, matmul peak per dtype) between
    the baseline and the run: a machine that got slower or busier shows here first."""
    out = {}
    rc, bc = run.get("ceilings") or {}, base.get("ceilings") or {}
    for key in ("copy_bytes_per_s",):
        if isinstance(rc.get(key), (int, float)) and isinstance(bc.get(key), (int, float)) and bc[key] > 0:
            out[key] = rc[key] / bc[key] - 1
    rp, bp = records.matmul_peaks(rc), records.matmul_peaks(bc)
    for d in sorted(set(rp) & set(bp)):
        if bp[d] > 0:
            out[f"matmul_flops_per_s[{d}]"] = rp[d] / bp[d] - 1
    return out
