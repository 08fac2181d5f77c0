"""A capability an engine declares absent is absent (``declarations.py``): over every registered
engine, each part declared absent refused or judged by its law; the zoo's engine declaring no
batching while it takes batches (padded without a mask) rejected by EN-2's comparison."""
from __future__ import annotations

from inference_conformance.properties.inference_engine.declarations import DECLARED

test_engine_declared_absent_is_absent = DECLARED.conformance_test("test_engine_declared_absent_is_absent")
(test_engine_declared_zoo_rejected,) = DECLARED.make_zoo_tests("test_engine_declared_zoo_rejected")
