"""The one command, ``inference-conformance`` (``python -m inference_conformance``): its help lists
every subcommand; ``list`` imports no torch and agrees with the live registry; ``merge`` orders
a matrix's columns as the ledger does; outputs land in ``./inference-conformance-out``."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from inference_conformance import catalog, cli
from inference_conformance.conformance.results import Row, write_rows
from inference_conformance.conformance.runinfo import write_run
from inference_conformance.reports import publish
from inference_conformance.reports.ledger import claims

ROOT = Path(__file__).resolve().parent.parent
FP = {"python": "3.11.7", "cpu": "AMD EPYC", "cpu_count": 2, "torch": "2.13.0+cpu", "triton": "3.9.0", "cuda": None,
      "gpu": None, "gpu_count": 0, "device": "cpu", "commit": "a" * 40, "date": "2026-01-01T00:00:00Z"}
#: one technique's laws under claims the ledger orders KV, FA, QT (alphabetically FA, KV, QT)
LAWS = (("QT-9", "test_qt9_fused"), ("FA-3", "test_fa3_tiles"), ("KV-1", "test_kv1_prefill"))


def command(*args: str, cwd: Path, pythonpath: str = str(ROOT), flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``python [flags] -m inference_conformance ARGS`` in ``cwd`` with only ``pythonpath`` on the path."""
    env = dict(os.environ, PYTHONPATH=pythonpath)
    return subprocess.run([sys.executable, *flags, "-m", "inference_conformance", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def imported(importtime_err: str) -> set[str]:
    """The modules ``python -X importtime`` says were imported (their top-level names)."""
    return {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in importtime_err.splitlines()
            if line.startswith("import time:") and "|" in line}


def ledger_ordered_run(folder: Path) -> Path:
    """A run folder whose one technique has a law under each claim of :data:`LAWS`."""
    write_run(str(folder), started="2026-01-01T00:00:00Z", device="cpu", shard=None, args=[], expect=[], fp=FP)
    write_rows([Row(claim=c, check=f"properties/test_x.py::{law}[torch-float32]", technique="attention",
                    implementation="torch", dtype="float32", device="cpu", verdict="pass") for c, law in LAWS],
               folder / "rows-main-1.jsonl")
    return folder


def ledger_order_holds(matrix_json: Path) -> list[str]:
    """The claims of the matrix's columns, asserted to be in the ledger's order (and returned)."""
    cols = [c["claim"] for c in json.loads(matrix_json.read_text())["techniques"][0]["columns"]]
    rank = {c.id: i for i, c in enumerate(claims())}
    assert sorted(c for c, _ in LAWS) != sorted(cols, key=rank.__getitem__), "the test needs an order alphabetical breaks"
    assert cols == sorted(cols, key=rank.__getitem__) and set(cols) == {c for c, _ in LAWS}, cols
    return cols


def test_help_lists_every_subcommand_with_its_line(tmp_path):
    done = command("--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: inference-conformance"), done.stdout
    flat = " ".join(done.stdout.split())
    for name, (_, line) in cli.SUBCOMMANDS.items():
        assert f"{name} {line}" in flat, (name, done.stdout)
    assert set(cli.SUBCOMMANDS) == {"run", "merge", "expect", "gate", "ab", "list", "docs", "export-model"}
    bad = command("no-such-subcommand", cwd=tmp_path)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr, bad.stderr


def test_each_subcommand_help_is_its_modules(tmp_path):
    """A subcommand's arguments go to its module as they are: ``SUB --help`` is that module's help."""
    helps = {}
    for name, words in (("run", "--impl"), ("merge", "RUN"), ("expect", "update"), ("list", "--json"),
                        ("docs", "--check"), ("gate", "--baseline"), ("ab", "--impl-a"), ("export-model", "--head-dims")):
        done = helps[name] = command(name, "--help", cwd=tmp_path)
        assert done.returncode == 0 and words in done.stdout, (name, done.stdout, done.stderr)
        assert not re.search(r"``|:(func|mod|class|data|meth):`", done.stdout), (name, done.stdout)  # plain text
    assert "usage: inference-conformance run" in helps["run"].stdout
    assert cli.plain("see :func:`a.b.main`, ``--x`` and `y`") == "see main, --x and y"


def test_output_cut_short_by_its_reader_ends_quietly(tmp_path):
    """``inference-conformance list | head -1``: exit 0, no BrokenPipeError traceback."""
    done = subprocess.run(f"{sys.executable} -m inference_conformance list | head -1", shell=True, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith("attention: ") and done.stderr == "", done.stderr


def test_list_imports_no_torch_and_names_every_technique_and_claim(tmp_path):
    done = command("list", flags=("-X", "importtime"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    mods = imported(done.stderr)
    assert "inference_conformance" in mods, sorted(mods)
    assert not mods & {"torch", "triton", "numpy", "transformers", "vllm", "jax", "hypothesis"}, sorted(mods)
    for technique in ("attention", "kv_cache", "paged_attention", "quantization", "speculative", "speculative_tree"):
        assert f"\n{technique}: " in "\n" + done.stdout, done.stdout
    for c in claims():
        assert f"{c.id} " in done.stdout, c.id
    assert "top_left_causal" in done.stdout and "floor_not_round" in done.stdout


def test_catalog_agrees_with_the_live_registry():
    """The static catalog names exactly the implementations the registry imports, by origin."""
    from inference_conformance.conformance import registry

    cat = catalog.catalog()["techniques"]
    assert set(cat) == set(registry.contracts())
    for technique, t in cat.items():
        regs, failed = registry.registrations(technique)
        assert not failed, failed
        live = {(r.origin, r.name) for r in regs}
        static = {("zoo" if e["origin"] == "zoo" else "builtin", e["name"]) for e in t["implementations"] + t["zoo"]}
        assert static == live, (technique, static ^ live)
        adapters = {r.name for r in regs if r.adapter}
        assert adapters == {e["name"] for e in t["implementations"] if e["origin"] == "adapter"}, technique


def test_merge_keeps_the_ledger_order(tmp_path):
    run = ledger_ordered_run(tmp_path / "run")
    done = command("merge", str(run), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert ledger_order_holds(tmp_path / publish.OUT_NAME / "matrix" / "results.json") == ["KV-1", "FA-3", "QT-9"]


def test_outputs_land_in_the_suites_folder_under_the_current_one(tmp_path):
    """A tiny report (one law module, no benchmarks) of an outside implementation in the current
    folder (``run --impl``, imported from there though the children run elsewhere) writes there,
    into ./inference-conformance-out only."""
    shutil.copy(ROOT / "examples" / "my_attention.py", tmp_path)
    done = command("run", "--no-bench", "--no-history", "-n", "0", "--impl", "attention=my_attention:attention",
                   "--select", "properties/attention/laws.py::test_fa3_nan_in_exactly_the_rows_that_see_it", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = tmp_path / publish.OUT_NAME
    # __pycache__: Python's bytecode of the imported module (where PYTHONDONTWRITEBYTECODE is unset), not the suite's
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == sorted([publish.OUT_NAME,
                                                                                           "my_attention.py"])
    assert publish.is_marked(out) and (out / "report.md").is_file() and (out / "results.json").is_file()
    assert f"in {out} " in done.stdout, done.stdout[-2000:]
    rows = [json.loads(line) for f in (out / "rows").glob("*.jsonl") for line in f.read_text().splitlines() if line]
    assert rows and {r["implementation"] for r in rows} == {"my_attention:attention"}, rows[:3]


def test_expect_update_says_what_it_wrote_and_refuses_a_name_no_row_has(tmp_path, capsys):
    from inference_conformance.conformance import results
    from inference_conformance.reports import expect

    rows = [results.Row(claim="FA-3", check=f"p/test_a.py::test_law[mine:attn-{d}]", technique="attention",
                        implementation="mine:attn", dtype=d, verdict=v, message="m")
            for d, v in (("float32", "fail"), ("bfloat16", "pass"))]
    results.write_rows(rows, str(tmp_path / "run" / "rows.jsonl"))
    assert expect.main(["update", str(tmp_path / "run"), "--out", str(tmp_path / "exp"), "--impl", "mine:atn"]) == 2
    err = capsys.readouterr().err
    assert "--impl mine:atn: no row of the run names it; the run's implementations: mine:attn" in err, err
    assert expect.main(["update", str(tmp_path / "run"), "--out", str(tmp_path / "exp")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"wrote {tmp_path / 'exp' / 'mine_attn.toml'}: mine:attn, 1 entry (1 fail)", out
    assert out[1:] == ["changed: mine_attn.toml: test_law[mine:attn-float32]: a new failure now expected: AssertionError "
                       "(it was not listed)"], out     # the ratchet, one line
