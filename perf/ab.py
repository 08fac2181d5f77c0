"""``python -m inference_conformance.perf.ab --a REV_OR_DIR --b REV_OR_DIR [--pairs 10] [-k EXPR]``: interleaved A/B runs.

The strongest design for a change under review: the benchmarks of two revisions (git revisions,
checked out with ``git worktree``, or two checkout folders) run interleaved in one session, so
both sides see the same machine state (load, clocks, neighbours). Each pass is one
``pytest benchmarks --benchmark-enable`` process of one side; a pair of passes gives, per
benchmark, one paired log ratio d_i = ln(median_B,i / median_A,i). By default the two passes of
a pair run at once in **lockstep** (:mod:`inference_conformance.perf.lockstep`): they take turns benchmark by
benchmark, A B | B A | A B ..., never timing at the same time, so the two runs of a benchmark
are seconds apart instead of a whole pass; ``--sequential`` runs the passes one after the
other instead (A B, B A, ...). Several pairs are needed because a process has its own state
(memory layout, allocator) that the rounds inside it share.

The decision, per benchmark, from the k pairs (same rule as the history gate,
:func:`inference_conformance.perf.stats.judge_family`):

- ratio r = exp(mean d_i) (geometric mean of the paired ratios), its (1 - alpha) Student-t
  interval, and one-sided one-sample t-test p-values on the d_i (H0: no change), k - 1 degrees
  of freedom: the pairs are the independent units, so the variance between passes (processes)
  is what the test sees, not only the rounds inside one pass;
- the p-values of all benchmarks are adjusted by Holm's step-down method, so ``alpha`` is the
  **run-level** (family-wise) false-alarm rate: the probability that the gate fails an unchanged
  pair of revisions, whatever the number of benchmarks (given the model);
- **regression** (exit 1): r > 1 + threshold and Holm-adjusted p_slower < alpha; **improvement**,
  **noisy**, **ok** as in the history gate.

On ``--device cpu`` the passes time CPU time (``--benchmark-timer=time.process_time``) with one
intra-op thread (``OMP_NUM_THREADS=1``) and the allocator pinned (:func:`inference_conformance.perf.settings.pinned_env`)
by default: on a shared CPU runner, wall time mostly measures the neighbours (time slicing); on
CUDA they time wall time (``--timer``, ``--threads``).

Two outside implementations (two versions of one's own kernel) compare the same way on one
checkout: ``--impl-a TECHNIQUE=module:attr --impl-b TECHNIQUE=module:attr`` (each repeatable)
hands each side's passes its ``--impl`` options; ``--a``/``--b`` then default to this working
tree. With ``--impl`` the benchmarks run only their rows of the outside implementations, named
``impl``, ``impl2``, ... by their order per technique, not by target
(:func:`inference_conformance.conformance.bench_rows.bench_backends`), so A's first target pairs with B's first.

Every pass's benchmark JSON records how it was measured (:mod:`inference_conformance.perf.settings_record`:
timer, threads, pinned environment, device); passes measured differently (a side whose
interpreter or checkout times otherwise) are refused, exit 2, each difference named
(:func:`inference_conformance.perf.settings_compare.check_passes`); a side not taken with the pinned settings
(``--threads 0`` on the CPU) is warned about on stderr. A pass of a checkout older than the
recording is read as what this session applied to it.

Its measured error rates on this suite (false alarms on unchanged code, power against an
injected 15% slowdown) are in ``perf/calibration/gate_calibration.json`` and the report.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from inference_conformance.perf import gate_modes, records, settings, settings_compare
from inference_conformance.perf.env import ROOT, fingerprint
from inference_conformance.perf.stats import judge_family, log_ratio_test, print_decisions

#: Pairs per A/B session: on the calibration machine (shared, 2 cores) 10 lockstep pairs caught an
#: injected 15% slowdown in 12 of 12 sessions, with no false alarm in 12 unchanged ones
#: (perf/calibration/gate_calibration.json); 3-6 pairs would give 90% power there.
DEFAULT_PAIRS = 10
TIMERS = settings.TIMERS


def timer_args(timer: str) -> list[str]:
    """pytest arguments selecting ``timer`` ("cpu" or "wall"); ValueError otherwise."""
    return settings.bench_settings("cpu", timer)["pytest_args"]


def resolve_checkout(spec: str, tmp: Path, label: str, repo: Path = ROOT) -> tuple[Path, bool]:
    """A checkout folder for ``spec``: an existing folder as is, else a git revision of ``repo``
    checked out (detached) with ``git worktree add`` under ``tmp``. Returns (path, created).

    Raises ValueError when ``spec`` is neither a folder nor a revision git knows.
    """
    p = Path(spec)
    if p.is_dir():
        return p.resolve(), False
    r = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise ValueError(f"--{label}: {spec!r} is neither a folder nor a git revision of {repo}")
    dest = tmp / label
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", "--quiet", str(dest), r.stdout.strip()],
                   check=True)
    return dest, True


def describe(spec: str, repo: Path = ROOT) -> str:
    """``spec`` with the commit it names (``HEAD~3 (6fa950c)``), or as is for a folder."""
    if Path(spec).is_dir():
        return spec
    r = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", f"{spec}^{{commit}}"],
                       capture_output=True, text=True)
    return f"{spec} ({r.stdout.strip()})" if r.returncode == 0 and r.stdout.strip() != spec else spec


def remove_checkout(path: Path, repo: Path = ROOT) -> None:
    subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(path)], capture_output=True)


def pass_command(checkout: Path, out_json: Path, *, k: str | None = None, device: str = "cpu",
                 max_time: float = 0.2, min_rounds: int = 5, env: dict | None = None,
                 pytest_args: list[str] | None = None, ceilings: bool = False,
                 python: str | None = None) -> tuple[list[str], dict]:
    """The command line and environment of one pass: ``pytest benchmarks --benchmark-enable`` in
    ``checkout`` (its code first on PYTHONPATH). ``ceilings``: the pass also writes its quick
    ceilings next to ``out_json`` (needs ``-p inference_conformance.perf.inject`` in ``pytest_args``; see
    :mod:`inference_conformance.perf.inject`); ``python``: the interpreter (default this one), e.g. another virtual
    environment's, to compare two installed versions of a package."""
    cmd = [python or sys.executable, "-m", "pytest", "benchmarks", "-q", "-p", "no:cacheprovider", "--benchmark-enable",
           f"--benchmark-json={out_json}", f"--benchmark-max-time={max_time}",
           f"--benchmark-min-rounds={min_rounds}", f"--device={device}"]
    if k:
        cmd += ["-k", k]
    cmd += pytest_args or []
    e = dict(os.environ)
    e["PYTHONPATH"] = str(checkout) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.update(env or {})
    if ceilings:
        e["BENCH_CEILINGS_OUT"] = str(Path(out_json).with_suffix(".ceilings.json"))
    return cmd, e


def run_pass(checkout: Path, out_json: Path, *, quiet: bool = True, **kw) -> list[dict]:
    """One pass (:func:`pass_command`) in a fresh process; returns the benchmark records
    (:func:`inference_conformance.perf.records.records`), [] when none ran."""
    cmd, e = pass_command(checkout, out_json, **kw)
    out = subprocess.DEVNULL if quiet else None
    subprocess.run(cmd, cwd=checkout, env=e, stdout=out, stderr=out)
    return records.records(out_json)


def run_lockstep_pair(a: Path, b: Path, workdir: Path, pair: int, *, first: str = "a", env_a: dict | None = None,
                      env_b: dict | None = None, args_a: list[str] | None = None, args_b: list[str] | None = None,
                      python_a: str | None = None, python_b: str | None = None, quiet: bool = True,
                      **pass_kw) -> dict[str, tuple[list[dict], float]]:
    """Both passes of a pair at once, taking turns benchmark by benchmark (:mod:`inference_conformance.perf.lockstep`,
    ``first`` runs first on the first common benchmark). Returns side -> (records, seconds)."""
    from inference_conformance.perf import lockstep

    folder = workdir / f"lockstep{pair}"
    folder.mkdir(parents=True, exist_ok=True)
    procs, t0 = {}, time.time()
    out = subprocess.DEVNULL if quiet else None
    for side, ck, env, args, py in (("a", a, env_a, args_a, python_a), ("b", b, env_b, args_b, python_b)):
        env = dict(env or {}, **{lockstep.DIR_ENV: str(folder), lockstep.SIDE_ENV: side, lockstep.FIRST_ENV: first})
        cmd, e = pass_command(ck, workdir / f"pass{pair}{side}.json", env=env, python=py,
                              pytest_args=["-p", "inference_conformance.perf.lockstep"] + (args or []), **pass_kw)
        procs[side] = subprocess.Popen(cmd, cwd=ck, env=e, stdout=out, stderr=out)
    seconds = {}
    while len(seconds) < 2:
        for side, pr in procs.items():
            if side not in seconds and pr.poll() is not None:
                seconds[side] = time.time() - t0
                (folder / f"exit-{side}").touch()  # a side that crashed never hangs its partner
        time.sleep(0.05)
    return {s: (records.records(workdir / f"pass{pair}{s}.json"), seconds[s]) for s in procs}


def impl_args(targets: list[str]) -> list[str]:
    """pytest arguments handing a side's outside implementations to its passes (their rows only:
    the built-in rows would be timed on both sides alike)."""
    return [x for t in targets for x in ("--impl", t)] + (["--outside-bench-only"] if targets else [])


def check_impls(impl_a: list[str], impl_b: list[str]) -> str | None:
    """Why ``--impl-a``/``--impl-b`` cannot be compared (a message naming the flag), or None:
    each must be TECHNIQUE=module:attr, one side's without the other's is refused, and both must
    give the same techniques, as many times each (rows pair by their place per technique)."""
    from inference_conformance.conformance import registry

    if bool(impl_a) != bool(impl_b):
        given, missing = ("--impl-a", "--impl-b") if impl_a else ("--impl-b", "--impl-a")
        return f"{given} needs {missing}: the other side's implementation of the same technique"
    counts = {}
    for flag, targets in (("--impl-a", impl_a), ("--impl-b", impl_b)):
        try:
            parsed = registry.parse_impl_option(targets)
        except ValueError as exc:
            return f"{flag}: {exc}"
        counts[flag] = {t: len(v) for t, v in parsed.items()}
    if counts["--impl-a"] != counts["--impl-b"]:
        def show(c):
            return ", ".join(f"{t} x{n}" for t, n in sorted(c.items()))
        return (f"--impl-b: its techniques ({show(counts['--impl-b'])}) differ from --impl-a's "
                f"({show(counts['--impl-a'])}); give each side the same techniques, as many times each")
    return None


def side_label(spec: str, targets: list[str]) -> str:
    """A side for the output: its checkout (:func:`describe`) and its ``--impl`` targets."""
    return describe(spec) + "".join(f" --impl {t}" for t in targets)


def implementations(passes: list[dict]) -> dict[str, dict[str, str]]:
    """side -> {benchmark fullname: the implementation its row timed (extra_info
    ``implementation``: an outside row's target)}, for the rows that state one."""
    out: dict[str, dict[str, str]] = {"a": {}, "b": {}}
    for p in passes:
        for r in p["records"]:
            name = (r.get("extra_info") or {}).get("implementation")
            if name:
                out.setdefault(p["side"], {})[r["fullname"]] = str(name)
    return out


def medians(records: list[dict]) -> dict[str, float]:
    return {r["fullname"]: float(r["stats"]["median"]) for r in records
            if (r.get("stats") or {}).get("median")}


def session(a: Path, b: Path, pairs: int = DEFAULT_PAIRS, *, workdir: Path, env_a: dict | None = None,
            env_b: dict | None = None, args_a: list[str] | None = None, args_b: list[str] | None = None,
            python_a: str | None = None, python_b: str | None = None, lockstep: bool = True, log=print,
            **pass_kw) -> list[dict]:
    """Run ``pairs`` pairs of passes; returns one dict per pass:
    {"side", "pair", "start", "seconds", "records", "ceilings"}.

    ``lockstep`` (default): both passes of a pair run at once and take turns benchmark by
    benchmark (:mod:`inference_conformance.perf.lockstep`), who goes first alternating between pairs. Otherwise
    the passes run one after the other, A B, B A, A B, .... ``python_a``/``python_b``: each side's
    interpreter (two virtual environments: two installed versions of a package, same checkout)."""
    passes = []

    def add(side, i, t0, seconds, recs):
        ceil = workdir / f"pass{i}{side}.ceilings.json"
        passes.append({"side": side, "pair": i, "start": t0, "seconds": seconds, "records": recs,
                       "ceilings": json.loads(ceil.read_text()) if ceil.exists() else None,
                       "settings": settings_compare.recorded(workdir / f"pass{i}{side}.json")})
        log(f"ab: pair {i + 1}/{pairs} side {side.upper()}{' (lockstep, both sides at once)' if lockstep else ''}: "
            f"{len(recs)} benchmarks in {seconds:.0f} s")

    for i in range(pairs):
        order = ("a", "b") if i % 2 == 0 else ("b", "a")
        if lockstep:
            t0 = time.time()
            got = run_lockstep_pair(a, b, workdir, i, first=order[0], env_a=env_a, env_b=env_b,
                                    args_a=args_a, args_b=args_b, python_a=python_a, python_b=python_b, **pass_kw)
            for side in order:
                add(side, i, t0, got[side][1], got[side][0])
            continue
        for side in order:
            t0 = time.time()
            recs = run_pass(a if side == "a" else b, workdir / f"pass{i}{side}.json",
                            env=env_a if side == "a" else env_b, pytest_args=args_a if side == "a" else args_b,
                            python=python_a if side == "a" else python_b, **pass_kw)
            add(side, i, t0, time.time() - t0, recs)
    return passes


def paired_log_ratios(passes: list[dict]) -> dict[str, list[float]]:
    """benchmark fullname -> [ln(median_B / median_A) per pair], for benchmarks in both passes of a pair."""
    by_pair: dict[int, dict[str, dict[str, float]]] = {}
    for p in passes:
        by_pair.setdefault(p["pair"], {})[p["side"]] = medians(p["records"])
    out: dict[str, list[float]] = {}
    for i in sorted(by_pair):
        ma, mb = by_pair[i].get("a", {}), by_pair[i].get("b", {})
        for name in ma.keys() & mb.keys():
            out.setdefault(name, []).append(float(np.log(mb[name] / ma[name])))
    return out


def decide(passes: list[dict], *, threshold: float = 0.10, alpha: float = 0.05):
    """Decisions (:class:`inference_conformance.perf.stats.Decision`) per benchmark from interleaved passes."""
    d = paired_log_ratios(passes)
    names = sorted(d)
    return judge_family(names, [log_ratio_test(d[n], label="pairs") for n in names],
                        threshold=threshold, alpha=alpha)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run an A/B session on ``argv`` (default ``sys.argv[1:]``); ``prog``: the command named in the
    usage line. Returns the exit status: 0 pass, 1 regression, 2 usage error, no results, or
    passes measured with different settings."""
    ap = argparse.ArgumentParser(prog=prog or "python -m inference_conformance.perf.ab",
                                 description=__doc__.split("\n\n")[1])
    ap.add_argument("--a", default=None, help="baseline side: a git revision or a checkout folder "
                                               "(default with --impl-a: this working tree)")
    ap.add_argument("--b", default=None, help="candidate side: a git revision or a checkout folder "
                                               "(default with --impl-b: this working tree)")
    ap.add_argument("--impl-a", action="append", default=[], metavar="TECHNIQUE=module:attr",
                    help="side A's outside implementation (repeatable): its passes get --impl and time only "
                         "the benchmark rows of outside implementations; needs --impl-b of the same techniques")
    ap.add_argument("--impl-b", action="append", default=[], metavar="TECHNIQUE=module:attr",
                    help="side B's outside implementation (repeatable), paired with --impl-a by technique and order")
    ap.add_argument("--pairs", type=int, default=DEFAULT_PAIRS, help="pairs of passes (>= 3; more: more power)")
    ap.add_argument("-k", dest="k", default=None, metavar="EXPR", help="pytest -k expression selecting benchmarks")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threshold", type=float, default=0.10, help="practical threshold on the ratio")
    ap.add_argument("--alpha", type=float, default=0.05, help="run-level (family-wise, Holm) significance level")
    ap.add_argument("--max-time", type=float, default=None, help="--benchmark-max-time per pass (cpu 0.2 s, cuda 1 s)")
    ap.add_argument("--timer", default=None, choices=sorted(TIMERS),
                    help="pytest-benchmark's timer (default: cpu = process CPU time on --device cpu, wall on cuda)")
    ap.add_argument("--threads", type=int, default=None,
                    help="OMP_NUM_THREADS of every pass (default 1 on --device cpu, unset on cuda; 0: unset)")
    ap.add_argument("--python-a", default=None, metavar="PYTHON",
                    help="side A's interpreter (default this one): with --python-b, compare two virtual environments "
                         "(two installed versions of a package) on the same checkout")
    ap.add_argument("--python-b", default=None, metavar="PYTHON", help="side B's interpreter (default this one)")
    ap.add_argument("--sequential", action="store_true",
                    help="run the two passes of a pair one after the other (default: lockstep, both at once taking "
                         "turns benchmark by benchmark, see inference_conformance.perf.lockstep)")
    ap.add_argument("--json", default=None, help="write the passes' medians and the decisions as JSON here")
    a = ap.parse_args(argv)
    for flag, py in (("--python-a", a.python_a), ("--python-b", a.python_b)):
        if py and not (shutil.which(py) or (Path(py).is_file() and os.access(py, os.X_OK))):
            ap.error(f"{flag}: {py!r} is not an executable interpreter")
    problem = check_impls(a.impl_a, a.impl_b)
    if problem:
        ap.error(problem)
    if not a.impl_a and (a.a is None or a.b is None):
        ap.error("--a and --b are required (without them, --impl-a and --impl-b compare two outside "
                 "implementations on this working tree)")
    a.a, a.b = a.a or str(ROOT), a.b or str(ROOT)
    if a.pairs < 3:
        ap.error("--pairs must be >= 3 (the t-test on the paired ratios has pairs - 1 degrees of freedom)")
    tmp = Path(tempfile.mkdtemp(prefix="ab-"))
    created = []
    try:
        ca, new_a = resolve_checkout(a.a, tmp, "a")
        created += [ca] if new_a else []
        cb, new_b = resolve_checkout(a.b, tmp, "b")
        created += [cb] if new_b else []
        timer = a.timer or ("wall" if a.device == "cuda" else "cpu")
        env = settings.pinned_env(a.device, a.threads)
        passes = session(ca, cb, a.pairs, workdir=tmp, k=a.k, device=a.device, env_a=env, env_b=env,
                         args_a=timer_args(timer) + impl_args(a.impl_a),
                         args_b=timer_args(timer) + impl_args(a.impl_b), lockstep=not a.sequential,
                         python_a=a.python_a, python_b=a.python_b,
                         max_time=a.max_time or (1.0 if a.device == "cuda" else 0.2))
    except ValueError as exc:
        print(f"ab: {exc}", file=sys.stderr)
        return 2
    finally:
        for c in created:
            remove_checkout(c)
        shutil.rmtree(tmp, ignore_errors=True)
    empty = sorted({f"{p['side'].upper()} (pair {p['pair'] + 1})" for p in passes if not p["records"]})
    if empty:
        print(f"ab: no benchmark results from side {', '.join(empty)}: its pytest process failed or selected "
              f"nothing; run it alone to see why (python -m pytest benchmarks --benchmark-enable -k ... in that "
              f"checkout, with that interpreter and its --impl options)", file=sys.stderr)
        return 2
    diffs, warns = settings_compare.check_passes(passes, {"timer": timer, "env": env}, fingerprint(a.device))
    for w in warns:
        print(f"ab: warning: {w}", file=sys.stderr)
    if diffs:
        print(f"ab: error: the passes were measured differently: {'; '.join(diffs)}: their times are not "
              f"comparable (give both sides the same timer, threads and pinned environment)", file=sys.stderr)
        return 2
    decisions = decide(passes, threshold=a.threshold, alpha=a.alpha)
    print(f"ab: A={side_label(a.a, a.impl_a)} B={side_label(a.b, a.impl_b)}, {a.pairs} "
          f"{'sequential' if a.sequential else 'lockstep'} pairs, {timer} timer (threshold {a.threshold:.0%}, "
          f"run-level alpha {a.alpha:g}, Holm)")
    code = print_decisions(decisions)
    for line in gate_modes.statement("ab", f"interleaved A/B, {a.pairs} {'sequential' if a.sequential else 'lockstep'} "
                                     f"pairs", a.pairs, prog="ab"):
        print(line)
    if a.json:
        Path(a.json).write_text(json.dumps({
            "a": a.a, "b": a.b, "impl_a": a.impl_a, "impl_b": a.impl_b,
            "pairs": a.pairs, "threshold": a.threshold, "alpha": a.alpha,
            "passes": [{"side": p["side"], "pair": p["pair"], "seconds": p["seconds"], "medians": medians(p["records"])}
                       for p in passes],
            "implementations": implementations(passes),
            "decisions": [asdict(d) for d in decisions]}, indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main())
