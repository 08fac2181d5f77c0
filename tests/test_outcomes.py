"""The one outcome type (conformance/outcomes.py): one severity order, and every reader of rows
(the report's cells and claims, the matrix, the terminal summary, the exit status) picks the same
worst outcome by it; each outcome's words and effects are the enum's, so adding one is one edit;
no module compares an outcome's word as a string; and on every run folder the merge tests
fabricate, the report, the matrix, the terminal and the exit status agree."""
from __future__ import annotations

import inspect
import itertools
import re
from pathlib import Path

import pytest

from inference_conformance.conformance import outcomes, plugin_results, summary, verdicts
from inference_conformance.conformance.outcomes import ClaimVerdict, Exit, Outcome
from inference_conformance.conformance.results import Row, read_rows
from inference_conformance.reports import build, killrate, merge
from inference_conformance.reports.merge_runs import MergeError
from tests import test_merge, test_merge_crashed, test_partial_evidence

ROOT = Path(__file__).resolve().parent.parent
QT1 = "properties/quantization/laws/integer.py::test_qt1_within_half_step"
O = Outcome


def test_the_one_severity_order():
    assert list(Outcome) == [O.SKIP, O.UNSUPPORTED, O.PASS, O.PARTIAL, O.UNEXPECTED_PASS, O.THIN, O.EXPECTED_FAIL,
                             O.STALE, O.ERROR, O.FAIL, O.CRASHED]
    assert [o.severity for o in Outcome] == list(range(len(Outcome)))
    # whatever says the law fails outranks whatever says it holds, which outranks what judged nothing
    holds = [o for o in Outcome if o.claim is not None and o.claim.holding]
    assert max(o.severity for o in holds) < min(o.severity for o in Outcome if o.fails_law)
    assert max(o.severity for o in Outcome if o.claim is None and o is not O.STALE) < min(o.severity for o in holds)
    # words on disk are the words rows have always had
    assert [o.value for o in Outcome] == ["skip", "unsupported", "pass", "partial", "unexpected pass",
                                          "not enough evidence", "expected fail", "stale expectation", "error", "fail",
                                          "crashed"]


def test_an_unknown_word_is_refused_by_name():
    with pytest.raises(ValueError, match="'passed' is not an outcome"):
        Outcome.of("passed")
    assert Outcome.of("pass") is O.PASS and Outcome.of(O.FAIL) is O.FAIL


def _row(verdict, dtype="float32", impl="torch", claim="QT-1", **kw) -> Row:
    return Row(claim=claim, check=f"{QT1}[{impl}-{dtype}]", technique="quantization", implementation=impl, dtype=dtype,
               device="cpu", verdict=str(verdict), **kw)


def _terminal(verdicts_: list[tuple]) -> dict[tuple, Outcome]:
    """The terminal table's cells, read back: (law key, implementation) -> the outcome it leads with."""
    table, _ = summary._table(verdicts_)
    words = {o.terminal: o for o in Outcome} | {o.value.replace(" ", "_"): o for o in Outcome}
    return {(k, i): words[cell.split("(")[0].split(",")[0].split(":")[0]] for k, row in table.items()
            for i, cell in row.items()}


def _terminal_outcomes(cell: str) -> list[Outcome]:
    words = {o.terminal: o for o in Outcome} | {o.value.replace(" ", "_"): o for o in Outcome}
    return [words[part.split(":")[0]] for part in cell.split("(")[0].split(",")]


@pytest.mark.parametrize("a,b", list(itertools.combinations(list(Outcome), 2)), ids=lambda o: o.terminal)
def test_every_reader_picks_the_same_worst(a, b, tmp_path):
    """Two rows of one law and implementation: the report's cell, the claim, the matrix's cell
    and the terminal's cell all read the worse of the two (a pass beside a refusal: partial)."""
    rows = [_row(a), _row(b, dtype="float64")]
    want = Outcome.combine([a, b])
    assert want is (O.PARTIAL if {a, b} == {O.PASS, O.UNSUPPORTED} else max(a, b, key=lambda o: o.severity))
    same_key = build.property_tables([_row(a), _row(b)])["quantization"]["properties"][0]["cells"]["torch"]
    assert same_key["verdict"] == want
    test_merge.make_run(tmp_path, rows)
    (cell,) = merge.matrix(merge.load([tmp_path]))["techniques"][0]["rows"][0]["cells"]
    assert cell["status"] == want.matrix
    (lead,) = _terminal(plugin_results.terminal_verdicts(rows)).values()
    assert lead is max(a, b, key=lambda o: o.severity)
    claim = next(c for c in build.claim_verdicts(rows) if c["id"] == "QT-1")
    judged = [o for o in (a, b) if o.claim is not None]
    assert claim["verdict"] == (Outcome.worst(judged).claim if judged else ClaimVerdict.NOT_MEASURED)
    # the merge keeps an older failure against a newer refusal by the same order
    assert merge._failed(Outcome.worst([a, b])) == any(merge._failed(o) for o in (a, b))


def test_every_outcome_has_every_word_and_effect():
    """What each consumer needs of an outcome is a field of the member: a new member with its
    fields is read everywhere without another edit."""
    for o in Outcome:
        assert o.terminal and " " not in o.terminal and o.matrix in merge.STATUSES, o
        assert o.claim is None or isinstance(o.claim, ClaimVerdict)
        assert isinstance(o.exit, Exit) and o.listed in (None, *outcomes.LISTED)
        assert summary._cell([(o.value, None, None)]) == o.value.replace(" ", "_")
        assert outcomes.matrix_status([o]) == o.matrix
    assert merge.STATUSES[0] == O.CRASHED.matrix and merge.STATUSES[-1] == outcomes.NOT_RUN
    assert plugin_results.UNJUDGED == {O.SKIP, O.UNSUPPORTED, O.THIN, O.STALE}


@pytest.mark.parametrize("listed,verdict,allow", [("fail", O.STALE, False), ("fail", O.STALE, True),
                                                  ("partial", O.UNEXPECTED_PASS, False),
                                                  ("partial", O.UNEXPECTED_PASS, True)])
def test_the_exit_effect_is_what_the_plugin_does(listed, verdict, allow):
    """A row's outcome fails its pytest run exactly where :attr:`Outcome.exit` says."""
    from inference_conformance.conformance.expectations import Entry

    class Report:
        skipped, failed, passed, when, outcome = verdict is O.STALE, False, verdict is not O.STALE, "call", "passed"
        longrepr = ("f.py", 1, "skipped") if verdict is O.STALE else None

    class Call:
        excinfo = None

    entry = Entry(key="t", expected=listed, reason="r", source="x.toml")
    report = Report()
    got, _ = verdicts.outcome(report, Call(), entry, "", allow)
    assert got is verdict and (report.outcome == "failed") == verdict.fails_run(allow)


def test_no_outcome_word_is_compared_as_a_string():
    """Outside conformance/outcomes.py, no module of the suite compares a row's verdict with an
    outcome's word (``== "pass"``, ``in ("fail", "error")``): it asks :class:`Outcome`."""
    word = "|".join(re.escape(o.value) for o in Outcome)
    compared = re.compile(rf"""(==|!=|\bin)\s*[(\[{{]?\s*["']({word})["']|["']({word})["']\s*(==|!=)""")
    found = []
    for folder in ("conformance", "reports", "perf"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name == "outcomes.py" or "inference_engine" in path.name:
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if compared.search(line.split("#")[0]):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


def _agree(folder: Path) -> None:
    """On one run folder: the matrix's cells, the report's cells (combined over dtypes), the
    terminal's cells and the exit status read the same outcome of each law and implementation."""
    try:
        runs = merge.load([folder])
    except MergeError:
        return                                                  # a damaged folder the test names
    ctx = merge.matrix(runs)
    rows = [Row(**{k: v for k, v in r.items() if k != "run"}) for r in ctx["rows"]]   # crashes attributed
    matrix = {(r["implementation"], c["claim"], c["law"]): cell["status"]
              for t in ctx["techniques"] for r in t["rows"] for c, cell in zip(t["columns"], r["cells"])
              if cell["status"] != outcomes.NOT_RUN}
    report: dict[tuple, list] = {}
    for t in build.property_tables(rows).values():
        for p in t["properties"]:
            for impl, cell in p["cells"].items():
                report.setdefault((impl, p["claim"] or "(no claim)", p["law"]), []).append(cell["verdict"])
    report_status = {k: outcomes.matrix_status(v) for k, v in report.items()}
    assert {k: v for k, v in report_status.items() if v != outcomes.NOT_RUN} == matrix, folder
    table, _ = summary._table(plugin_results.terminal_verdicts(rows))
    terminal = {(impl, key[1].split(" ", 1)[1] if " " in key[1] else "(no claim)", key[1].split(" ")[0]):
                outcomes.matrix_status(_terminal_outcomes(cell)) for key, row in table.items() for impl, cell in row.items()}
    assert {k: v for k, v in terminal.items() if v != outcomes.NOT_RUN} == matrix, folder
    fails = {o.matrix for o in Outcome if o.fails_run()}
    exit_rows = outcomes.run_fails(outcomes.read(r) for r in read_rows(folder))
    assert exit_rows == any(s in fails for s in matrix.values()) == any(s in fails for s in terminal.values()), folder


def _tests_of(*modules) -> list:
    return [pytest.param(fn, id=f"{m.__name__.rsplit('.', 1)[-1]}::{name}")
            for m in modules for name, fn in vars(m).items() if name.startswith("test_") and callable(fn)
            and "tmp_path" in inspect.signature(fn).parameters
            and re.search(r"\b(make_run|write_run|two_environments)\(", inspect.getsource(fn))]


@pytest.mark.parametrize("fn", _tests_of(test_merge, test_merge_crashed, test_partial_evidence))
def test_report_matrix_terminal_and_exit_agree_on_every_merge_test_folder(fn, tmp_path, request):
    """Each merge test is run again, and every run folder it fabricated is read by every reader."""
    fn(**{p: tmp_path if p == "tmp_path" else request.getfixturevalue(p) for p in inspect.signature(fn).parameters})
    folders = sorted({p.parent for p in tmp_path.rglob("run.json")})
    assert folders, "the test fabricated no run folder"
    for folder in folders:
        _agree(folder)


def test_the_kill_rate_counts_by_the_outcome():
    zoo = [_row(O.PASS, impl="zoo:a"), _row(O.FAIL, impl="zoo:b", dtype="x"), _row(O.ERROR, impl="zoo:c", dtype="y"),
           _row(O.UNSUPPORTED, impl="zoo:d", dtype="z")]
    rate = killrate.kill_rates(zoo, zoo={})["quantization"]
    assert rate["killed"] == 1 and len(rate["survivors"]) == 2 and len(rate["not_killed"]) == 1
