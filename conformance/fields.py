"""The figures the report reads, declared once: producers (laws via ``results.record``,
benchmarks via ``results.bench_info``) and consumers (the claims ledger, the verdict rule, the
plots, the benchmark tables) use these names and nothing else.

Each field has one spelling, a type and a unit. A producer may add other, descriptive keys (shown
as they are in the report's tables), but a key that is a near-miss of a declared field
(``utilization`` for ``utilisation``) is refused with the declared spelling, and a declared field
of the wrong type is refused, so that a figure can never silently miss its plot or its verdict.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Field:
    """One declared figure: its ``name``, accepted Python ``types``, ``unit`` and meaning."""

    name: str
    types: tuple[type, ...]
    unit: str
    doc: str

    def accepts(self, value: Any) -> bool:
        if value is None:
            return True
        if bool in self.types and isinstance(value, bool):
            return True
        if isinstance(value, bool):
            return False
        if numbers.Real in self.types and isinstance(value, numbers.Real):
            return True
        return isinstance(value, tuple(t for t in self.types if t is not numbers.Real))


_NUM = (numbers.Real,)
FIELDS: dict[str, Field] = {f.name: f for f in (
    # identity of the row
    Field("claim", (str,), "", "claim id of CLAIMS.md (AI-9, PA-2, ...)"),
    Field("technique", (str,), "", "contract name (attention, kv_cache, ...)"),
    Field("implementation", (str,), "", "registry name of the implementation (never its repr)"),
    Field("backend", (str,), "", "name of a compared computation that is not a registered implementation"),
    Field("dtype", (str,), "", "torch dtype name without 'torch.'"),
    Field("device", (str,), "", "cpu or cuda"),
    # verdicts of trend claims
    Field("holds", (bool,), "", "whether the measured direction holds the claim's rule (None: inconclusive)"),
    Field("trend", (str,), "", "a trend's verdict from its interval: holds, fails or inconclusive"),
    Field("mark", _NUM, "", "the claim's threshold a trend's interval is judged against"),
    Field("pairs", (int,), "pairs", "paired measurements behind a trend's interval"),
    Field("trend_rule", (str,), "", "the rule 'holds' was judged by, in the claim's words"),
    Field("what", (str,), "", "what the measured figure is, when it is not the row's unit"),
    Field("goal", (str,), "", "a performance goal of an issue, shown next to a benchmark"),
    # roofline
    Field("flops", _NUM, "FLOP per call", "floating-point operations of one call"),
    Field("bytes", _NUM, "bytes per call", "bytes one call must move to or from memory"),
    Field("median_s", _NUM, "s", "median seconds per call"),
    # AI-9: throughput vs batch
    Field("batch", (int,), "sequences", "batch size B of a decode step"),
    Field("tokens_per_s", _NUM + (dict,), "tokens/s", "throughput (a number, or batch -> number)"),
    # QT-3: quality vs bits
    Field("bits", (int,), "bits", "weight bits"),
    Field("nll", _NUM, "nats/token", "test negative log-likelihood"),
    Field("granularity", (str, int), "", "quantization granularity: tensor, channel or a group size"),
    Field("path", (str,), "", "which launch of a kernel a row measures (quantized matmul: gemv or tiled)"),
    # SD-4/SD-5: tokens per call vs γ
    Field("gamma", (int,), "tokens", "draft tokens per round γ"),
    Field("tokens_per_call", _NUM, "tokens", "tokens emitted per target call"),
    Field("alpha", _NUM, "", "acceptance rate α"),
    Field("draft", (str,), "", "draft model name"),
    Field("drafter", (str,), "", "what proposes the draft tokens: chain, tree, heads, self, lookup (SD-12, SD-14)"),
    Field("task", (str,), "", "the generation task a figure is measured on (copy, free)"),
    Field("nodes", (int,), "nodes", "draft tokens of a token tree scored in one forward"),
    # speculative decoding: SD-2's two tokens, SD-6's optimum, the engine's sampling settings
    Field("P_A", _NUM, "probability", "SD-2: probability that the first emitted token is A"),
    Field("P_B", _NUM, "probability", "SD-2: probability that the first emitted token is B"),
    Field("best_gamma", (int,), "tokens", "the γ that maximises the estimated speedup"),
    Field("temperature", _NUM, "", "sampling temperature (0: greedy)"),
    Field("top_k", (int,), "tokens", "top-k truncation of the sampling distribution (0: none)"),
    Field("top_p", _NUM, "probability", "top-p (nucleus) truncation of the sampling distribution (1: none)"),
    Field("rounds", (int,), "rounds", "speculative rounds (target calls) of a generation"),
    Field("documents", (int,), "documents", "generated documents a fraction is taken over"),
    Field("grammatical", _NUM, "fraction", "share of generated documents the small world's checker accepts"),
    Field("ci_low", _NUM, "", "lower end of a 95% confidence interval of the measured figure"),
    Field("ci_high", _NUM, "", "upper end of a 95% confidence interval of the measured figure"),
    # statistical laws' calibration (false alarms over reseeded runs of a correct implementation,
    # power against a known-bad one)
    Field("false_alarms", (int,), "runs", "reseeded runs of a correct implementation the law rejected"),
    Field("runs", (int,), "runs", "reseeded runs behind a false-alarm rate"),
    Field("power", _NUM, "fraction", "share of reseeded runs in which the law rejected the known-bad implementation"),
    Field("power_runs", (int,), "runs", "reseeded runs behind a power"),
    Field("trials", (int,), "trials", "independent trials (samples) per statistical check"),
    # benchmarks against a reference computation
    Field("vocab_size", (int,), "tokens", "vocabulary size V"),
    Field("reference_median_s", _NUM, "s", "median seconds per call of the reference computation"),
    Field("over_reference", _NUM, "x", "median time of the implementation / the reference's"),
    # PA-2: serving
    Field("policy", (str,), "", "KV allocation policy of the serving simulation"),
    Field("utilisation", _NUM + (list,), "fraction", "share of the KV budget holding live tokens"),
    Field("utilisation_by_step", (list,), "fraction", "utilisation of each step of a serving simulation"),
    Field("total_steps", (int,), "steps", "steps a serving simulation took to finish its trace"),
    Field("metric", (str,), "", "which statistic a point of a plot is"),
    # PA-8: chunked prefill
    Field("token_budget", (int,), "tokens", "tokens one step may compute (chunked prefill; None: unchunked)"),
    Field("max_token_gap", _NUM, "s or step costs", "longest time between two tokens of a running request "
          "(seconds in a benchmark, step costs in the serving simulation)"),
    Field("total_time", _NUM, "step costs", "time a serving simulation took to finish its trace"),
    # inference_engine: what an engine declares, shown beside its cells
    Field("capabilities", (str,), "", "an engine's declared capabilities, then those it declares absent"),
)}


def _edits(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions)."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def near_miss(key: str) -> str | None:
    """The declared field ``key`` is probably a misspelling of: equal up to case and underscores;
    of the same length (>= 6) with one letter changed (two from 8 letters: utilization /
    utilisation); or, for names of 8 letters or more, at most two letters inserted, dropped or
    changed."""
    if key in FIELDS:
        return None
    low = key.lower()
    for name in FIELDS:
        if name.replace("_", "") == low.replace("_", "").replace("-", ""):
            return name
        if len(name) == len(key) >= 6 and sum(a != b for a, b in zip(name, low)) <= (2 if len(key) >= 8 else 1):
            return name
        if min(len(name), len(key)) >= 8 and _edits(name, low) <= 2:
            return name
    return None


def check(fields: dict[str, Any], *, where: str) -> None:
    """Raise ValueError for a near-miss of a declared field name or a declared field of the
    wrong type; ``where`` names the producer in the message."""
    for key, value in fields.items():
        near = near_miss(key)
        if near is not None:
            raise ValueError(f"{where}: field {key!r} is not declared; did you mean {near!r}? "
                             "(declared in conformance/fields.py)")
        f = FIELDS.get(key)
        if f is not None and not f.accepts(value):
            raise ValueError(f"{where}: field {key!r} must be {'/'.join(t.__name__ for t in f.types)}, "
                             f"got {type(value).__name__} {value!r}")
