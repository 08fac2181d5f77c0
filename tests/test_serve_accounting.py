"""PA-7's two halves through ``serve`` (``properties/inference_engine/laws/serving.py``: ``PA7``):
every request's output is judged in every example, and each position computed once where the
engine reports its counts ("stats" in ``Capabilities.serving``). An engine without "stats" gives
the law no means to check the second half: its PA-7 cell is "partial", naming that half and why,
never a plain pass; a wrong output still fails it. The paged engine, which reports its counts,
passes in full."""
from __future__ import annotations

import dataclasses

from inference_conformance.conformance import registry, verdicts
from inference_conformance.conformance.results import Recorder, recording
from inference_conformance.conformance.zoo import expect_rejected
from inference_conformance.optimized.inference_engine.suite import PagedAdapter
from inference_conformance.properties.inference_engine.laws.serving import PA7
from inference_conformance.properties.inference_engine.serving_cases import COMPUTED_ONCE
from inference_conformance.properties.inference_engine.zoo import StalePrefix

TECHNIQUE = "inference_engine"


class NoStats:
    """``engine`` offering ``serve`` without "stats": its outputs, no per-request counts (None)."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def capabilities(self):
        caps = self.engine.capabilities()
        return dataclasses.replace(caps, serving=tuple(f for f in caps.serving if f != "stats"))

    def generate(self, requests, params):
        return self.engine.generate(requests, params)

    def serve(self, schedule, params) -> dict:
        return {i: dataclasses.replace(c, computed_tokens=None, cached_tokens=None, preemptions=None)
                for i, c in self.engine.serve(schedule, params).items()}


#: The paged engine without its counts, and its known-bad prefix cache without them.
NO_STATS, STALE_NO_STATS = NoStats(PagedAdapter()), NoStats(StalePrefix())


class _Passed:   # a test's call phase that passed, as the plugin hands it to the verdict
    skipped, failed, passed, when, longrepr = False, False, True, "call", None


class _Call:
    excinfo = None


def _cell(impl) -> tuple:
    """(the run, the PA-7 cell's verdict and message) of the conformance test's work on ``impl``."""
    with recording(Recorder()) as rec:
        run = PA7(impl, "cpu")
    return run, verdicts.outcome(_Passed(), _Call(), None, rec.partial, False, None, rec.evidence)


def test_pa7_without_stats_is_partial_naming_the_unchecked_half():
    impl = registry.load(TECHNIQUE, "paged without stats", f"{__name__}:NO_STATS", "outside")
    run, (verdict, message) = _cell(impl)
    assert run.ran >= 2 and not run.refused, (run.ran, run.refused)          # both pinned examples judged
    assert run.never_checked() == {COMPUTED_ONCE: run.unchecked[COMPUTED_ONCE][1]}, run.unchecked
    assert verdict == "partial", (verdict, message)
    assert f"{COMPUTED_ONCE} not checked in any of the {run.ran} examples" in message, message
    assert 'no "stats" in Capabilities.serving' in message, message
    assert not any(o["computed_once_checked"] for o in run.observations)


def test_pa7_without_stats_still_fails_a_wrong_output():
    bad = registry.load(TECHNIQUE, "stale prefix without stats", f"{__name__}:STALE_NO_STATS", "zoo")
    with recording(Recorder()):
        rejection = expect_rejected(PA7, bad, "cpu")
    assert "served with the prefix cache vs alone" in rejection, rejection


def test_pa7_on_the_paged_engine_checks_both_halves_and_passes():
    (paged,) = [i for i in registry.builtins(TECHNIQUE) if i.name == "paged"]
    run, (verdict, message) = _cell(paged)
    assert run.ran >= 2 and run.unchecked == {} and run.never_checked() == {}, run.unchecked
    assert all(o["computed_once_checked"] for o in run.observations), run.observations
    assert (verdict, message) == ("pass", ""), (verdict, message)
