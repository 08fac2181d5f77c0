"""Lockstep A/B (inference_conformance.perf.lockstep) and the benchmark process's settings: the two sides run
their tests and the timed rounds inside a benchmark in turns, never at the same time; a side
alone does not hang; the pytest plugin keeps the order through real pytest processes; the pinned
benchmark environment; pedantic rounds that fill the time budget."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import types

import pytest

from inference_conformance.perf import lockstep, settings
from inference_conformance.perf.env import ROOT


def test_common_order_is_side_a_order_of_the_shared_ids():
    assert lockstep.common_order(["x", "y", "z", "w"], ["w", "q", "y", "x"]) == ["x", "y", "w"]


def test_bad_settings_are_refused(tmp_path):
    with pytest.raises(ValueError, match="BENCH_LOCKSTEP_SIDE"):
        lockstep.Lockstep(tmp_path, "c")
    with pytest.raises(ValueError, match="BENCH_LOCKSTEP_CHUNK"):
        lockstep.Lockstep(tmp_path, "a", chunk=0)


def _side(folder, side, items, log, lock, first="a"):
    ls = lockstep.Lockstep(folder, side, first=first, timeout=20)
    ls.exchange(items)
    for n in items:
        ls.before(n)
        with lock:
            log.append((side, n, "start"))
        time.sleep(0.01)
        with lock:
            log.append((side, n, "end"))
        ls.after(n)
    ls.exit()


@pytest.mark.parametrize("first", ["a", "b"])
def test_two_sides_take_turns_and_never_overlap(tmp_path, first):
    items = [f"t{i}" for i in range(5)]
    log, lock = [], threading.Lock()
    threads = [threading.Thread(target=_side, args=(tmp_path, s, items, log, lock, first)) for s in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    starts = [(s, n) for s, n, what in log if what == "start"]
    assert [s for s, _ in starts] == [first, lockstep.other(first)] * 5
    assert [n for _, n in starts] == [n for n in items for _ in range(2)]
    # no overlap: every start is followed by its own end before the next start
    assert all(log[i][:2] == log[i + 1][:2] and log[i][2] == "start" for i in range(0, len(log), 2))


def test_a_side_alone_does_not_hang(tmp_path):
    (tmp_path / "exit-b").touch()
    ls = lockstep.Lockstep(tmp_path, "a", first="b", timeout=20)
    t0 = time.monotonic()
    assert ls.exchange(["t0", "t1"]) == []
    ls.before("t0")  # not its turn, but the other side is gone
    assert time.monotonic() - t0 < 5 and ls.holding


def test_a_side_whose_partner_stops_answering_goes_on_after_the_timeout(tmp_path):
    ls = lockstep.Lockstep(tmp_path, "b", timeout=0.05)
    (tmp_path / "items-a.json").write_text(json.dumps(["t0"]))
    assert ls.exchange(["t0"]) == ["t0"]
    ls.before("t0")  # A holds the token first and never gives it back
    assert ls.unpaired == 1


def _run_sides(tmp_path, tests_dir: str, extra_b: list[str] | None = None, chunk: float = 0.05):
    procs = []
    for side in "ab":
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # not an xdist worker
        env.update(PYTHONPATH=str(ROOT), **{lockstep.DIR_ENV: str(tmp_path), lockstep.SIDE_ENV: side,
                                            lockstep.CHUNK_ENV: str(chunk)})
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "inference_conformance.perf.lockstep",
                "--benchmark-enable", tests_dir] + (extra_b or [] if side == "b" else [])
        procs.append(subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out.decode()[-2000:]
    assert (tmp_path / "exit-a").exists() and (tmp_path / "exit-b").exists()


def test_plugin_orders_real_pytest_processes(tmp_path):
    """Two pytest processes with ``-p inference_conformance.perf.lockstep``, one test only side B has."""
    tests = tmp_path / "tests"
    tests.mkdir()
    body = "import time\n" + "".join(f"def test_{i}():\n    time.sleep(0.02)\n" for i in range(3))
    (tests / "test_a.py").write_text(body)
    (tests / "test_b.py").write_text(body)
    (tmp_path / "test_only_b.py").write_text("def test_b_only():\n    pass\n")
    _run_sides(tmp_path, tests.name, ["test_only_b.py"])
    rows = []
    for side in "ab":
        for line in (tmp_path / f"timeline-{side}.jsonl").read_text().splitlines():
            r = json.loads(line)
            rows.append((r["start"], r["end"], side, r["nodeid"]))
    rows.sort()
    common = [r for r in rows if "only_b" not in r[3]]
    assert [s for _, _, s, _ in common] == ["a", "b"] * 6
    assert all(rows[i][1] <= rows[i + 1][0] for i in range(len(rows) - 1)), "two sides overlapped"


def test_timed_rounds_of_the_two_sides_alternate_in_chunks(tmp_path):
    """Inside ``benchmark.pedantic`` the sides hand the token over between rounds: their timed
    rounds interleave (several switches within one benchmark) and never overlap."""
    (tmp_path / "test_bench.py").write_text(
        "import json, os, time\n"
        "def test_rounds(benchmark):\n"
        "    log = open(os.environ['ROUND_LOG'] + os.environ['BENCH_LOCKSTEP_SIDE'], 'a')\n"
        "    def run():\n"
        "        t0 = time.time(); time.sleep(0.004); log.write(json.dumps([t0, time.time()]) + '\\n')\n"
        "    benchmark.pedantic(run, rounds=40, warmup_rounds=0)\n"
        "    log.close()\n")
    os.environ["ROUND_LOG"] = str(tmp_path / "rounds-")
    try:
        _run_sides(tmp_path, "test_bench.py", chunk=0.02)
    finally:
        del os.environ["ROUND_LOG"]
    rounds = sorted((t0, t1, side) for side in "ab"
                    for t0, t1 in map(json.loads, (tmp_path / f"rounds-{side}").read_text().splitlines()))
    assert len(rounds) == 80
    assert all(rounds[i][1] <= rounds[i + 1][0] for i in range(len(rounds) - 1)), "timed rounds overlapped"
    switches = sum(rounds[i][2] != rounds[i + 1][2] for i in range(len(rounds) - 1))
    assert switches >= 6, f"only {switches} switches between the sides' rounds"


def test_pinned_env_pins_threads_and_allocator_on_cpu_only():
    cpu = settings.pinned_env("cpu")
    assert cpu["OMP_NUM_THREADS"] == "1" and "MALLOC_MMAP_THRESHOLD_" in cpu and "MALLOC_TRIM_THRESHOLD_" in cpu
    assert "OMP_NUM_THREADS" not in settings.pinned_env("cpu", 0)
    assert settings.pinned_env("cuda") == {} and settings.pinned_env("cuda", 4) == {"OMP_NUM_THREADS": "4"}


class _FakeBenchmark:
    def __init__(self, disabled=False, max_time=0.2):
        self.disabled, self._max_time = disabled, max_time


def test_pedantic_rounds_fill_the_time_budget():
    from inference_conformance.benchmarks.timing import MAX_ROUNDS, rounds

    assert rounds(_FakeBenchmark(), 0.001, 10) == 200           # 0.2 s of 1 ms calls
    assert rounds(_FakeBenchmark(), 0.5, 10) == 10              # a slow call keeps the minimum
    assert rounds(_FakeBenchmark(), 1e-7, 10) == MAX_ROUNDS     # capped
    assert rounds(_FakeBenchmark(disabled=True), 0.001, 3) == 3  # smoke runs stay short
    assert rounds(_FakeBenchmark(), 0.0, 7) == 7


def test_exclusive_holds_the_token_for_work_outside_the_tests(tmp_path):
    """A probe at the end of a pass (the ceilings) waits for its turn and hands the token back;
    without lockstep it just runs. The token is the run's (its config's stash), not the module's."""
    config = types.SimpleNamespace(stash=pytest.Stash())
    with lockstep.exclusive(config):
        pass  # no lockstep state: a no-op
    assert lockstep.state(config) is None and lockstep.state(None) is None
    ls = lockstep.Lockstep(tmp_path, "b", first="a", timeout=20)
    config.stash[lockstep.STATE_KEY] = ls
    assert lockstep.state(types.SimpleNamespace(stash=pytest.Stash())) is None  # another run: its own state
    turned = threading.Event()

    def side_a():
        time.sleep(0.2)
        turned.set()
        (tmp_path / "turn").write_text("b")

    threading.Thread(target=side_a).start()
    with lockstep.exclusive(config):
        assert turned.is_set() and ls.holding  # waited for A to hand over
    assert not ls.holding and (tmp_path / "turn").read_text() == "a"


def test_injection_plugin_writes_the_pass_ceilings(tmp_path):
    """``BENCH_CEILINGS_OUT``: the pass's quick ceilings, measured at the end of its session (the
    calibration compares normalising by them with the raw between-run noise)."""
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    out = tmp_path / "c.json"
    env = dict(os.environ, BENCH_CEILINGS_OUT=str(out), PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "inference_conformance.perf.inject", "-p", "no:cacheprovider",
                    "--rootdir", str(tmp_path), str(tmp_path / "test_x.py")], env=env, cwd=tmp_path,
                   check=True, capture_output=True, timeout=120)
    doc = json.loads(out.read_text())
    assert "error" not in doc, doc
    assert doc["copy_bytes_per_s"] > 0 and doc["matmul_flops_per_s"]["float32"] > 0
