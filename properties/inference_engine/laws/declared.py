"""A capability an engine declares absent is absent (the law's body and cases:
``properties/inference_engine/declarations.py``): over every registered engine, each part declared
absent refused or judged by its law; the zoo's engine declaring no batching while it takes batches
(padded without a mask) rejected by EN-2's comparison."""
from __future__ import annotations

from hypothesis import strategies as st

from inference_conformance.conformance.laws import Kills, Law
from inference_conformance.properties.inference_engine.declarations import _declares_absent, law_declared_absent_is_absent

#: Recorded under EN-2 (the comparison its zoo entry fails); a failing part names its own law.
DECLARED = Law(claim="EN-2", technique="inference_engine", body=law_declared_absent_is_absent, given={"seed": st.integers(0, 2 ** 16)},
               examples=(dict(seed=7),), explicit_only=True, kills=(Kills(("undeclared_batching", "undeclared_batching_shared_seed",
                                                   "undeclared_per_request_params_ignored")),),
               applies=_declares_absent, params=("device",),
    test="test_engine_declared_absent_is_absent",
    zoo_tests=("test_engine_declared_zoo_rejected",))
