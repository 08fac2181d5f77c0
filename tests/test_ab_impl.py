"""Benchmarks of outside implementations and the A/B mode between two ``--impl`` targets: the
rows of an outside implementation are named by their place (``impl``, ``impl2``), never by the
target, so two sides with different targets pair up; without ``--impl`` the ids are those of the
committed history; an A/B session of the worked example against the same function computed twice
(``tests/slowed_attention.py``) finds the slowdown, and the same target on both sides does not."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from inference_conformance.perf import ab, settings

ROOT = Path(__file__).resolve().parents[1]
PLAIN, SLOWED = "attention=my_attention:attention", "attention=tests.slowed_attention:attention"
QUANT = "quantization=my_quantization:quantization"


def _env() -> dict[str, str]:
    """This environment for a pytest process of its own: examples/ importable, not an xdist worker."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "examples"), env.get("PYTHONPATH")) if p)
    return env


def _collected(*runs: list[str], args=ab.impl_args) -> list[list[str]]:
    """The benchmark ids ``pytest benchmarks --collect-only`` lists with each run's ``--impl``
    targets, as ``args`` hands them over (the runs' processes at once: collection is mostly imports)."""
    procs = [subprocess.Popen([sys.executable, "-m", "pytest", "benchmarks", "--collect-only", "-q", "-p",
                               "no:cacheprovider", "--device", "cpu"] + args(impls),
                              cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for impls in runs]
    out = []
    for proc in procs:
        text, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, text[-3000:]
        out.append([line for line in text.splitlines() if "::" in line])
    return out


def _committed_names() -> set[str]:
    """Benchmark names the committed CPU history uses."""
    names = set()
    for path in sorted((ROOT / "history").glob("cpu-*/*.json")):
        names |= {b["fullname"] for b in json.loads(path.read_text())["benchmarks"]}
    return names


def _outside_backends(ids: list[str]) -> dict[str, set[str]]:
    """test function -> the ``impl*`` parts of its ids."""
    out: dict[str, set[str]] = {}
    for i in ids:
        test, params = i.split("::")[-1].rstrip("]").split("[")
        out.setdefault(test, set()).update(p for p in params.split("-") if p.startswith("impl"))
    return out


def test_benchmark_ids_without_impl_unchanged_with_impl_named_by_place():
    """Without ``--impl``: the ids of the committed history, no outside row. With it: only the
    outside rows run, ``impl``/``impl2`` by order per technique, never the target."""
    plain, outside = _collected([], [PLAIN, SLOWED, QUANT, "kv_cache=inference_conformance.optimized.kv_cache:TORCH"])
    committed = _committed_names()
    assert committed, "no committed CPU history to compare with"
    missing = sorted(committed - set(plain))
    assert not missing, f"ids of the committed history no longer collected: {missing}"
    assert not [i for i in plain if "-impl" in i or "[impl" in i]
    assert outside and not [i for i in outside if "my_" in i or "slowed" in i or "engine" in i], outside
    assert _outside_backends(outside) == {
        "test_bench_prefill": {"impl", "impl2"}, "test_bench_decode": {"impl", "impl2"},
        "test_bench_window_and_sinks_overhead": {"impl", "impl2"}, "test_bench_quant_matmul": {"impl"},
        "test_ai8_prefill_vs_decode": {"impl"},
        "test_kv3_generation_with_and_without_cache": {"impl"}, "test_ai9_decode_step": {"impl"},
        "test_ai9_batch_scaling": {"impl"}}, outside
    assert "benchmarks/bench_attention.py::test_bench_prefill[128-impl2-64-causal]" in outside


def test_impl_benchmarks_keep_the_builtin_rows_beside_the_outside_ones():
    """A plain ``--impl`` benchmark run (not the A/B mode, which passes --outside-bench-only):
    each benchmark with an outside row keeps its built-in rows, so the outside kernel and the
    suite's Triton and PyTorch versions are timed in one pinned run; benchmarks without an outside
    row (another technique's) are not run."""
    (side,) = _collected([PLAIN], args=lambda impls: [x for t in impls for x in ("--impl", t)])
    prefill = [i for i in side if "::test_bench_prefill[" in i]
    backends = {p for i in prefill for p in i.split("[")[1].rstrip("]").split("-")}
    assert {"impl", "triton", "torch"} <= backends, prefill
    assert not [i for i in side if "bench_quantization" in i], side
    assert ab.impl_args([PLAIN])[-1] == "--outside-bench-only"


ROW = "benchmarks/bench_attention.py::test_bench_prefill[128-{}-64-causal]"


def test_ab_between_two_impl_targets(tmp_path, monkeypatch):
    """Real passes, lockstep, on the smallest attention row: two outside rows per side, ``impl``
    the same target on both sides (A/A), ``impl2`` the plain example on A and the same function
    computed twice on B. The rows pair up by name; the doubled one measures a ratio of about 2,
    the A/A one about 1. Two pairs keep it short (each pass is a pytest process, ~3 s of imports):
    too few for the t-test to be sure of the doubling (main asks for 3 or more), so the test
    asserts the ratios and that the A/A row is no regression, which at the 50% threshold it can
    never be (paired sd 0.03-0.12 here), whatever the load."""
    for k, v in _env().items():
        monkeypatch.setenv(k, v)
    for k in [k for k in os.environ if k.startswith("PYTEST_")]:
        monkeypatch.delenv(k)
    timer = ab.timer_args("cpu")
    env = settings.pinned_env("cpu")
    passes = ab.session(ROOT, ROOT, 2, workdir=tmp_path, env_a=env, env_b=env,
                        args_a=timer + ab.impl_args([PLAIN, PLAIN]), args_b=timer + ab.impl_args([PLAIN, SLOWED]),
                        k="prefill and 128 and 64 and causal", max_time=0.05, log=lambda *_: None)
    plain_row, slowed_row = ROW.format("impl"), ROW.format("impl2")
    assert [sorted(ab.medians(p["records"])) for p in passes] == [[plain_row, slowed_row]] * 4
    decisions = {d.name: d for d in ab.decide(passes, threshold=0.5)}
    # about 2 on an idle machine; 1.5 measured beside a loaded xdist worker (shared caches and
    # memory bandwidth), so the floor is 1.3 and above the A/A row's ratio
    assert decisions[slowed_row].ratio > max(1.3, 1.15 * decisions[plain_row].ratio), decisions
    assert 0.67 < decisions[plain_row].ratio < 1.5 and decisions[plain_row].status != "regression", decisions
    a, b = PLAIN.split("=")[1], SLOWED.split("=")[1]
    assert ab.implementations(passes) == {"a": {plain_row: a, slowed_row: a}, "b": {plain_row: a, slowed_row: b}}


def test_ab_command_hands_each_side_its_targets_and_names_them(tmp_path, monkeypatch, capsys):
    """``python -m inference_conformance.perf.ab --impl-a ... --impl-b ...``: both sides on this working tree, each
    side's passes get its ``--impl`` options, the output and the JSON name the targets (the
    passes are stood in for: a doubled ``impl2`` row on B, three pairs)."""
    seen = {}

    def session(a, b, pairs, **kw):
        seen.update(a=a, b=b, pairs=pairs, **kw)
        rec = [{"fullname": ROW.format(n), "stats": {"median": m}, "extra_info": {"implementation": t}}
               for n, m, t in (("impl", 1.0, "x"), ("impl2", 1.0, "y"))]
        slowed = [[rec[0], dict(rec[1], stats={"median": 2.0 + 0.01 * i})] for i in range(pairs)]
        return [p for i in range(pairs) for p in ({"side": "a", "pair": i, "seconds": 1, "records": rec},
                                                  {"side": "b", "pair": i, "seconds": 1, "records": slowed[i]})]

    monkeypatch.setattr(ab, "session", session)
    out = tmp_path / "ab.json"
    code = ab.main(["--impl-a", PLAIN, "--impl-b", SLOWED, "--impl-a", QUANT, "--impl-b", QUANT,
                    "--pairs", "3", "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 1, text
    assert (seen["a"], seen["b"], seen["k"]) == (ROOT, ROOT, None)
    assert seen["args_a"][-5:] == ["--impl", PLAIN, "--impl", QUANT, "--outside-bench-only"]
    assert seen["args_b"][-5:] == ["--impl", SLOWED, "--impl", QUANT, "--outside-bench-only"]
    assert f"--impl {PLAIN} --impl {QUANT} B=" in text and f"--impl {SLOWED} --impl {QUANT}," in text, text
    assert "REGRESSION" in text and ROW.format("impl2") in text, text
    doc = json.loads(out.read_text())
    assert doc["impl_a"] == [PLAIN, QUANT] and doc["impl_b"] == [SLOWED, QUANT]
    assert doc["implementations"]["b"] == {ROW.format("impl"): "x", ROW.format("impl2"): "y"}


@pytest.mark.parametrize("lockstep", [True, False], ids=["lockstep", "sequential"])
def test_both_designs_hand_each_side_its_impl_options(tmp_path, monkeypatch, lockstep):
    """The passes' command lines (:func:`inference_conformance.perf.ab.pass_command`) carry each side's ``--impl``,
    in lockstep pairs and in sequential passes alike (the passes themselves do nothing here)."""
    seen: dict[str, list[str]] = {}
    real = ab.pass_command

    def spy(checkout, out_json, **kw):
        cmd, env = real(checkout, out_json, **kw)
        seen[Path(out_json).stem[-1]] = cmd
        return [sys.executable, "-c", ""], env

    monkeypatch.setattr(ab, "pass_command", spy)
    ab.session(ROOT, ROOT, 1, workdir=tmp_path, args_a=ab.impl_args([PLAIN, QUANT]),
               args_b=ab.impl_args([SLOWED, QUANT]), lockstep=lockstep, log=lambda *_: None)
    assert seen["a"][-5:] == ["--impl", PLAIN, "--impl", QUANT, "--outside-bench-only"]
    assert seen["b"][-5:] == ["--impl", SLOWED, "--impl", QUANT, "--outside-bench-only"]


@pytest.mark.parametrize("argv, message", [
    (["--impl-a", PLAIN], "--impl-a needs --impl-b"),
    (["--impl-b", PLAIN], "--impl-b needs --impl-a"),
    (["--impl-a", PLAIN, "--impl-b", QUANT], "--impl-b: its techniques (quantization x1) differ"),
    (["--impl-a", PLAIN, "--impl-b", PLAIN, "--impl-b", SLOWED], "--impl-b: its techniques (attention x2)"),
    (["--impl-a", "attention", "--impl-b", PLAIN], "--impl-a: --impl expects TECHNIQUE=module:attr"),
    (["--impl-a", PLAIN, "--impl-b", "nosuch=m:f"], "--impl-b: --impl 'nosuch=m:f': unknown technique"),
    (["--a", "HEAD"], "--a and --b are required"),
])
def test_impl_flags_are_checked_before_anything_runs(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        ab.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_plugin_outside_rows_and_their_refusals(monkeypatch):
    """A benchmark's rows (``bench_rows``, what benchmarks import): ids by place, the target in extra_info, and a
    refusal of an outside row (only) made "unsupported"."""
    from inference_conformance.conformance import bench_rows, plugin, registry
    from inference_conformance.conformance.outcomes import Unsupported
    from inference_conformance.conformance.plugin_state import activated, state

    target = "inference_conformance.reference.attention:attention"
    config = types.SimpleNamespace(stash=pytest.Stash())       # a run's config: only its stash is read
    state(config).outside = {"attention": [registry.load_outside("attention", target)] * 2}
    assert bench_rows.bench_backends("attention", ("naive", "torch")) == ["naive", "torch"]  # no run active
    with activated(config):
        params = bench_rows.bench_backends("attention", ("naive", "torch"))
    assert params[:2] == ["naive", "torch"]
    assert plugin.bench_backends is bench_rows.bench_backends   # the plugin's name stays
    assert [(p.id, p.values, [m.args for m in p.marks]) for p in params[2:]] == [
        ("impl", ("impl",), [("attention",)]), ("impl2", ("impl2",), [("attention",)])]
    assert bench_rows.bench_backends("quantization", ("torch",), config) == ["torch"]
    assert bench_rows.outside_info("attention", "impl2", config) == {"implementation": target}
    assert bench_rows.outside_info("attention", "torch", config) == {}
    with pytest.raises(Unsupported, match=f"unsupported: {target} refused: no float32"):
        with bench_rows.outside_refusals("attention", "impl", config):
            raise NotImplementedError("no float32")
    with pytest.raises(NotImplementedError):  # a built-in's refusal stays an error
        with bench_rows.outside_refusals("attention", "torch", config):
            raise NotImplementedError("no float32")
    with pytest.raises(ValueError):  # anything else is not a refusal
        with bench_rows.outside_refusals("attention", "impl", config):
            raise ValueError("bad q")
