"""A law passed on part of its input says how much: every partial row, cell and claim shows "k of
n examples" and the boundary classes only refused examples reached, and below a quarter of its
examples accepted the verdict is "not enough evidence", which never reads as holding and which
the report's --strict fails (it counts with the failing claims). The run of an implementation that
accepts little is tests/test_outside_impl.py's (test_partial_support_is_reported_partial_with_what_was_refused)."""
from __future__ import annotations

from inference_conformance.conformance import verdicts
from inference_conformance.conformance.outcomes import evidence
from inference_conformance.conformance.results import Row, write_rows
from inference_conformance.conformance.runinfo import write_run
from inference_conformance.reports import build, merge

QT1 = "properties/quantization/laws/integer.py::test_qt1_within_half_step"
ONE = "partial: refused 570 of 571 examples (gguf refuses bits=8); classes only refused: bits:8, granularity:tensor"
MOST = "partial: refused 2 of 10 examples (refuses 3-bit)"
#: the evidence of ONE and MOST as a law records it (a field of its row, never its text parsed back)
ONE_EV, MOST_EV = evidence(1, 571, ["bits:8", "granularity:tensor"]), evidence(8, 10)


def row(impl, verdict, evidence=None, dtype="float32", message=""):
    return Row(claim="QT-1", check=f"{QT1}[{impl}-{dtype}]", technique="quantization", implementation=impl,
               dtype=dtype, device="cpu", verdict=verdict, evidence=evidence or {}, message=message,
               profile="ci", max_examples=10)


def test_an_old_rows_partial_text_is_read_and_judged():
    """Rows written before the evidence was a field said it in their message: read the same."""
    one, most = verdicts.evidence_of(ONE), verdicts.evidence_of(MOST)
    assert one == ONE_EV == {"accepted": 1, "examples": 571, "refused_classes": ["bits:8", "granularity:tensor"]}
    assert most == MOST_EV == {"accepted": 8, "examples": 10, "refused_classes": []}
    assert "1 of 571 examples accepted, fewer than 0.25" in verdicts.insufficient(one)
    assert verdicts.insufficient(most) == "" and verdicts.insufficient({"accepted": 3, "examples": 12}) == ""
    assert verdicts.effective("partial", one) == "not enough evidence"
    assert verdicts.effective("partial", most) == "partial" and verdicts.effective("pass", {}) == "pass"
    assert verdicts.evidence_of("refused the input") == {}


def test_a_partial_rows_message_leads_with_k_of_n():
    class Report:
        skipped, failed, passed, when, longrepr = False, False, True, "call", None

    class Call:
        excinfo = None

    verdict, message = verdicts.outcome(Report(), Call(), None, ONE, False, None, ONE_EV)
    assert verdict == "partial"
    assert message.startswith("not enough evidence: 1 of 571 examples accepted")
    assert "partial: 1 of 571 examples, refused classes: bits:8, granularity:tensor" in message
    verdict, message = verdicts.outcome(Report(), Call(), None, MOST, False, None, MOST_EV)
    assert (verdict, message.split(" (")[0]) == ("partial", "partial: 8 of 10 examples")


def test_claims_and_cells_show_k_of_n_and_never_hold_on_too_little():
    thin = row("gguf_q4_0", "partial", ONE_EV, message=ONE)
    ok = row("reference", "pass")
    ledger = build.claim_verdicts([ok, thin])
    qt1 = next(c for c in ledger if c["id"] == "QT-1")
    assert qt1["verdict"] == "not enough evidence" and qt1["by_impl"]["gguf_q4_0"] == "not enough evidence"
    assert "1 of 571 examples, refused classes: bits:8; granularity:tensor" in qt1["evidence_text"]
    s = build.summary([qt1])
    assert s["holding"] == 0 and s["failing"] == 1 and s["not_enough_evidence"] == 1   # --strict exits 1 on it
    cell = build.property_tables([ok, thin])["quantization"]["properties"][0]["cells"]["gguf_q4_0"]
    assert cell["verdict"] == "not enough evidence" and "1 of 571 examples" in cell["error_text"]
    # enough of the examples: still partial, holding, and it says how much
    most = build.claim_verdicts([ok, row("gguf_q4_0", "partial", MOST_EV, message=MOST)])
    qt1 = next(c for c in most if c["id"] == "QT-1")
    assert qt1["verdict"] == "holds (partial)" and "8 of 10 examples" in qt1["evidence_text"]


def test_the_matrix_cell_says_k_of_n(tmp_path):
    fp = {"python": "3.11", "cpu": "x", "torch": "2.13.0+cpu", "triton": "3.9.0", "device": "cpu", "date": "2026-01-01"}
    write_run(str(tmp_path), started="2026-01-01T00:00:00Z", device="cpu", shard=None, args=[], expect=[], fp=fp)
    write_rows([row("gguf_q4_0", "partial", ONE_EV, message=ONE),
                row("gguf_q4_0", "partial", MOST_EV, dtype="float64", message=MOST)],
               tmp_path / "rows-main-1.jsonl")
    ctx = merge.matrix(merge.load([tmp_path]))
    (cell,) = ctx["techniques"][0]["rows"][0]["cells"]
    assert cell["status"] == "not enough evidence"
    assert "(9 of 581 examples; refused classes: bits:8; granularity:tensor)" in cell["text"], cell
    # a class whose name holds a comma is one class, as the law named it, never its fragments
    named = verdicts.evidence_of(MOST + "; classes only refused: GQA, 8 heads", ["GQA, 8 heads"], ["ab12"])
    assert named == {"accepted": 8, "examples": 10, "refused_classes": ["GQA, 8 heads"], "judged": ["ab12"]}


def test_a_test_under_its_power_floor_reads_not_enough_evidence():
    """EN-3 sampled's position tests (properties/inference_engine/sampled.py): one bin has no
    power and a test under the floor leaves its position unchecked, read "not enough evidence"
    (never pass); the power against total variation 0.1 is the noncentral chi-square's."""
    import numpy as np
    from scipy import stats as sps

    from inference_conformance.conformance.law_run import Run
    from inference_conformance.properties.inference_engine import sampled

    probs = np.array([0.5, 0.3, 0.2, 0.0])
    one_bin = sampled.position_test([(np.array([20.0, 10, 9, 0]), probs)], 1e-3, "token 2 (one bin)")
    assert one_bin.dof == 0 and one_bin.power == 0.0 and one_bin.verdict.ok
    many = sampled.position_test([(np.array([500.0, 300, 200, 0]), probs)], 1e-3, "token 1")
    crit = sps.chi2.ppf(1 - 1e-3, 2)
    assert many.dof == 2 and many.n_used == 1000 and many.power == sps.ncx2.sf(crit, 2, 4 * 0.01 * 1000)
    outside = sampled.position_test([(np.array([500.0, 300, 199, 1]), probs)], 1e-3, "token 1")
    assert not outside.verdict.ok and "zero-probability" in outside.verdict.rule
    run = Run("law_sampled_distribution", "x", None)
    run._begin_example()
    sampled.judge(run, [many, one_bin])
    run._end_example(refused=False)
    text = run.partial_text()
    assert list(run.never_checked()) == ["token 2 (one bin)"], text
    ev = run.evidence()                  # recorded as a field, never read back from the text
    assert ev["thin"].startswith("power 0.000 under the floor 0.8") and "examples" not in ev, ev
    assert verdicts.effective("partial", ev) == verdicts.THIN


def test_a_row_without_its_evidence_field_is_read_from_its_message(tmp_path):
    """A partial row of an older version (evidence only in its message) reads with its evidence;
    a row written now keeps the field as written."""
    old = row("gguf_q4_0", "partial", message=ONE)
    new = row("gguf_q4_0", "partial", MOST_EV, dtype="float64", message=MOST)
    write_rows([old, new], tmp_path / "rows.jsonl")
    from inference_conformance.conformance.results import read_rows

    got = read_rows(tmp_path / "rows.jsonl")
    assert [r.evidence for r in got] == [ONE_EV, MOST_EV]
