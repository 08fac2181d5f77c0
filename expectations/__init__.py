"""The suite's own expectation files (TOML, one per implementation that fails a law today, each
entry with its reason, measured error and reproduction): loaded for the built-ins on every run
(``inference_conformance.conformance.expectations.BUILTIN``), and passed with ``--expect expectations`` by the peer
environments. A package only so that a non-editable install carries the files."""
