"""The report: built from a small synthetic rows folder (fast), it shows the summary, every
claim of the ledger, property verdicts per implementation, benchmark tables and the plots the
data allows, and results.json holds the same, machine-readable."""
from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from inference_conformance.conformance.results import Row, write_rows
from inference_conformance.perf import env, history, records
from inference_conformance.reports import build
from inference_conformance.reports.ledger import claims


def make_synthetic(folder: Path, *, n_history: int = 2) -> dict:
    """A small synthetic run: rows (a pass, a fail, a GPU-only skip, a figure, zoo kills),
    a pytest-benchmark JSON with raw samples, ceilings and ``n_history`` history entries."""
    folder = Path(folder)
    rows_dir = folder / "rows"
    fp = {"python": "3.11", "platform": "linux", "cpu": "Synthetic CPU 9000", "cpu_count": 2, "torch": "2.x",
          "triton": "3.x", "cuda": None, "gpu": None, "gpu_count": 0, "driver": None, "device": "cpu",
          "commit": "0123456789abcdef", "dirty": False, "date": "2026-01-02T03:04:05Z"}
    rows = [
        Row("FA-3", "properties/attention/test_attention.py::test_tiled_equals_standard[naive-float64]", "attention",
            "naive", "float64", "cpu", 1e-15, 1e-12, None, "max abs error", "float64", "pass", "", 10),
        Row("FA-3", "properties/attention/test_attention.py::test_tiled_equals_standard[triton-float16]", "attention",
            "triton", "float16", "cpu", 2e-3, 1e-3, None, "max abs error", "float16", "fail",
            "output: measured error 2e-3 EXCEEDS bound 1e-3", 3),
        Row("FA-3", "properties/attention/test_attention.py::test_tiled_equals_standard[zoo-no_max_subtract]", "attention",
            "zoo:no_max_subtract", "", "cpu", "AssertionError: output", None, None, "rejection", "", "pass", "", 1),
        Row("FA-7", "properties/attention/test_attention.py::test_split_kv_gpu", "attention", "triton", "", "cpu",
            verdict="skip", message="needs a CUDA device"),
        Row("FA-1", "tests/test_softmax.py::test_overflow", "attention", "", "", "cpu", 0.665, None, 0.665,
            "", "", "pass", "", 1),
        Row("QT-3", "properties/test_quant.py::test_nll_bits", "quantization", "reference", "", "cpu", 1.35, None,
            1.348, "nats", "", "pass", "", 1, {"bits": 4, "nll": 1.35, "granularity": "group32"}),
        Row("QT-3", "properties/test_quant.py::test_nll_bits", "quantization", "reference", "", "cpu", 1.349, None,
            1.348, "nats", "", "pass", "", 1, {"bits": 8, "nll": 1.349, "granularity": "group32"}),
        Row("QT-3", "properties/test_quant.py::test_nll_bits", "quantization", "reference", "", "cpu", 3.1, None,
            None, "nats", "", "pass", "", 1, {"bits": 2, "nll": 3.1, "granularity": "group32"}),
    ]
    write_rows(rows, rows_dir / "rows-gw0-1.jsonl")
    rng = random.Random(0)
    benches = []
    for name, med, extra in (("test_attention_prefill[naive]", 2e-3, {"flops": 2e9, "bytes": 4e7, "claim": "FA-3"}),
                             ("test_decode_batch[8]", 1e-3, {"batch": 8, "tokens_per_s": 8000.0, "claim": "AI-9"}),
                             ("test_decode_batch[32]", 2e-3, {"batch": 32, "tokens_per_s": 16000.0, "claim": "AI-9"})):
        data = [med * (1 + 0.02 * rng.random()) for _ in range(20)]
        data.sort()
        benches.append({"group": None, "name": name, "fullname": f"benchmarks/bench_attention.py::{name}",
                        "params": None, "param": None, "extra_info": extra, "options": {},
                        "stats": {"min": data[0], "max": data[-1], "mean": sum(data) / 20, "stddev": 1e-5,
                                  "median": data[10], "iqr": data[15] - data[5], "q1": data[5], "q3": data[15],
                                  "rounds": 20, "iterations": 1, "ops": 1 / data[10], "data": data}})
    bjson = {"machine_info": {"cpu": {"brand_raw": fp["cpu"]}}, "benchmarks": benches, "version": "5"}
    (folder / "benchmarks.json").write_text(json.dumps(bjson))
    ceilings = {"copy_bytes_per_s": 2e10, "matmul_flops_per_s": {"bfloat16": 1e12, "float32": 5e11}}
    hdir = folder / "history"
    for i in range(n_history):
        f = dict(fp, date=f"2026-01-0{i + 1}T00:00:00Z", commit=f"{i:040d}")
        history.append(history.make_entry(f, records.records(bjson), ceilings), hdir)
    return {"rows_dir": rows_dir, "bench_json": folder / "benchmarks.json", "fp": fp, "ceilings": ceilings,
            "history": hdir, "rows": rows}


def build_synthetic(tmp: Path) -> Path:
    s = make_synthetic(tmp)
    out = tmp / "out"
    build.write_report(s["rows_dir"], out, bench_json=s["bench_json"], ceilings=s["ceilings"], fp=s["fp"],
                       history_dir=s["history"])
    return out


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return build_synthetic(tmp_path_factory.mktemp("report"))


def test_results_json_has_summary_ledger_fingerprint(report):
    doc = json.loads((report / "results.json").read_text())
    ledger_ids = [c.id for c in claims()]
    assert [c["id"] for c in doc["claims"]] == ledger_ids
    by = {c["id"]: c for c in doc["claims"]}
    assert by["FA-3"]["verdict"] == "fails"          # one failing dtype fails the claim
    assert by["FA-1"]["verdict"] == "holds"
    assert by["FA-7"]["verdict"] == "not measured"   # GPU-only on a CPU run
    assert by["KV-1"]["verdict"] == "not checked"
    s = doc["summary"]
    assert (s["checked"], s["holding"], s["failing"], s["not_measured"]) == (3, 2, 1, 1)
    assert s["total"] == len(ledger_ids)
    for key in ("cpu", "gpu", "driver", "torch", "triton", "commit"):
        assert key in doc["fingerprint"]
    # every registered zoo entry counts: the one zoo row is a kill, the entries no zoo test ran are not
    from inference_conformance.reports import killrate

    k, registered = doc["killrates"]["attention"], killrate.registered()["attention"]
    assert (k["killed"], k["total"], k["bugs"]) == (1, len(registered), len(registered)), k
    assert [n["check"] for n in k["not_killed"]] == [f"zoo:{b}" for b in registered if b != "no_max_subtract"]
    md = (report / "report.md").read_text()
    assert "Not killed: `zoo:nan_rows_zeroed` (no zoo test ran it in this run); `zoo:additive_mask_leaks_nan`" in md
    assert len(doc["rows"]) == 8


def test_benchmarks_carry_stats_and_fraction_of_ceiling(report):
    doc = json.loads((report / "results.json").read_text())
    att = next(t for t in doc["techniques"] if t["name"] == "attention")
    b = next(b for b in att["benchmarks"] if b["name"].startswith("test_attention_prefill"))
    assert b["rounds"] == 20 and b["median"] > 0 and b["iqr"] >= 0
    assert 0 < b["fractions"]["flop_per_s_fraction"] < 1
    assert b["achieved"]["intensity"] == pytest.approx(50.0)


def test_property_matrix_side_by_side(report):
    doc = json.loads((report / "results.json").read_text())
    att = next(t for t in doc["techniques"] if t["name"] == "attention")
    assert {"naive", "triton"} <= set(att["impls"])
    assert not any(i.startswith("zoo:") for i in att["impls"])
    cells = {(p["dtype"], i): c["verdict"] for p in att["properties"] for i, c in p["cells"].items()}
    # a law not parametrized over implementations (FA-1's row) has a named column, not "-"
    assert "-" not in att["impls"] and "not per implementation" in att["impls"]
    assert cells[("float16", "triton")] == "fail" and cells[("float64", "naive")] == "pass"


def test_plots_drawn_when_data_exists_and_skipped_with_a_note(report):
    doc = json.loads((report / "results.json").read_text())
    plots = {p["id"]: p for p in doc["plots"]}
    for pid in ("roofline", "batch", "nll_bits", "history"):
        assert plots[pid]["file"], plots[pid]
        assert (report / "plots" / plots[pid]["file"]).stat().st_size > 1000
    for pid in ("gamma", "serving"):
        assert plots[pid]["file"] is None and plots[pid]["note"]


def test_markdown_and_html_list_every_claim(report):
    md = (report / "report.md").read_text()
    html = (report / "index.html").read_text()
    for c in claims():
        assert f"| {c.id} |" in md
        assert f'data-claim="{c.id}"' in html
    assert md.index("## Summary") < md.index("## Claims ledger")
    assert "claims checked" in html


def test_fingerprint_and_series_slug():
    fp = env.fingerprint("cpu")
    assert fp["device"] == "cpu" and fp["cpu"]
    assert env.device_slug(fp).startswith("cpu-")
    assert env.device_slug({"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3"}) == "gpu-nvidia-h100-80gb-hbm3"


def test_report_survives_missing_inputs(tmp_path):
    paths = build.write_report(tmp_path / "no-rows", tmp_path / "out", history_dir=None,
                               fp={"device": "cpu", "cpu": "x", "date": "d"})
    assert all(p.exists() for p in paths)
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["summary"]["checked"] == 0


def test_kill_rate_names_survivors(tmp_path, capsys):
    from inference_conformance.reports import killrate

    rows = [Row("FA-3", f"p.py::law[zoo-{n}]", "attention", f"zoo:{n}", verdict=v)
            for n, v in (("a", "pass"), ("b", "pass"), ("c", "fail"))]
    rows.append(Row("KV-1", "k.py::law[zoo-d]", "kv_cache", "zoo:d", verdict="pass"))
    rows.append(Row("KV-1", "k.py::law[triton]", "kv_cache", "triton", verdict="fail"))  # not a zoo row
    rates = killrate.kill_rates(rows, zoo={})
    assert rates["attention"]["killed"] == 2 and rates["attention"]["total"] == 3
    assert rates["attention"]["survivors"] == ["p.py::law[zoo-c]"]
    assert rates["kv_cache"]["rate"] == 1.0
    assert (rates["attention"]["bugs_killed"], rates["attention"]["bugs"]) == (2, 3)
    write_rows(rows, tmp_path / "rows" / "r.jsonl")
    assert killrate.main(["--rows", str(tmp_path / "rows")]) == 1
    assert "survivor: p.py::law[zoo-c]" in capsys.readouterr().out


def test_every_zoo_entry_counts_skipped_unsupported_or_not_run(tmp_path, capsys):
    """A zoo test skipped or "unsupported" is no kill, and a registered entry no zoo test ran is
    none either: a technique whose only zoo test was skipped reads 0 of 1, never 0/0 or 100%."""
    from inference_conformance.reports import killrate

    rows = [Row("KV-1", "k.py::law[zoo-d]", "kv_cache", "zoo:d", verdict="pass"),
            Row("KV-1", "k.py::law_gpu[zoo-e]", "kv_cache", "zoo:e", verdict="skip", message="needs a CUDA device"),
            Row("KV-1", "k.py::law[zoo-f]", "kv_cache", "zoo:f", verdict="unsupported", message="unsupported: f refused"),
            Row("FA-3", "p.py::law_gpu[zoo-a]", "attention", "zoo:a", verdict="skip", message="needs a CUDA device")]
    rates = killrate.kill_rates(rows, zoo={"kv_cache": ["d", "e", "f", "g"], "attention": ["a"]})
    kv = rates["kv_cache"]
    assert (kv["killed"], kv["total"], kv["bugs_killed"], kv["bugs"]) == (1, 4, 1, 4), kv
    assert kv["not_killed"] == [
        {"check": "k.py::law[zoo-f]", "entries": ["f"], "reason": "unsupported: unsupported: f refused"},
        {"check": "k.py::law_gpu[zoo-e]", "entries": ["e"], "reason": "skip: needs a CUDA device"},
        {"check": "zoo:g", "entries": ["g"], "reason": killrate.NOT_RUN}]
    assert (rates["attention"]["killed"], rates["attention"]["total"], rates["attention"]["rate"]) == (0, 1, 0.0)
    text = killrate.format_rates(rates)
    assert "    not killed: k.py::law_gpu[zoo-e]: skip: needs a CUDA device" in text
    assert f"    not killed: zoo:g: {killrate.NOT_RUN}" in text
    # the correct counterpart: every entry rejected reads 100%
    assert killrate.kill_rates(rows[:1], zoo={"kv_cache": ["d"]})["kv_cache"]["rate"] == 1.0


def test_kill_rate_counts_zoo_tests_outside_the_registry():
    """A zoo test that runs known-bad entries through expect_rejected (no ``bad_impl``
    parameter, no technique marker) is counted by its place and by each entry it ran; a
    survivor among them lowers the rate."""
    rows = [Row("QT-11", "properties/quantization/test_q.py::test_cast_zoo[a]", "", "zoo:a", verdict="pass"),
            Row("SD-10", "properties/speculative_tree/test_t.py::test_two", "", "zoo:b,c", verdict="pass"),
            Row("SD-10", "properties/speculative_tree/test_t.py::test_d", "", "zoo:d", verdict="fail")]
    from inference_conformance.reports import killrate

    rates = killrate.kill_rates(rows, zoo={})
    assert rates["quantization"]["rate"] == 1.0
    assert (rates["speculative_tree"]["bugs_killed"], rates["speculative_tree"]["bugs"]) == (2, 3)
    assert rates["speculative_tree"]["survivors"] == ["properties/speculative_tree/test_t.py::test_d"]


def test_zoo_only_selects_tests_that_call_expect_rejected():
    """--zoo-only's selection: a test taking ``bad_impl``, or whose function calls
    expect_rejected; not a law's conformance test."""
    from inference_conformance.conformance.plugin_collect import is_zoo_test
    from inference_conformance.conformance.zoo import expect_rejected  # noqa: F401 (named by the functions below)

    def calls():
        return expect_rejected(None, None)

    def plain():
        return None

    class Item:
        def __init__(self, fn, names=()):
            self.function, self.fixturenames = fn, names

    assert is_zoo_test(Item(calls)) and is_zoo_test(Item(plain, ("bad_impl",)))
    assert not is_zoo_test(Item(plain, ("impl",)))


def _trend_row(claim, holds=None, verdict="pass"):
    extra = {} if holds is None else {"holds": holds, "trend_rule": "> 4"}
    return Row(claim=claim, check=f"benchmarks/bench_x.py::test_{claim}", technique="kv_cache", implementation="torch",
               device="cpu", measured=3.3, lecture="> 4×", unit="ratio", verdict=verdict, extra=extra)


def test_a_trend_is_judged_by_its_measured_direction_not_by_a_passing_test():
    ledger = {c["id"]: c for c in build.claim_verdicts([_trend_row("KV-3", holds=False), _trend_row("AI-8", holds=True),
                                                        _trend_row("AI-9")])}
    assert ledger["KV-3"]["verdict"] == "fails" and "NOT reproduced" in ledger["KV-3"]["measured_text"]
    assert ledger["AI-8"]["verdict"] == "holds"
    assert ledger["AI-9"]["verdict"] == "not measured"
    exact = {c["id"]: c for c in build.claim_verdicts([_trend_row("KV-1")])}
    assert exact["KV-1"]["verdict"] == "holds"  # an exact claim is judged by its test


def test_a_trend_whose_interval_straddles_its_mark_is_inconclusive(tmp_path):
    """A row with ``holds`` None (its interval straddles the mark) makes the trend
    "inconclusive": neither holding nor failing, counted apart in the summary and shown in both
    reports; a false row still fails the claim."""
    def row(claim, holds):
        r = _trend_row(claim, holds=holds)
        r.extra.update(holds=holds, trend={True: "holds", False: "fails", None: "inconclusive"}[holds], ci_low=2.9,
                       ci_high=5.1, trend_rule="> 4", pairs=8, mark=4)
        return r

    ledger = build.claim_verdicts([row("KV-3", None), row("KV-3", True), row("AI-8", True), row("AI-8", False),
                                   row("AI-9", True)])
    by = {c["id"]: c for c in ledger}
    assert by["KV-3"]["verdict"] == "inconclusive" and "inconclusive" in by["KV-3"]["measured_text"]
    assert "8 pairs, interval 2.9–5.1" in by["KV-3"]["measured_text"]
    assert by["AI-8"]["verdict"] == "fails" and by["AI-9"]["verdict"] == "holds"
    s = build.summary(ledger)
    assert (s["inconclusive"], s["failing"]) == (1, 1) and s["checked"] == s["holding"] + 2
    ctx = build.context([row("KV-3", None)], [])
    assert ctx["summary"]["inconclusive"] == 1
    build.render(ctx, tmp_path)
    assert "1 inconclusive" in (tmp_path / "report.md").read_text()
    html = (tmp_path / "index.html").read_text()
    assert 'data-count="inconclusive"><div class="n">1<' in html and 'data-verdict="inconclusive"' in html


def test_report_states_what_each_tolerance_rule_sees_and_cannot_see(report):
    from inference_conformance.conformance import tolerance

    md = (report / "report.md").read_text()
    html = (report / "index.html").read_text()
    assert "## Tolerance rules" in md and 'id="tolerance-rules"' in html
    for key, rule in tolerance.all_rules().items():
        name = str(key).replace("torch.", "")
        assert f"| `{name}` |" in md, name
        assert rule.blind_to.split(" (")[0].replace("|", "\\|") in md, name


def test_every_row_counts_and_the_claim_shows_its_verdict_per_implementation():
    """A failing reference (the oracle) fails the claim like any other row; the ledger shows
    each implementation's verdict, so one adapter's failure reads as that adapter's; a figure
    claim whose rows say their figure is not reproduced fails although its test passed."""
    def row(impl, verdict, claim="FA-3", **extra):
        return Row(claim, f"p.py::law[{impl}]", "attention", impl, verdict=verdict, extra=extra)

    verdicts = {c["id"]: c for c in build.claim_verdicts([row("reference", "fail"), row("triton", "pass")])}
    assert verdicts["FA-3"]["verdict"] == "fails"
    assert verdicts["FA-3"]["by_impl"] == {"reference": "fails", "triton": "holds"}
    assert "reference: fails" in verdicts["FA-3"]["by_impl_text"]
    verdicts = {c["id"]: c for c in build.claim_verdicts([row("reference", "pass"), row("triton", "partial")])}
    assert verdicts["FA-3"]["verdict"] == "holds (partial)" and verdicts["FA-3"]["by_impl"]["reference"] == "holds"
    verdicts = {c["id"]: c for c in build.claim_verdicts([row("reference", "pass")])}
    assert verdicts["FA-3"]["verdict"] == "holds" and verdicts["FA-3"]["by_impl_text"] == ""
    sd5 = [row("reference", "pass", "SD-5", holds=True), row("reference", "pass", "SD-5", holds=False)]
    assert {c["id"]: c for c in build.claim_verdicts(sd5)}["SD-5"]["verdict"] == "fails"


def test_a_failing_test_without_a_claim_is_shown(tmp_path):
    """A failing test that carries no claim id reaches no verdict; the report lists it apart."""
    rows = [Row("", "tests/test_x.py::test_tooling", verdict="fail", message="AssertionError: broken"),
            Row("", "tests/test_x.py::test_fine", verdict="pass"),
            Row("FA-3", "p.py::law[triton]", "attention", "triton", verdict="pass")]
    ctx = build.context(rows, [])
    assert [f["check"] for f in ctx["unclaimed_failures"]] == ["tests/test_x.py::test_tooling"]
    paths = build.render(ctx, tmp_path)
    md = (tmp_path / "report.md").read_text()
    html = (tmp_path / "index.html").read_text()
    assert "Failing tests that check no claim" in md and "test_tooling" in md and "test_fine" not in md
    assert 'id="unclaimed"' in html and "test_tooling" in html
    assert paths


def test_a_failing_figure_shows_the_row_that_decided_it():
    """A figure claim whose rows all pass, one of them off the lecture's figure (``holds`` False),
    fails: the report shows that row's figure first and names it as the evidence that decided."""
    rows = [Row(claim="SD-5", check=f"benchmarks/bench_x.py::test_gamma[{g}]", technique="speculative",
                implementation="reference", device="cpu", measured=5.0 + g / 10, lecture="about 6", unit="tokens per call",
                verdict="pass", extra={"holds": True, "trend_rule": "within 25%"}) for g in range(8)]
    rows.append(dataclasses.replace(rows[0], check="benchmarks/bench_x.py::test_gamma[poor]", measured=1.2,
                                    extra={"holds": False, "trend_rule": "within 25%"}))
    sd5 = next(c for c in build.claim_verdicts(rows) if c["id"] == "SD-5")
    assert sd5["verdict"] == "fails" and sd5["counts"] == {"pass": 9}, sd5
    assert sd5["measured_text"].startswith("1.2 tokens per call [NOT reproduced"), sd5["measured_text"]
    assert sd5["evidence_text"].startswith("decided by test_gamma[poor] (reference): 1.2 tokens per call"), sd5
    good = next(c for c in build.claim_verdicts(rows[:8]) if c["id"] == "SD-5")
    assert good["verdict"] == "holds" and good["evidence_text"] == "", good


def test_a_failed_row_whose_comparisons_held_says_what_failed():
    """A row that failed on something other than its comparison (a timeout) shows its held figure as
    held and the failure's first line; a failed comparison shows its figure alone."""
    def row(impl, measured, message):
        return Row(claim="EN-3", check=f"properties/x/laws.py::test_en3[{impl}]", technique="inference_engine",
                   implementation=impl, dtype="", verdict="fail", message=message, measured=measured, bound=31.42)

    (prop,) = build.property_tables([row("slow", 7.081, "Failed: Timeout (>300.0s) from pytest-timeout\nstack"),
                                     row("wrong", 1289.0, "G-test")])["inference_engine"]["properties"]
    cells = prop["cells"]
    assert cells["slow"]["error_text"].endswith("held; failed: Failed: Timeout (>300.0s) from pytest-timeout")
    assert "held" not in cells["wrong"]["error_text"] and cells["wrong"]["error_text"].startswith("1289")
