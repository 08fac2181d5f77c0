"""The ``paged_attention`` contract, in parts: the contract (``contract.py``: its text, ``CONTRACT``,
cases, coverage classes and bad calls) and its argument checks (``validate.py``: ``validate``,
``validate_prefill``). The contract's names are re-exported here: ``contracts.paged_attention.X``
is ``contract.py``'s ``X``; the checks are imported from ``contracts.paged_attention.validate``."""
from inference_conformance.conformance.contracts.paged_attention.contract import (
    CONTRACT,
    COVERAGE,
    DTYPES,
    INDEX_DTYPE,
    MAX_HEAD_DIM,
    QUERY_TILE,
    cases,
    invalid,
    kv_bytes,
)

__all__ = ["CONTRACT", "COVERAGE", "DTYPES", "INDEX_DTYPE", "MAX_HEAD_DIM", "QUERY_TILE", "cases", "invalid", "kv_bytes"]
