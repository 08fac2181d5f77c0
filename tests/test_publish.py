"""The report run loses nothing and never mixes runs, driven through the real command
(``python -m inference_conformance.reports`` in a subprocess, on the tiniest selection; a run
killed in its report stage starts from the rows of one complete run made once per module,
``--no-properties``): SIGKILL at each write point
(``CONFORMANCE_KILL_AT``) leaves no truncated file and the previous complete report published,
and ``--no-run`` then says the newest run was interrupted; a second concurrent run is refused;
SIGKILL or SIGTERM of the parent leaves no live child; an unmarked ``--out`` is refused and left
untouched."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inference_conformance.conformance import atomic
from inference_conformance.perf import env, history
from inference_conformance.reports import build, faults, publish

ROOT = Path(__file__).resolve().parent.parent
QUICK = ["--select", "tests/test_fields.py", "-n", "0", "--no-bench"]
#: One benchmark over the baseline's rows (--no-properties: the properties child is QUICK's, tested above).
BENCH = ["--no-properties", "--bench-k", "test_bench_prefill and 128-torch-64-full",
         "--bench-max-time", "0.01", "--quick-ceilings"]
#: The write points of a --no-bench run before its run is complete (``publish``, after it, has its own test).
POINTS = ["manifest.json", "properties", "*.png", "index.html", "report.md", "results.json"]
#: A run from the baseline's rows (made once per module): no properties child, straight to the
#: report stage, whose write points (the plots, index.html, report.md, results.json, publish) are
#: those of a full run; the points before it (its manifest, the properties child) take QUICK.
REUSE = ["--no-properties", "--no-bench"]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups and /proc: Linux")


def reports(out: Path, hist: Path, *args: str, kill_at: str | None = None, wait: bool = True):
    # the run's own pytest children must not believe they are this test's xdist workers
    e = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT_TEST"))}
    e["CI"] = "true"
    e.pop(atomic.KILL_ENV, None)
    if kill_at:
        e[atomic.KILL_ENV] = kill_at
    # --device cpu: the device is not what these tests are about, and the parent then needs no torch
    cmd = [sys.executable, "-m", "inference_conformance.reports", "--out", str(out), "--history", str(hist), "--device", "cpu", *args]
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=300)


def two_entries(hist: Path) -> None:
    """Two history entries of this machine's series, so that the report draws the history plot."""
    fp = env.fingerprint("cpu")
    rec = {"fullname": "benchmarks/bench_x.py::test_x", "name": "test_x", "stats": {"median": 1e-3}}
    for i in range(2):
        history.append(history.make_entry(dict(fp, date=f"2026-01-0{i + 1}T00:00:00Z", commit=f"{i:040d}"),
                                          [rec]), hist)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """One complete quick run: its output folder and history folder."""
    base = tmp_path_factory.mktemp("baseline")
    two_entries(base / "history")
    r = reports(base / "out", base / "history", *QUICK)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return base


def copy_of(baseline: Path, tmp_path: Path) -> tuple[Path, Path, str]:
    shutil.copytree(baseline, tmp_path / "b", symlinks=True)
    out = tmp_path / "b" / "out"
    return out, tmp_path / "b" / "history", publish.published(out)


def assert_nothing_truncated(*roots: Path) -> None:
    found = faults.check_tree(*roots)
    assert found["truncated"] == [], found


@pytest.mark.parametrize("point", POINTS)
def test_sigkill_at_a_write_point_keeps_the_previous_complete_report(baseline, tmp_path, point):
    out, hist, before = copy_of(baseline, tmp_path)
    r = reports(out, hist, *(QUICK if point in ("manifest.json", "properties") else REUSE), kill_at=point)
    assert r.returncode == -signal.SIGKILL, f"the run was not killed at {point!r}: exit {r.returncode}\n{r.stderr[-1500:]}"
    assert_nothing_truncated(out, hist)
    assert publish.published(out) == before, "the killed run replaced the published report"
    assert faults.check_published(out) == []
    killed = publish.runs(out, settle=False)[0]
    assert killed["id"] != before and killed["status"] == "running", killed
    shown = reports(out, hist, "--no-run")
    assert shown.returncode == 0, shown.stderr
    assert f"The newest run, {killed['id']}" in shown.stderr and "was interrupted" in shown.stderr, shown.stderr
    md = (out / "report.md").read_text()
    assert "**Warning:** The newest run" in md and f"showing the rows of run `{before}`" in md, md[:1500]
    assert publish.read_manifest(out / "runs" / killed["id"])["status"] == "interrupted"
    found = faults.check_tree(out, hist)
    assert found == {"truncated": [], "leftovers": []}, found
    assert faults.check_published(out) == []


def test_sigkill_between_complete_and_published_leaves_a_complete_run_to_render(baseline, tmp_path):
    out, hist, before = copy_of(baseline, tmp_path)
    r = reports(out, hist, *REUSE, kill_at="publish")
    assert r.returncode == -signal.SIGKILL, r.stderr[-1500:]
    assert publish.published(out) == before and faults.check_published(out) == []
    killed = publish.runs(out, settle=False)[0]
    assert killed["id"] != before and killed["status"] == "complete", killed
    shown = reports(out, hist, "--no-run")
    assert shown.returncode == 0 and "interrupted" not in shown.stderr, shown.stderr
    assert f"showing the rows of run `{killed['id']}`" in (out / "report.md").read_text()
    assert faults.check_tree(out, hist) == {"truncated": [], "leftovers": []}


def test_sigkill_while_the_history_entry_is_written(baseline, tmp_path):
    out, hist, before = copy_of(baseline, tmp_path)
    entries = sorted(p.name for p in hist.rglob("*.json"))
    r = reports(out, hist, *BENCH, kill_at="[0-9]*T*-*.json")
    assert r.returncode == -signal.SIGKILL, r.stderr[-1500:]
    assert_nothing_truncated(out, hist)
    assert sorted(p.name for p in hist.rglob("*.json")) == entries, "a half-written entry under its final name"
    assert publish.published(out) == before
    done = reports(out, hist, *BENCH)
    assert done.returncode == 0, done.stderr[-1500:]
    assert faults.check_tree(out, hist) == {"truncated": [], "leftovers": []}
    assert len(list(hist.rglob("*.json"))) == len(entries) + 1
    assert faults.check_published(out) == []


def test_no_run_without_a_complete_run_is_refused(tmp_path):
    r = reports(tmp_path / "out", tmp_path / "h", *QUICK, kill_at="properties")
    assert r.returncode == -signal.SIGKILL
    shown = reports(tmp_path / "out", tmp_path / "h", "--no-run")
    assert shown.returncode == 2, shown.stderr
    assert "holds no complete run to render from" in shown.stderr and "was interrupted" in shown.stderr, shown.stderr
    assert not (tmp_path / "out" / publish.CURRENT).exists()


def _wait_for(cond, what: str, timeout: float = 120.0):
    t = time.time()
    while time.time() - t < timeout:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def _running_child(out: Path, proc) -> tuple[dict, int]:
    """The manifest of the run ``proc`` is doing, once its properties child writes rows."""
    def ready():
        assert proc.poll() is None, f"the run ended early: {proc.communicate()}"
        found = publish.runs(out, settle=False) if (out / "runs").is_dir() else []
        m = found[0] if found else None
        if m and m.get("child_pgid") and list((m["folder"] / publish.ROWS_PARTIAL).glob("*.jsonl")):
            return m
        return None

    m = _wait_for(ready, "the properties child to write rows")
    return m, m["child_pgid"]


#: The refused second run's selection (it never starts): not the first run's, so that the published
#: rows say whose they are.
OTHER = ["--select", "properties/roofline/test_roofline.py", "-n", "0", "--no-bench"]
#: Rows within a second of the worker's start (tests/test_fields.py first), then tens of seconds of
#: work (the allocator's state machine, 500 examples per law): killed after its first rows.
LONG = ["--select", "tests/test_fields.py", "--select", "properties/paged_attention/test_block_allocator.py",
        "--profile", "thorough", "-n", "1", "--no-bench"]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_parent_killed_leaves_no_live_child(tmp_path, sig):
    out = tmp_path / "out"
    proc = reports(out, tmp_path / "h", *LONG, wait=False)
    m, pgid = _running_child(out, proc)
    members = publish.group_members(pgid)
    assert len(members) >= 3, f"expected the group leader, pytest and its workers in group {pgid}: {members}"
    proc.send_signal(sig)
    rc = proc.wait(timeout=60)
    assert rc == (-sig if sig == signal.SIGKILL else 128 + sig), (rc, proc.stderr.read())
    _wait_for(lambda: publish.group_members(pgid) == [], f"group {pgid} ({members}) to die", timeout=3)
    assert all(not publish.alive(p) for p in members), members
    rows = m["folder"] / publish.ROWS_PARTIAL
    sizes = {p: p.stat().st_size for p in rows.rglob("*.jsonl")}
    time.sleep(1.0)
    assert {p: p.stat().st_size for p in rows.rglob("*.jsonl")} == sizes, "rows still being written"
    status = publish.read_manifest(m["folder"])
    if sig == signal.SIGTERM:
        assert status["status"] == "interrupted" and "SIGTERM" in status["reason"], status
        assert "interrupted (stopped by SIGTERM)" in proc.stderr.read()


def test_a_second_concurrent_run_is_refused(tmp_path):
    out = tmp_path / "out"
    # after its first rows the first run holds the lock for seconds (its other tests, the child's
    # exit, the report stage); the second is refused in a fraction of one
    first = reports(out, tmp_path / "h", *QUICK, wait=False)
    _running_child(out, first)
    t = time.time()
    second = reports(out, tmp_path / "h", *OTHER)
    assert second.returncode == 2, second.stderr
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and str(out) in lines[0] and f"pid {first.pid}" in lines[0], lines
    assert time.time() - t < 30
    assert first.wait(timeout=300) == 0, first.communicate()
    assert len(publish.runs(out, settle=False)) == 1, "the refused run left a run folder"
    assert faults.check_published(out) == []
    doc = json.loads((out / "results.json").read_text())
    assert {r["check"].split("::")[0] for r in doc["rows"]} == {"tests/test_fields.py"}


def test_a_stale_lock_of_a_dead_process_is_taken_over(baseline, tmp_path):
    out, hist, _ = copy_of(baseline, tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (out / publish.LOCK).write_text(f"{dead.pid} 2026-01-01T00:00:00Z\n")
    r = reports(out, hist, "--no-run")
    assert r.returncode == 0, r.stderr
    assert f"took over the lock of {out} from pid {dead.pid}, no longer running" in r.stderr


def test_an_unmarked_folder_is_refused_and_left_as_it_was(tmp_path):
    home = tmp_path / "home"
    (home / "rows").mkdir(parents=True)
    (home / "rows" / "mine.jsonl").write_text("keep\n")
    (home / "notes.txt").write_text("keep\n")
    (home / "plots").mkdir()
    (home / "plots" / "mine.png").write_bytes(b"keep")
    before = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    for args in (QUICK, ["--no-run"]):
        r = reports(home, tmp_path / "h", *args)
        assert r.returncode == 2, r.stderr
        assert f"--out {home} is not a report folder" in r.stderr and "nothing was written or removed" in r.stderr
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == before
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    r = reports(a_file, tmp_path / "h", *QUICK)
    assert r.returncode == 2 and "is a file, not a folder" in r.stderr, r.stderr


def test_prepare_out_marks_new_and_empty_folders_and_adopts_only_the_default_legacy_one(tmp_path):
    new, empty, legacy = tmp_path / "a" / "new", tmp_path / "empty", tmp_path / "legacy"
    empty.mkdir()
    (legacy / "rows").mkdir(parents=True)
    (legacy / "index.html").write_text("old")
    assert publish.prepare_out(new) == [] and publish.is_marked(new)
    assert publish.prepare_out(empty) == [] and publish.is_marked(empty)
    with pytest.raises(publish.Refused, match="is not a report folder"):
        publish.prepare_out(legacy)
    assert "adopted" in publish.prepare_out(legacy, default=legacy)[0] and publish.is_marked(legacy)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "thesis.tex").write_text("x")
    with pytest.raises(publish.Refused, match="thesis.tex"):
        publish.prepare_out(tmp_path / "other", default=tmp_path / "other")


def test_plots_are_removed_only_in_a_marked_folder(tmp_path):
    from tests.test_report import make_synthetic

    s = make_synthetic(tmp_path / "s")
    kw = dict(bench_json=s["bench_json"], ceilings=s["ceilings"], fp=s["fp"], history_dir=s["history"])
    for out, marked in ((tmp_path / "plain", False), (tmp_path / "marked", True)):
        (out / "plots").mkdir(parents=True)
        (out / "plots" / "someone-elses.png").write_bytes(b"x")
        if marked:
            publish.mark(out)
        build.write_report(s["rows_dir"], out, **kw)
        assert (out / "plots" / "someone-elses.png").exists() is not marked, out
        assert (out / "plots" / "roofline.png").stat().st_size > 1000
    with pytest.raises(publish.Refused, match="not inside a folder the suite made"):
        publish.remove_tree(tmp_path / "plain" / "plots", tmp_path / "plain")


def test_an_atomic_write_killed_halfway_leaves_the_old_file(tmp_path):
    target = tmp_path / "results.json"
    target.write_text('{"old": true}')
    code = ("import sys; from conformance import atomic; "
            "atomic.write_text(sys.argv[1], '{\"new\": ' + '1' * 100000 + '}')")
    e = dict(os.environ, **{atomic.KILL_ENV: "results.json"})
    r = subprocess.run([sys.executable, "-c", code, str(target)], cwd=ROOT, env=e, capture_output=True)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert json.loads(target.read_text()) == {"old": True}
    left = [p for p in tmp_path.iterdir() if atomic.is_partial(p)]
    assert len(left) == 1 and 0 < left[0].stat().st_size < 100000, left
    assert atomic.sweep(tmp_path) == left and not left[0].exists()
    atomic.write_text(target, '{"new": 1}')
    assert json.loads(target.read_text()) == {"new": 1} and os.stat(target).st_mode & 0o777 == 0o644


def test_old_run_folders_are_pruned_but_never_the_published_one(tmp_path):
    out = tmp_path / "out"
    publish.prepare_out(out)
    made = []
    for _ in range(publish.KEEP + 2):
        run = publish.Run(out, "run", [])
        run.finish("complete")
        made.append(run)
        time.sleep(0.002)
    publish.publish(out, made[0])
    gone = publish.prune(out)
    left = {m["id"] for m in publish.runs(out, settle=False)}
    assert left == {made[0].id} | {r.id for r in made[-publish.KEEP:]}, (left, gone)
    assert len(gone) == 1 and (out / publish.MANIFEST).is_symlink()


def test_a_run_without_benchmarks_publishes_no_link_to_nothing(tmp_path):
    """A run that made no benchmarks.json and no plots (--no-bench) publishes no link to them, and
    removes the links an earlier run left: every published name is a link to something."""
    out = tmp_path / "out"
    publish.prepare_out(out)
    full = publish.Run(out, "run", [])
    (full.folder / "benchmarks.json").write_text("{}")
    (full.folder / "plots").mkdir()
    full.finish("complete")
    publish.publish(out, full)
    assert (out / "benchmarks.json").is_file() and (out / "plots").is_dir()
    bare = publish.Run(out, "run", [])
    bare.finish("complete")
    publish.publish(out, bare)
    links = [p for p in out.iterdir() if p.is_symlink()]
    assert links and all(p.exists() for p in links), [p.name for p in links if not p.exists()]
    assert not os.path.lexists(out / "benchmarks.json") and not os.path.lexists(out / "plots")
