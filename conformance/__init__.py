"""The suite's cross-cutting pieces, each defined once.

- :mod:`inference_conformance.conformance.contracts`  one module (or subpackage) per technique: its call contract.
- :mod:`inference_conformance.conformance.registry`   name -> implementation, availability per device, ``--impl`` loading.
- :mod:`inference_conformance.conformance.tolerance`  the one tolerance policy every float/exact assertion goes through.
- :mod:`inference_conformance.conformance.results`    the result row every check emits, keyed by claim id.
- :mod:`inference_conformance.conformance.device`     device selection (and the Triton interpreter switch on CPU).
- :mod:`inference_conformance.conformance.plugin`     the pytest plugin (``--impl``, ``--device``, profiles, summary).
"""
