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
from pathlib import Path

import pytest

from reports import ab

ROOT = Path(__file__).resolve().parents[1]
PLAIN, SLOWED = "attention=my_attention:attention", "attention=tests.slowed_attention:attention"
QUANT = "quantization=my_quantization:quantization"


def _env() -> dict[str, str]:
    """This environment for a pytest process of its own: examples/ importable, not an xdist worker."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "examples"), env.get("PYTHONPATH")) if p)
    return env


def _collected(*impls: str) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "benchmarks", "--collect-only", "-q", "-p", "no:cacheprovider",
           "--device", "cpu"] + ab.impl_args(list(impls))
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return [line for line in proc.stdout.splitlines() if "::" in line]


def _committed_names() -> set[str]:
    """Benchmark names the committed CPU history and the gate's calibration use."""
    names = set()
    for path in sorted((ROOT / "history").glob("cpu-*/*.json")):
        names |= {b["fullname"] for b in json.loads(path.read_text())["benchmarks"]}
    return names


def test_without_impl_the_benchmark_ids_are_unchanged():
    ids = set(_collected())
    committed = _committed_names()
    assert committed, "no committed CPU history to compare with"
    assert committed <= ids, f"ids of the committed history no longer collected: {sorted(committed - ids)}"
    assert not [i for i in ids if "-impl" in i]


def test_with_impl_only_outside_rows_run_named_by_their_place():
    ids = _collected(PLAIN, SLOWED, QUANT, "kv_cache=optimized.engine:TORCH")
    assert ids and all("my_" not in i and "slowed" not in i and "engine" not in i for i in ids), ids
    backends = {i.split("[")[0].split("::")[-1]: set() for i in ids}
    for i in ids:
        backends[i.split("[")[0].split("::")[-1]].update(p for p in i[:-1].split("[")[1].split("-")
                                                          if p.startswith("impl"))
    assert backends == {"test_bench_prefill": {"impl", "impl2"}, "test_bench_decode": {"impl", "impl2"},
                        "test_bench_quant_matmul": {"impl"}, "test_ai8_prefill_vs_decode": {"impl"},
                        "test_kv3_generation_with_and_without_cache": {"impl"},
                        "test_ai9_decode_step": {"impl"}, "test_ai9_batch_scaling": {"impl"}}, ids
    assert "benchmarks/bench_attention.py::test_bench_prefill[128-impl2-64-causal]" in ids


def test_ab_between_two_impl_targets(tmp_path, monkeypatch, capsys):
    """One session, two outside rows per side: ``impl`` is the same target on both sides (A/A),
    ``impl2`` is the plain example on A and the same function computed twice on B (ratio ~2)."""
    for k, v in _env().items():
        monkeypatch.setenv(k, v)
    for k in [k for k in os.environ if k.startswith("PYTEST_")]:
        monkeypatch.delenv(k)
    out = tmp_path / "ab.json"
    code = ab.main(["--impl-a", PLAIN, "--impl-a", PLAIN, "--impl-b", PLAIN, "--impl-b", SLOWED,
                    "-k", "prefill and 128 and 64 and causal", "--pairs", "3", "--max-time", "0.05",
                    "--json", str(out)])
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())
    plain_row, slowed_row = (f"benchmarks/bench_attention.py::test_bench_prefill[128-{b}-64-causal]"
                             for b in ("impl", "impl2"))
    decisions = {d["name"]: d for d in doc["decisions"]}
    assert set(decisions) == {plain_row, slowed_row}, text
    assert decisions[slowed_row]["ratio"] > 1.3, text
    assert decisions[plain_row]["status"] != "regression", text
    assert code == (1 if decisions[slowed_row]["status"] == "regression" else 0)
    assert f"--impl {SLOWED}" in text and f"--impl {PLAIN}" in text, text
    assert doc["implementations"]["a"] == {plain_row: PLAIN.split("=")[1], slowed_row: PLAIN.split("=")[1]}
    assert doc["implementations"]["b"] == {plain_row: PLAIN.split("=")[1], slowed_row: SLOWED.split("=")[1]}


@pytest.mark.parametrize("lockstep", [True, False], ids=["lockstep", "sequential"])
def test_both_designs_hand_each_side_its_impl_options(tmp_path, monkeypatch, lockstep):
    """The passes' command lines (:func:`reports.ab.pass_command`) carry each side's ``--impl``,
    in lockstep pairs and in sequential passes alike (the passes themselves do nothing here)."""
    seen: dict[str, list[str]] = {}
    real = ab.pass_command

    def spy(checkout, out_json, **kw):
        cmd, env = real(checkout, out_json, **kw)
        seen[Path(out_json).stem[-1]] = cmd
        return [sys.executable, "-c", ""], env

    monkeypatch.setattr(ab, "pass_command", spy)
    ab.session(ROOT, ROOT, 1, workdir=tmp_path, args_a=ab.impl_args([PLAIN, QUANT]), args_b=ab.impl_args([SLOWED, QUANT]),
               lockstep=lockstep, log=lambda *_: None)
    assert seen["a"][-4:] == ["--impl", PLAIN, "--impl", QUANT] and seen["b"][-4:] == ["--impl", SLOWED, "--impl", QUANT]


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
