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
