"""inference-conformance: a conformance and benchmark suite for LLM inference techniques.

One import name. Every part of the suite is a subpackage of this one:
``inference_conformance.conformance`` (contracts, registry, tolerance, the pytest plugin),
``.reference``, ``.optimized``, ``.properties``, ``.benchmarks``, ``.perf``, ``.reports``,
``.smallworld`` and ``.expectations``. The repository keeps those folders at its top (the layout
the suite was asked for), and this package's folder holds a symbolic link to each
(``inference_conformance/reference -> ../reference``): a checkout is a plain package tree, which
an IDE, a type checker or an import-graph tool reads as it is, on ``PYTHONPATH`` or installed
editable. The wheel holds the linked folders' files under this one name, so nothing else goes
into site-packages.
"""
from __future__ import annotations

#: The subpackages, in the order data flows (contracts -> implementations -> laws -> report).
SUBPACKAGES = ("conformance", "reference", "optimized", "smallworld", "properties", "benchmarks", "perf", "reports",
               "expectations")
