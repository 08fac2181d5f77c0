"""The conformance matrix keeps what a newer run cannot vouch for: a crashed test is a cell of its
own ("crashed", outranking every status, never replaced), a newer skip or refusal never replaces
an older failure (a partial one only where it judged the failing input), a run with fewer examples (a weaker Hypothesis profile) never
replaces a
stronger one, and each cell names the run it came from. Fabricated run folders, as
tests/test_merge.py builds them."""
from __future__ import annotations

import json
from pathlib import Path

from inference_conformance.conformance.results import CRASH, Row, crashed, write_rows
from inference_conformance.conformance.runinfo import write_run
from inference_conformance.reports import merge

FP = {"python": "3.11.7", "cpu": "AMD EPYC", "cpu_count": 2, "torch": "2.13.0+cpu", "triton": "3.9.0",
      "cuda": None, "gpu": None, "gpu_count": 0, "device": "cpu", "commit": "a" * 40, "date": "2026-01-01T00:00:00Z"}
FA3 = "properties/attention/laws.py::test_fa3_matches_float64_reference"
NAN = "properties/attention/laws.py::test_fa3_nan_in_exactly_the_rows_that_see_it"


def row(check, impl, verdict, dtype="float32", profile="ci", n=10, message=""):
    return Row(claim="FA-3", check=f"{check}[{impl}-{dtype}]", technique="attention", implementation=impl, dtype=dtype,
               device="cpu", verdict=verdict, message=message, profile=profile, max_examples=n)


def crash_row(check):
    """The row pytest-xdist's crash handler writes: no technique, implementation or dtype."""
    return Row(claim="", check=check, device="cpu", verdict="error",
               message="worker crashed while running this test (segfault or hard exit in the implementation)",
               failure={"exception": CRASH, "check": "worker crashed"})


def make_run(folder: Path, rows, day: int, impls=(("attention", "torch"),)) -> Path:
    write_run(str(folder), started=f"2026-01-0{day}T00:00:00Z", device="cpu", shard=None, args=[], expect=[], fp=FP)
    write_rows(rows, folder / "rows-gw0-1.jsonl")
    (folder / "impls-gw0-1.json").write_text(json.dumps(
        [{"technique": t, "name": n, "origin": "builtin", "target": "", "packages": {}} for t, n in impls]))
    return folder


def cells(ctx: dict) -> dict[tuple[str, str, str], dict]:
    """(implementation, the row's profile text, law) -> cell."""
    (t,) = [t for t in ctx["techniques"] if t["name"] == "attention"]
    return {(r["implementation"], r["environment"].split(" · ")[-1], c["law"]): cell
            for r in t["rows"] for c, cell in zip(t["columns"], r["cells"])}


FA3_LAW, NAN_LAW = FA3.split("::")[1], NAN.split("::")[1]
CI = "profile ci (10 examples)"


def test_a_single_crashed_run_reads_crashed(tmp_path):
    run = make_run(tmp_path / "r", [crash_row(f"{FA3}[torch-float32]"), row(FA3, "torch", "pass", dtype="float64"),
                                    row(NAN, "torch", "pass")], day=1)
    ctx = merge.matrix(merge.load([run]))
    got = {(impl, law): c for (impl, _, law), c in cells(ctx).items()}
    assert got[("torch", FA3_LAW)]["status"] == "crashed", got        # the crash is attributed to torch, never dropped
    assert got[("torch", NAN_LAW)]["status"] == "pass"
    assert ctx["counts"]["crashed"] == 1
    (detail,) = [d for d in ctx["details"] if d["status"] == "crashed"]
    assert "worker crashed" in detail["tests"][0]["message"]
    html = (merge.write(ctx, tmp_path / "m")[0]).read_text()
    assert html.count('class="cell s-crashed"') == 1


def test_a_crash_outranks_an_older_pass_and_a_newer_one(tmp_path):
    old = make_run(tmp_path / "a", [row(FA3, "torch", "pass")], day=1)
    crash = make_run(tmp_path / "b", [crash_row(f"{FA3}[torch-float32]")], day=2)
    new = make_run(tmp_path / "c", [row(FA3, "torch", "pass")], day=3)
    for runs in ([old, crash], [crash, new], [old, crash, new]):
        ctx = merge.matrix(merge.load(runs))
        assert {c["status"] for (_, _, law), c in cells(ctx).items() if law == FA3_LAW} == {"crashed"}, cells(ctx)
    ctx = merge.matrix(merge.load([crash, new]))
    (cell,) = [c for (_, _, law), c in cells(ctx).items() if law == FA3_LAW]
    assert cell["status"] == "crashed" and cell["runs"] == ["run1", "run2"]
    assert any("a crash is never replaced" in n for n in ctx["notes"]), ctx["notes"]


def test_a_crash_a_law_reports_reads_as_a_crash_in_the_matrix(tmp_path):
    crash = row(FA3, "torch", "fail", message="case: ...\ntorch: receive(...) crashed: IndexError: list index")
    crash.failure = {"exception": "IndexError", "check": "list index out of range"}
    check = row(NAN, "torch", "fail", message="the rows: measured error 1 EXCEEDS bound 0")
    check.failure = {"exception": "AssertionError", "check": "the rows"}
    ctx = merge.matrix(merge.load([make_run(tmp_path / "r", [crash, check], day=1)]))
    verdicts = {d["law"]: d["tests"][0]["verdict"] for d in ctx["details"]}
    assert verdicts == {FA3_LAW: "fail (crash: IndexError)", NAN_LAW: "fail"}, verdicts


def test_an_older_style_crash_row_is_recognised():
    legacy = Row(claim="", check="t.py::test_x[a-b]", verdict="error", message="worker crashed while running this test")
    assert crashed(legacy) and not crashed(Row(claim="", check="x", verdict="error", message="boom"))


def test_a_newer_skip_or_refusal_never_replaces_an_older_failure(tmp_path):
    old = make_run(tmp_path / "a", [row(FA3, "torch", "fail", message="attention output: measured error 1.0e+00"),
                                    row(NAN, "torch", "fail")], day=1)
    new = make_run(tmp_path / "b", [row(FA3, "torch", "skip"), row(NAN, "torch", "unsupported")], day=2)
    ctx = merge.matrix(merge.load([old, new]))
    got = cells(ctx)
    assert got[("torch", CI, FA3_LAW)]["status"] == "fail" and got[("torch", CI, FA3_LAW)]["runs"] == ["run1"]
    assert got[("torch", CI, NAN_LAW)]["status"] == "fail"
    assert any("did not replace run1's: it skipped the test" in n for n in ctx["notes"]), ctx["notes"]
    assert any("it refused the input the older run failed on" in n for n in ctx["notes"]), ctx["notes"]
    # a newer pass of the same profile does replace an older failure (the fix)
    fixed = make_run(tmp_path / "c", [row(FA3, "torch", "pass")], day=3)
    ctx = merge.matrix(merge.load([old, fixed]))
    assert cells(ctx)[("torch", CI, FA3_LAW)]["status"] == "pass"
    assert cells(ctx)[("torch", CI, FA3_LAW)]["runs"] == ["run2"]


def test_a_newer_partial_refusal_replaces_a_failure_only_where_it_judged_the_failing_input(tmp_path):
    """The newer run refuses just the input the older one failed on (18 or 2 of 22 examples
    judged): the failure stays, beside the newer result, and the page says why; judging that
    input (its digest among the newer row's judged ones) and passing it is a fix."""
    failed = row(FA3, "torch", "fail", message="attention output: measured error 1.0e+00")
    failed.failure = {"exception": "AssertionError", "check": "attention output", "inputs": ["f00d"]}
    old = make_run(tmp_path / "a", [failed], day=1)

    def partial(k, judged):
        r = row(FA3, "torch", "partial", message=f"partial: {k} of 22 examples")
        r.evidence = {"accepted": k, "examples": 22, "refused_classes": ["Tk > 2048, decode"], "judged": judged}
        return r

    judged = [f"{i:04x}" for i in range(18)]
    for k, status in ((18, "partial"), (2, "not enough evidence")):
        new = make_run(tmp_path / f"b{k}", [partial(k, judged[:k])], day=2)
        ctx = merge.matrix(merge.load([old, new]))
        cell = cells(ctx)[("torch", CI, FA3_LAW)]
        assert cell["status"] == "fail" and cell["runs"] == ["run1", "run2"], (k, cell)
        assert cell["counts"] == {"fail": 1, status: 1}, cell
        assert any(f"did not replace run1's: it refused part of its input ({k} of 22 examples judged) and did not "
                   "judge the input the older run failed on" in n for n in ctx["notes"]), ctx["notes"]
    # a failure that names no input (an older row): only a newer run that refused nothing replaces it
    failed.failure = {"exception": "AssertionError"}
    ctx = merge.matrix(merge.load([make_run(tmp_path / "c", [failed], day=1), new]))
    assert cells(ctx)[("torch", CI, FA3_LAW)]["status"] == "fail"
    assert any("names no input it was measured on" in n for n in ctx["notes"]), ctx["notes"]
    # the newer run judged the failing input and passed it: the fix replaces the failure
    fixed = make_run(tmp_path / "d", [partial(18, judged[:17] + ["f00d"])], day=2)
    ctx = merge.matrix(merge.load([old, fixed]))
    cell = cells(ctx)[("torch", CI, FA3_LAW)]
    assert cell["status"] == "partial" and cell["runs"] == ["run2"], cell
    assert "(18 of 22 examples; refused classes: Tk > 2048, decode)" in cell["text"], cell   # one name, comma and all
    assert any("replaced by the newer run2" in n for n in ctx["notes"]), ctx["notes"]


def test_only_a_run_with_as_many_examples_replaces_a_result(tmp_path):
    thorough = make_run(tmp_path / "a", [row(FA3, "torch", "fail", profile="thorough", n=500)], day=1)
    quick = make_run(tmp_path / "b", [row(FA3, "torch", "pass", profile="compat", n=3)], day=2)
    ctx = merge.matrix(merge.load([thorough, quick]))
    got = cells(ctx)
    # the profile is part of the environment: the weaker newer run keeps its own row, the failure stays
    assert got[("torch", "profile thorough (500 examples)", FA3_LAW)]["status"] == "fail"
    assert got[("torch", "profile compat (3 examples)", FA3_LAW)]["status"] == "pass"
    assert any("it ran fewer examples (3 < 500): a weaker profile" in n for n in ctx["notes"]), ctx["notes"]
    # a stronger newer run replaces the weaker older one
    stronger = make_run(tmp_path / "c", [row(FA3, "torch", "fail", profile="thorough", n=500)], day=3)
    ctx = merge.matrix(merge.load([quick, stronger]))
    assert {k[1]: c["status"] for k, c in cells(ctx).items()} == {"profile thorough (500 examples)": "fail"}
    assert any("replaced by the newer run2" in n for n in ctx["notes"]), ctx["notes"]


def test_the_page_names_the_run_of_each_cell(tmp_path):
    a = make_run(tmp_path / "a", [row(FA3, "torch", "pass")], day=1)
    b = make_run(tmp_path / "b", [row(NAN, "torch", "fail")], day=2)
    ctx = merge.matrix(merge.load([a, b]))
    got = cells(ctx)
    assert got[("torch", CI, FA3_LAW)]["runs"] == ["run1"] and got[("torch", CI, NAN_LAW)]["runs"] == ["run2"]
    html, md = (p.read_text() for p in merge.write(ctx, tmp_path / "m")[:2])
    assert 'data-runs="run1"' in html and 'data-runs="run2"' in html
    assert "pass run1 |" in md and "run2 |" in md
