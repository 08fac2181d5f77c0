"""The technique reference in docs/ is generated from the contracts, the registry and the
ledger; it fails here when someone changed one of those and did not regenerate it. Every
relative link of README.md, CONTRIBUTING.md and docs/ must point to a file that exists, and the
README stays short (the detail lives in docs/guide/)."""
from __future__ import annotations

import re
from pathlib import Path

from inference_conformance.reports import docs

ROOT = Path(__file__).resolve().parent.parent


def test_docs_are_current():
    bad = docs.stale(ROOT / "docs")
    assert not bad, f"docs/ is stale ({', '.join(bad)}): run python -m inference_conformance.reports.docs"


def test_every_claim_has_a_test_that_shows_its_check_failing():
    """The ledger's every verdict can fail (docs/claims.md): each claim of CLAIMS.md has a zoo test
    or a ``test_<claim>_rejects_*`` test marked with it (properties/falsify.py)."""
    from inference_conformance.reports import falsifiers

    missing = falsifiers.claims_without_rejection()
    assert not missing, f"claims with no test showing their check reject a known-bad input: {missing}"


def test_every_technique_has_a_page_naming_its_zoo_and_implementations():
    from inference_conformance.conformance import registry

    pages = docs.pages()
    for technique in registry.contracts():
        page = pages[f"{technique}.md"]
        for impl in registry.builtins(technique) + registry.zoo(technique):
            assert f"`{impl.name}`" in page, f"docs/{technique}.md does not list {impl.name}"
        assert f"[`{technique}`]({technique}.md)" in pages["index.md"]


def test_check_mode_fails_on_a_stale_page_and_names_it(tmp_path, capsys):
    """``python -m inference_conformance.reports.docs --check`` (its ``main``, in this process: its pages are computed
    once per process, a subprocess would collect properties/ again): 0 on current pages; 1 naming
    every page edited by hand or missing."""
    for name, text in docs.pages().items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    assert docs.main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "attention.md").write_text("# edited by hand\n", encoding="utf-8")
    (tmp_path / "speculative.md").unlink()
    capsys.readouterr()
    assert docs.main(["--check", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "attention.md" in err and "speculative.md" in err, err


LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|^\s*\[[^\]]+\]:\s*(\S+)", re.M)


def _relative_links(text: str) -> list[str]:
    """The relative link targets of a markdown text (fenced blocks and inline code removed,
    anchors and queries cut off; web, mail and in-page links skipped)."""
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.M | re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    out = []
    for m in LINK.finditer(text):
        target = m.group(1) or m.group(2)
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
            continue
        out.append(target.split("#", 1)[0].split("?", 1)[0])
    return out


def test_every_relative_link_points_to_a_file_that_exists():
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken, seen = [], 0
    for path in files:
        for target in _relative_links(path.read_text(encoding="utf-8")):
            seen += 1
            if not (path.parent / target).exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, "links to missing files:\n" + "\n".join(broken)
    assert seen, "no relative link found: the link pattern is broken"


def test_link_finder_sees_links_and_skips_code():
    text = ("see [a](docs/a.md#x) and ![p](img.png) [web](https://x.org) [in](#top)\n"
            "`[not](inline.md)`\n```sh\n[not](fenced.md)\n```\n[ref]: guide/b.md\n")
    assert _relative_links(text) == ["docs/a.md", "img.png", "guide/b.md"]


def test_readme_stays_short():
    n = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert n < 300, f"README.md has {n} lines: move detail to docs/guide/ (under 300)"
