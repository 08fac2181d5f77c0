"""The ``inference_engine`` contract, in parts: the contract (``contract.py``: its text,
``CONTRACT``, the completions and capabilities, the refusals and bad calls), the ``generate``
call's requests, settings and check (``generate.py``: ``Request``, ``Params``, ``validate``) and
the ``serve`` call's schedule and check (``serve.py``: ``Arrival``, ``Fork``, ``validate_serve``).
Every public name of the three is re-exported here: ``contracts.inference_engine.X`` is the
contract's ``X``."""
from inference_conformance.conformance.contracts.inference_engine.contract import (
    CONTRACT,
    SEEDING,
    Capabilities,
    Completion,
    check_vocab,
    folder_vocab_size,
    invalid,
    logit_bound,
    refuse_unoffered,
    sampling_of,
)
from inference_conformance.conformance.contracts.inference_engine.generate import (
    PADDING_SIDES,
    SPECULATIVE_METHODS,
    Params,
    Request,
    validate,
)
from inference_conformance.conformance.contracts.inference_engine.serve import (
    SERVE_FEATURES,
    Arrival,
    Fork,
    invalid_serve,
    refuse_unserved,
    validate_serve,
)

__all__ = ["CONTRACT", "PADDING_SIDES", "SEEDING", "SERVE_FEATURES", "SPECULATIVE_METHODS", "Arrival", "Capabilities",
           "Completion", "Fork", "Params", "Request", "check_vocab", "folder_vocab_size", "invalid", "invalid_serve",
           "logit_bound", "refuse_unoffered", "refuse_unserved", "sampling_of", "validate", "validate_serve"]
