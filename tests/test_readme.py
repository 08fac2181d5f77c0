"""The README's promises about set-up: exactly two Quick start lines, and CI runs the second."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def quick_start_lines() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("## Quick start", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_quick_start_has_exactly_two_command_lines():
    assert len(quick_start_lines()) == 2, quick_start_lines()


def test_ci_runs_the_readme_test_command_verbatim():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert quick_start_lines()[1] in ci, "the second Quick start line must appear verbatim in .ci/run"
