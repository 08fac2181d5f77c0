"""inference-conformance: a conformance and benchmark suite for LLM inference techniques.

One import name. Installed (a wheel or an editable install), every part of the suite is a
subpackage of this one: ``inference_conformance.conformance`` (contracts, registry, tolerance,
the pytest plugin), ``.reference``, ``.optimized``, ``.properties``, ``.benchmarks``, ``.perf``,
``.reports``, ``.smallworld`` and ``.expectations``. The repository keeps those folders at its top
(the layout the suite was asked for); the wheel maps each into this package
(``[tool.setuptools] package-dir`` in ``pyproject.toml``), so nothing else goes into site-packages.

From a checkout that is not installed (``PYTHONPATH=<checkout>``, as on a machine where nothing
can be installed), this file is found in the checkout's ``inference_conformance/`` folder and
adds the checkout's root to the package's search path, so that the same imports find the
top-level folders. Installed from a wheel, the subpackages sit beside this file and nothing is
added.
"""
from __future__ import annotations

from pathlib import Path as _Path

_HERE = _Path(__file__).resolve().parent
_CHECKOUT = _HERE.parent
if not (_HERE / "conformance").is_dir() and (_CHECKOUT / "conformance" / "plugin.py").is_file():
    __path__.append(str(_CHECKOUT))  # type: ignore[name-defined]  # noqa: F821

#: The subpackages, in the order data flows (contracts -> implementations -> laws -> report).
SUBPACKAGES = ("conformance", "reference", "optimized", "smallworld", "properties", "benchmarks", "perf", "reports",
               "expectations")
