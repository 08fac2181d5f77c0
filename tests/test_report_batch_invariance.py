"""The report shows the batch-invariance property (properties/test_batch_invariance.py) in each
implementation's cell: bitwise invariant, or the largest difference measured, and whether the
implementation declares it."""
from __future__ import annotations

from inference_conformance.conformance import results
from inference_conformance.reports.build import property_tables


def test_report_cell_shows_the_property():
    """The report's property table names the measured property in each implementation's cell
    (invariant or the largest difference, and whether declared), not only the outcome."""
    def row(impl, invariant, diff, declared):
        return results.Row(claim="", check="properties/test_batch_invariance.py::test_batch_invariance[x]",
                           technique="mla_decode", implementation=impl, verdict="pass", measured=diff, bound=0.0,
                           extra=dict(batch_invariant=invariant, max_batch_diff=diff, declared=declared))

    table = property_tables([row("reference", True, 0.0, True), row("triton", False, 8.94e-08, False)])
    cells = table["mla_decode"]["properties"][0]["cells"]
    assert cells["reference"]["error_text"] == "bitwise invariant, declared"
    assert cells["triton"]["error_text"] == "not invariant: max abs diff 8.94e-08"


def test_matrix_cell_shows_the_property(tmp_path):
    """The merged conformance matrix (``inference-conformance merge``) names the property in each
    implementation's batch-invariance cell, read from the run folder's rows: the largest
    difference where not invariant, and the declaration; a cell of another law says none."""
    from inference_conformance.conformance.runinfo import write_run
    from inference_conformance.reports import merge

    fp = {"python": "3.11.7", "cpu": "AMD EPYC", "cpu_count": 2, "torch": "2.13.0+cpu", "triton": "3.9.0",
          "cuda": None, "gpu": None, "gpu_count": 0, "device": "cpu", "commit": "a" * 40, "date": "2026-01-01T00:00:00Z"}

    def row(impl, invariant, diff, declared):
        return results.Row(claim="", check=f"properties/test_batch_invariance.py::test_batch_invariance[paged_attention-{impl}]",
                           technique="paged_attention", implementation=impl, device="cpu", verdict="pass",
                           measured=diff, bound=0.0, extra=dict(batch_invariant=invariant, max_batch_diff=diff,
                                                                declared=declared))

    write_run(str(tmp_path), started="2026-01-01T00:00:00Z", device="cpu", shard=None, args=[], expect=[], fp=fp)
    results.write_rows([row("triton", False, 2.98e-08, False), row("triton_invariant", True, 0.0, True),
                        results.Row(claim="PA-1", check="properties/paged_attention/test_paged_attention.py::"
                                    "test_pa1_paged_equals_contiguous[triton-float32]", technique="paged_attention",
                                    implementation="triton", device="cpu", verdict="pass", extra={})],
                       tmp_path / "rows-main-1.jsonl")
    ctx = merge.matrix(merge.load([tmp_path]))
    t, = ctx["techniques"]
    cells = {(r["implementation"], c["law"]): cell["text"] for r in t["rows"] for c, cell in zip(t["columns"], r["cells"])}
    assert cells[("triton", "test_batch_invariance")] == "pass: not invariant: max abs diff 2.98e-08"
    assert cells[("triton_invariant", "test_batch_invariance")] == "pass: bitwise invariant, declared"
    assert cells[("triton", "test_pa1_paged_equals_contiguous")] == "pass"
