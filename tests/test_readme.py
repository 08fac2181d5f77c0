"""The README's promises about set-up: exactly two Quick start lines, the first the one command's main
job, CI runs the second; every subcommand the README names exists."""
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


def test_quick_start_runs_the_one_command():
    """The first line ends in the one command's main job (``inference-conformance run``)."""
    assert quick_start_lines()[0].endswith(".venv/bin/inference-conformance run"), quick_start_lines()[0]


def test_every_subcommand_the_readme_names_is_one():
    """Each ``inference-conformance SUB`` the README shows in code is a subcommand of the command."""
    import re

    from inference_conformance.cli import SUBCOMMANDS

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`(?:\.venv/bin/)?inference-conformance ([a-z][a-z-]*)", text))
    named |= {line.rsplit(" ", 1)[-1] for line in quick_start_lines() if "inference-conformance " in line}
    assert "run" in named and named <= set(SUBCOMMANDS), sorted(named - set(SUBCOMMANDS))
