"""The technique reference in docs/ is generated from the contracts, the registry and the
ledger; it fails here when someone changed one of those and did not regenerate it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from reports import docs

ROOT = Path(__file__).resolve().parent.parent


def test_docs_are_current():
    bad = docs.stale(ROOT / "docs")
    assert not bad, f"docs/ is stale ({', '.join(bad)}): run python -m reports.docs"


def test_every_technique_has_a_page_naming_its_zoo_and_implementations():
    from conformance import registry

    pages = docs.pages()
    for technique in registry.contracts():
        page = pages[f"{technique}.md"]
        for impl in registry.builtins(technique) + registry.zoo(technique):
            assert f"`{impl.name}`" in page, f"docs/{technique}.md does not list {impl.name}"
        assert f"[`{technique}`]({technique}.md)" in pages["index.md"]


def test_check_mode_fails_on_a_stale_page_and_names_it(tmp_path):
    for name, text in docs.pages().items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    ok = subprocess.run([sys.executable, "-m", "reports.docs", "--check", "--out", str(tmp_path)],
                        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    (tmp_path / "attention.md").write_text("# edited by hand\n", encoding="utf-8")
    (tmp_path / "speculative.md").unlink()
    bad = subprocess.run([sys.executable, "-m", "reports.docs", "--check", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1
    assert "attention.md" in bad.stderr and "speculative.md" in bad.stderr
