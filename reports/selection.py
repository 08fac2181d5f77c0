"""Which tests the main job (``python -m inference_conformance.reports``) runs in its laws stage.

The report judges claims, so the main job runs the tests that name one: every test of
``properties/`` and of ``tests/`` that carries a ``claim`` marker (the laws, their zoo tests, the
claims' rejection tests and the analytic tests of the small world), selected by ``-m claim``.
Everything else runs in CI (``.ci/run``), never in the main job: the suite's tooling tests
(packaging, wheel builds, tox, the stacks, the browser, the report's own unit tests), the
contracts' bad-input checks (``tests/test_*_errors.py``) and the generic contract checks
(``properties/test_contract_generic.py``: inputs not mutated, repeats identical), which name no
claim. A ``tests/`` file is passed to pytest only when its source declares a claim, so the
tooling files are not even imported.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

#: A ``claim`` marker in a test file's source: a decorator or a module-level ``pytestmark``.
CLAIM_MARK = re.compile(r"^\s*(@pytest\.mark\.claim\(|pytestmark\s*=.*\bmark\.claim\()", re.MULTILINE)
#: The folder of the laws: all of it is collected (``-m claim`` keeps the tests naming a claim).
LAWS = "properties"
#: The folder of the suite's own tests: only files declaring a claim are passed.
TESTS = "tests"


def declares_claim(path: str | os.PathLike) -> bool:
    """Whether the test file at ``path`` declares a ``claim`` marker. Raises FileNotFoundError
    when it does not exist."""
    return CLAIM_MARK.search(Path(path).read_text(encoding="utf-8")) is not None


def analytic_tests(root: str | os.PathLike) -> list[str]:
    """The ``tests/test_*.py`` files under ``root`` (the suite's checkout or installed package)
    that declare a claim, as paths relative to ``root``, sorted; [] without a ``tests/`` folder."""
    folder = Path(root) / TESTS
    if not folder.is_dir():
        return []
    return [f"{TESTS}/{p.name}" for p in sorted(folder.glob("test_*.py")) if declares_claim(p)]


def main_job_paths(root: str | os.PathLike) -> list[str]:
    """The paths the laws stage passes to pytest (relative to ``root``): ``properties`` and
    :func:`analytic_tests`."""
    return [LAWS, *analytic_tests(root)]


def marker_args(user_args: list[str] | tuple[str, ...] = ()) -> list[str]:
    """``["-m", "claim"]``, or [] when ``user_args`` (extra pytest arguments) choose their own
    marker expression (``-m EXPR`` or ``-mEXPR``). Raises TypeError for a str (a list is
    expected)."""
    if isinstance(user_args, str):
        raise TypeError("user_args must be a list of arguments, not a str")
    if any(a == "-m" or (a.startswith("-m") and not a.startswith("--")) for a in user_args):
        return []
    return ["-m", "claim"]
