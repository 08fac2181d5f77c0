"""The public API module (``inference_conformance.api``): one stable name for what an outside
implementation uses, and nothing of the suite's contracts missing from it."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_contract_is_in_the_api_under_its_technique():
    from inference_conformance import api
    from inference_conformance.conformance import registry

    assert set(api.CONTRACT_MODULES) == set(registry.contracts())
    for technique, module in api.CONTRACT_MODULES.items():
        assert getattr(api, technique) is module and module.CONTRACT is registry.contract(technique)


def test_the_api_exports_exactly_what_it_names():
    from inference_conformance import api

    tree = ast.parse((ROOT / "inference_conformance" / "api.py").read_text())
    imported = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert set(api.__all__) == (imported - {"annotations"}) | {"CONTRACT_MODULES"}
    assert all(name in api.__doc__ for name in ("check_close", "builtin", "Law", "refusal", "inference_engine"))


def test_the_api_imports_no_implementation():
    """An outside project importing the API loads no built-in implementation or law module."""
    code = ("import sys, inference_conformance.api\n"
            "print(sorted(m for m in sys.modules if m.split('.')[:2] in (['inference_conformance', 'optimized'], "
            "['inference_conformance', 'reference'], ['inference_conformance', 'properties'])))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout
