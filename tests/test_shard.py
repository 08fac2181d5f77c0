"""``--shard K/N``: the deal is stable and covers every test once; and three shards of a real
selection (three laws of two techniques under the ``ci`` profile, an expected failure among
them), run as three processes and merged (``python -m inference_conformance.reports merge``), give the verdicts and
row counts of one run of the same selection."""
from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from inference_conformance.conformance import sharding
from inference_conformance.conformance.results import Row
from inference_conformance.reports import merge

ROOT = Path(__file__).resolve().parent.parent
SELECTION = ["properties/attention/laws.py", "properties/quantization/laws/integer.py",
             "-k", "(nan_in_exactly or qt2_idempotent or qt1_within) and (torch or reference)"]


def test_parse_names_the_option():
    assert sharding.parse(None) is None and sharding.parse("2/3") == (2, 3) and sharding.parse(" 1 / 1 ") == (1, 1)
    for bad in ("0/3", "4/3", "3", "a/b", "1/0", "-1/2"):
        with pytest.raises(ValueError, match=r"--shard"):
            sharding.parse(bad)
    with pytest.raises(TypeError, match="--shard"):
        sharding.parse(3)


def test_the_deal_is_stable_balanced_and_covers_every_test_once():
    ids = [f"properties/test_x.py::test_law[impl{i}-float32]" for i in range(100)]
    deal = sharding.assign(ids, 3)
    assert deal == sharding.assign(list(reversed(ids)), 3)            # collection order does not matter
    assert sorted(Counter(deal.values()).values()) == [33, 33, 34]
    assert set(deal) == set(ids) and set(deal.values()) == {1, 2, 3}
    # a fixed id gets a fixed key (SHA-256, not Python's salted hash): the same on every machine
    assert sharding.key("a::b") == "78f0be89237d77f7a70e94e0ce7a43935e8931af91b392a1e1917a7c7a6c00a4"
    assert sharding.key("properties/test_x.py::test_law[impl0-float32]") != sharding.key("properties/test_x.py::test_law[impl1-float32]")


def _pytest(results: Path, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.update(CI="true", PYTHONPATH=str(ROOT), INFERENCE_CONFORMANCE_DIR=str(results.parent / "storage"),
               OMP_NUM_THREADS="1")  # four processes on the cores: no OpenMP spin-waits
    return subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--device", "cpu",
                             "-W", "ignore::pytest.PytestWarning", *SELECTION, "--results", str(results), *extra],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _verdicts(rows) -> Counter:
    return Counter((r.check, r.claim, r.implementation, r.dtype, r.verdict) for r in rows)


def test_three_shards_merged_equal_one_run(tmp_path):
    procs = {"one": _pytest(tmp_path / "one")}
    procs.update({k: _pytest(tmp_path / f"shard{k}", "--shard", f"{k}/3") for k in (1, 2, 3)})
    outs = {k: p.communicate(timeout=600)[0] for k, p in procs.items()}
    for k, p in procs.items():
        assert p.returncode == 0, f"{k}: {outs[k][-3000:]}"
    one = merge.load([tmp_path / "one"])
    shards = merge.load([tmp_path / f"shard{k}" for k in (1, 2, 3)])
    assert [r.shard for r in shards] == ["1/3", "2/3", "3/3"]
    assert all(r.rows for r in shards)                      # each shard ran some of the tests ...
    per_shard = [{r.check for r in s.rows} for s in shards]
    assert not (per_shard[0] & per_shard[1] or per_shard[0] & per_shard[2] or per_shard[1] & per_shard[2])  # ... once
    merged, single = merge.matrix(shards), merge.matrix(one)
    assert merged["notes"] == []                            # shards hold different tests: nothing replaced
    assert len(merged["rows"]) == len(single["rows"]) > 20
    assert _verdicts(Row(**{k: v for k, v in r.items() if k != "run"}) for r in merged["rows"]) == \
        _verdicts(Row(**{k: v for k, v in r.items() if k != "run"}) for r in single["rows"])
    assert merged["counts"] == single["counts"] and merged["counts"]["expected fail"] == 1

    def table(ctx):
        return {(t["name"], r["implementation"], c["law"]): cell["text"]
                for t in ctx["techniques"] for r in t["rows"] for c, cell in zip(t["columns"], r["cells"])}
    assert table(merged) == table(single)


def test_the_example_workflow_shards_uploads_and_merges():
    yaml = pytest.importorskip("yaml")
    jobs = yaml.safe_load((ROOT / "examples" / "ci" / "github-actions.yml").read_text())["jobs"]
    cpu = jobs["cpu"]
    assert cpu["strategy"]["matrix"]["shard"] == [1, 2, 3] and len(cpu["strategy"]["matrix"]["stack"]) == 2
    run = " ".join(s.get("run", "") for s in cpu["steps"])
    assert "--shard ${{ matrix.shard }}/3" in run and "--results runs/" in run and "--expect" in run
    assert any(s.get("uses", "").startswith("actions/upload-artifact") and s.get("if") == "always()" for s in cpu["steps"])
    assert "--device cuda" in " ".join(s.get("run", "") for s in jobs["gpu"]["steps"])
    final = jobs["matrix"]
    assert set(final["needs"]) == {"cpu", "gpu"} and final["if"] == "always()"
    assert any("python -m inference_conformance.reports merge artifacts/" in s.get("run", "") for s in final["steps"])
