"""``inference-conformance``: the suite's one command.

    inference-conformance run | merge | expect | gate | ab | list | docs | export-model [ARGS...]

Each subcommand hands its arguments, unchanged, to the ``main`` of the module that does the
work (its own ``--help`` gives its options); the ``python -m`` forms of those modules stay as
aliases. ``python -m inference_conformance`` is this command. Outputs go to
``./inference-conformance-out/`` under the current folder unless a subcommand is told otherwise.
Only the chosen subcommand's module is imported, so ``list`` and ``--help`` import no torch.
A subcommand's help is printed without the reStructuredText markup of the docstrings it is made
from (:func:`plain`), and output cut short by its reader (``inference-conformance list | head``)
ends the command quietly.

Exit status: the subcommand's; 2 for an unknown subcommand or bad arguments.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import os
import re
import sys

PROG = "inference-conformance"
#: subcommand -> (the module whose ``main(argv)`` runs it, its one-line description)
SUBCOMMANDS = {
    "run": ("inference_conformance.reports.__main__",
            "run the properties and benchmarks and write the report (--impl checks your implementation)"),
    "merge": ("inference_conformance.reports.merge", "merge run folders (pytest --results DIR) into one conformance matrix"),
    "expect": ("inference_conformance.reports.expect", "write or refresh expectation files from a run's rows"),
    "gate": ("inference_conformance.perf.gate", "the regression gate: compare a benchmark run with the history"),
    "ab": ("inference_conformance.perf.ab", "interleaved A/B timing of two checkouts or two implementations"),
    "list": ("inference_conformance.catalog", "techniques, claims and built-in implementations (fast: imports no torch)"),
    "docs": ("inference_conformance.reports.docs", "write or --check the technique reference pages"),
    "export-model": ("inference_conformance.smallworld.hf_export",
                     "write the small world's checkpoints as Hugging Face Llama folders, checked in float64"),
}


def parser() -> argparse.ArgumentParser:
    """The top-level parser: its help lists every subcommand with its one line."""
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0].replace("``", ""),
                                 epilog=f"{PROG} SUBCOMMAND --help gives a subcommand's options.")
    sub = ap.add_subparsers(dest="command", metavar="SUBCOMMAND", title="subcommands")
    for name, (_, line) in SUBCOMMANDS.items():
        sub.add_parser(name, help=line, add_help=False)
    return ap


#: reStructuredText roles and literals: ":func:`a.b.c`", "``x``", "`x`"
_ROLE = re.compile(r":[a-z]+:`~?(?:[\w.]*\.)?([^`<]+?)(?: <[^>]*>)?`")
_LITERAL = re.compile(r"``([^`]+)``|(?<![\w`])`([^`]+)`(?![\w`])")


def plain(text: str) -> str:
    """``text`` without reStructuredText markup: a role keeps its target's last name
    (":func:`inference_conformance.perf.gate.main`" -> "main"), a literal its text."""
    text = _ROLE.sub(lambda m: m[1], text)
    return _LITERAL.sub(lambda m: m[1] or m[2], text)


@contextlib.contextmanager
def _plain_help():
    """Within the block, every argparse help and usage text is printed through :func:`plain`."""
    saved = argparse.ArgumentParser.format_help, argparse.ArgumentParser.format_usage
    argparse.ArgumentParser.format_help = lambda self: plain(saved[0](self))
    argparse.ArgumentParser.format_usage = lambda self: plain(saved[1](self))
    try:
        yield
    finally:
        argparse.ArgumentParser.format_help, argparse.ArgumentParser.format_usage = saved


def main(argv: list[str] | None = None) -> int:
    """Run ``inference-conformance`` with ``argv`` (default: the command line); returns the exit
    status (0 when the reader of its output closed it early: ``list | head``)."""
    try:
        return _main(argv)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)   # the reader left: nothing more to write, no traceback at exit
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _main(argv: list[str] | None = None) -> int:
    """:func:`main`'s work: the subcommand's own arguments go to its module's ``main`` as they are."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SUBCOMMANDS:
        ap = parser()
        if not argv:
            ap.print_help()
            return 2
        ap.parse_args(argv[:1])          # --help prints the list and exits 0; an unknown name exits 2
        return 2
    name, rest = argv[0], argv[1:]
    module = importlib.import_module(SUBCOMMANDS[name][0])
    with _plain_help():
        if "prog" in inspect.signature(module.main).parameters:   # else its usage names its python -m form
            return module.main(rest, prog=f"{PROG} {name}")
        return module.main(rest)


if __name__ == "__main__":
    sys.exit(main())
