"""The suite's cross-cutting pieces, each defined once.

- :mod:`conformance.contracts`  one module per technique: its call contract, built-in
  implementations and known-bad (bug zoo) implementations.
- :mod:`conformance.registry`   name -> implementation, availability per device, ``--impl`` loading.
- :mod:`conformance.tolerance`  the one tolerance policy every float/exact assertion goes through.
- :mod:`conformance.results`    the result row every check emits, keyed by claim id.
- :mod:`conformance.device`     device selection (and the Triton interpreter switch on CPU).
- :mod:`conformance.plugin`     the pytest plugin (``--impl``, ``--device``, profiles, summary).
"""
