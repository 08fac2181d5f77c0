"""``inference-conformance``: the suite's one command.

    inference-conformance run | merge | expect | gate | ab | list | docs | export-model [ARGS...]

Each subcommand hands its arguments, unchanged, to the ``main`` of the module that does the
work (its own ``--help`` gives its options); the ``python -m`` forms of those modules stay as
aliases. ``python -m inference_conformance`` is this command. Outputs go to
``./inference-conformance-out/`` under the current folder unless a subcommand is told otherwise.
Only the chosen subcommand's module is imported, so ``list`` and ``--help`` import no torch.

Exit status: the subcommand's; 2 for an unknown subcommand or bad arguments.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
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


def main(argv: list[str] | None = None) -> int:
    """Run ``inference-conformance`` with ``argv`` (default: the command line); returns the exit status.
    The subcommand's own arguments go to its module's ``main`` as they are."""
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
    if "prog" in inspect.signature(module.main).parameters:   # else its usage names its python -m form
        return module.main(rest, prog=f"{PROG} {name}")
    return module.main(rest)


if __name__ == "__main__":
    sys.exit(main())
