"""One module per technique, each declaring ``CONTRACT`` (a :class:`inference_conformance.conformance.registry.Contract`).

A contract with helper modules is a subpackage instead, with fixed inner names:
``<technique>/contract.py`` holds the contract (its text, ``CONTRACT`` and its public functions),
the helpers sit beside it by role (``validate.py``, ``bounds.py``, ``fp4.py``, ``fp8.py``,
``kv.py``, ``generate.py``, ``serve.py``), and ``<technique>/__init__.py`` re-exports the
contract's names, ``CONTRACT`` included: ``paged_attention/``, ``quantization/``,
``inference_engine/``. The registry reads ``CONTRACT`` from each module and subpackage here (not
from the modules inside a subpackage); ``checks.py`` (checks several contracts share) and
``glossary.py`` (the vocabulary of sizes) declare none.

Adding a technique adds a module (or subpackage) here; nothing else in the suite lists techniques.
"""
