"""Trend verdicts: a trend claim ("doubling the length costs more than 4x") judged from
repeated paired ratios, and the rules (side and mark, in the claim's words) the ledger's trend
claims are judged by.

:func:`ratio_estimate` takes the geometric mean of the paired ratios with a Student-t interval on
their logs; a :class:`TrendRule` says "holds" when the interval lies wholly on the claim's side
of its mark, "fails" when it lies wholly on the other, "inconclusive" when it straddles the mark
(or there is no interval). The benchmarks (``benchmarks/``) judge their measured ratios with the
rules declared here; ``properties/roofline/test_trend_rejections.py`` (SD-9's:
``properties/speculative/test_speculative_rejections.py``) feeds the same rules synthetic ratios without the
trend.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: Confidence level of a trend's interval.
TREND_LEVEL = 0.95


@dataclass(frozen=True)
class RatioEstimate:
    """A ratio estimated from repeated paired measurements: the geometric mean of the per-pair
    ratios (``estimate``) and a ``level`` confidence interval [``low``, ``high``] (None, None
    with fewer than two pairs: no interval, so no verdict)."""

    estimate: float
    low: float | None
    high: float | None
    pairs: int
    level: float = TREND_LEVEL

    def verdict(self, side: str, mark: float) -> str:
        """"holds" when the whole interval lies on the claimed ``side`` (">" or "<") of
        ``mark``, "fails" when it lies wholly on the other side, "inconclusive" when it
        straddles the mark (or there is no interval)."""
        if side not in (">", "<"):
            raise ValueError(f"side must be '>' or '<', got {side!r}")
        if self.low is None or self.high is None:
            return "inconclusive"
        above, below = self.low > mark, self.high < mark
        if above or below:
            return "holds" if above == (side == ">") else "fails"
        return "inconclusive"


def ratio_estimate(ratios, level: float = TREND_LEVEL) -> RatioEstimate:
    """The geometric mean of positive ``ratios`` with a Student-t interval on their logs at
    ``level`` (a ratio's noise is multiplicative: a load spike scales a time, it does not add a
    constant to it)."""
    values = np.asarray(list(ratios), dtype=np.float64)
    if values.size == 0 or not np.all((values > 0) & np.isfinite(values)):
        raise ValueError(f"ratios must be positive and finite, got {values.tolist()}")
    logs = np.log(values)
    centre = float(logs.mean())
    if logs.size < 2:
        return RatioEstimate(math.exp(centre), None, None, int(logs.size), level)
    from scipy import stats   # here, not at import: scipy.stats costs ~1.6 s, every collection imports this module

    sem = float(stats.sem(logs))
    lo, hi = (centre, centre) if sem == 0 else stats.t.interval(level, logs.size - 1, loc=centre, scale=sem)
    return RatioEstimate(math.exp(centre), math.exp(lo), math.exp(hi), int(logs.size), level)


def trend_fields(est: RatioEstimate, side: str, mark: float, rule: str) -> dict:
    """The figure row's verdict fields for a trend judged by ``est`` against ``mark``: ``trend``
    (holds / fails / inconclusive), ``holds`` (True / False / None), the interval (``ci_low``,
    ``ci_high``), ``pairs``, ``mark`` and ``trend_rule`` (``rule``: the claim's words)."""
    trend = est.verdict(side, mark)
    return dict(trend=trend, holds={"holds": True, "fails": False}.get(trend), ci_low=est.low, ci_high=est.high,
                pairs=est.pairs, mark=mark,
                trend_rule=f"{side} {mark:g}, the {est.level:.0%} interval on one side: {rule}")


@dataclass(frozen=True)
class TrendRule:
    """One trend claim's rule: the ratio must lie on ``side`` (">" or "<") of ``mark``;
    ``words`` is the rule in the claim's words (shown in the report). Raises ValueError for
    another side or a mark that is not a positive finite number."""

    claim: str
    side: str
    mark: float
    words: str

    def __post_init__(self):
        if self.side not in (">", "<"):
            raise ValueError(f"side must be '>' or '<', got {self.side!r}")
        if isinstance(self.mark, bool) or not isinstance(self.mark, (int, float)) or not (0 < self.mark < math.inf):
            raise ValueError(f"mark must be a positive finite number, got {self.mark!r}")

    def fields(self, est: RatioEstimate) -> dict:
        """The figure row's verdict fields (:func:`trend_fields`) of ``est`` under this rule."""
        return trend_fields(est, self.side, self.mark, self.words)

    def judge(self, ratios) -> str:
        """"holds", "fails" or "inconclusive" for repeated paired ``ratios`` (positive, finite)."""
        return self.fields(ratio_estimate(ratios))["trend"]


# ------------------------------------------------------------ the rules of the KV-cache benchmarks
#: AI-8: the claim's "far faster" (5x), not the lecture's 27x on its own CPU (shown beside).
AI8_PREFILL_VS_DECODE = TrendRule("AI-8", ">", 5, "prefill far faster than one-token decode steps")
#: KV-3, without the cache: every step recomputes the prefix, so doubling the length costs > 4x.
KV3_DOUBLING_WITHOUT_CACHE = TrendRule("KV-3", ">", 4, "without the cache doubling the length costs more than 4x")
#: KV-3, with the cache: about 2x (linear); the mark 3 leaves room for the attention's growing part.
KV3_DOUBLING_WITH_CACHE = TrendRule("KV-3", "<", 3, "with the cache about 2x (linear, not quadratic)")
#: AI-9: step time B=64 / B=1 grows at most a quarter as fast as the batch (x64).
AI9_STEP_GROWTH = TrendRule("AI-9", "<", 16, "step time grows at most a quarter as fast as the batch")
#: AI-9: throughput B=256 / B=64 (4x the batch).
AI9_SATURATION = TrendRule("AI-9", "<", 1.25, "saturated (4x the batch buys at most 25% more throughput)")

# ------------------------------------------------------------ the rule of the quantization benchmark
#: QT-10: bf16 / weight-only quantized latency of a memory-bound decode product (M = 1).
QT10_QUANTIZED_DECODE = TrendRule("QT-10", ">", 1, "quantized decode product faster than bf16")

# ------------------------------------------------------- the rule of the speculative benchmark
#: SD-9: the good draft's speedup over target-only decoding (target-only time / speculative
#: time, wall clock) at its best γ lies above 1; the poor draft's best γ is small (CS336: 3-4).
SD9_GOOD_DRAFT_FASTER = TrendRule("SD-9", ">", 1,
                                  "good draft faster than target-only; poor draft's best gamma (of 1..8) <= 4")
#: SD-9: the largest best γ of the poor draft the claim's "small" allows.
SD9_POOR_BEST_GAMMA = 4


def best_gamma(by_gamma: dict) -> tuple[int, RatioEstimate]:
    """(γ, estimate) of the fastest γ of one draft: ``by_gamma`` {γ: RatioEstimate of target-only
    time / speculative time}; the largest point estimate, the larger γ on ties."""
    if not by_gamma:
        raise ValueError("by_gamma must hold at least one gamma")
    g = max(by_gamma, key=lambda k: (by_gamma[k].estimate, k))
    return g, by_gamma[g]


def sd9_fields(good: dict, poor: dict) -> dict:
    """SD-9's verdict fields (:meth:`TrendRule.fields`) from each draft's estimates by γ
    ({γ: RatioEstimate}): the good draft's best γ judged by :data:`SD9_GOOD_DRAFT_FASTER`, and
    "fails" whatever that says when the poor draft's best γ exceeds :data:`SD9_POOR_BEST_GAMMA`."""
    fields = SD9_GOOD_DRAFT_FASTER.fields(best_gamma(good)[1])
    if best_gamma(poor)[0] > SD9_POOR_BEST_GAMMA:
        fields.update(trend="fails", holds=False)
    return fields


def sd9_judge(good: dict, poor: dict) -> str:
    """SD-9's verdict ("holds", "fails", "inconclusive") from each draft's repeated paired ratios
    by γ ({γ: [target-only time / speculative time, ...]})."""
    est = {k: ratio_estimate(v) for k, v in good.items()}, {k: ratio_estimate(v) for k, v in poor.items()}
    return sd9_fields(*est)["trend"]
