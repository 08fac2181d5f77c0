"""The ``inference_engine`` contract's built-ins: the float64 reference (``reference``, the engine of
:mod:`inference_conformance.reference.inference_engine` given the small world's folder reader), the suite's own
engines through thin adapters (:mod:`.suite`: ``paged``, the continuous-batching engine with its
prefix cache and chunked prefill; ``speculative``, the speculative engine with a draft model) and
the adapters of real engines (:mod:`.hf`: transformers' ``generate``), each listed unavailable,
with the reason, where its package is missing."""
from __future__ import annotations


def implementations():
    from inference_conformance.conformance.registry import builtin
    from inference_conformance.optimized.inference_engine import hf, suite

    return (
        builtin("inference_engine", "reference", suite.reference_engine()),
        builtin("inference_engine", "paged", suite.PagedAdapter()),
        builtin("inference_engine", "speculative", suite.SpeculativeAdapter()),
        *hf.registrations(),
    )
