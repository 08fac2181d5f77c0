"""The plugin's terminal summary: per law x implementation, the outcome over the law's
parameters (counts where they differ) and a failure's worst measured error against its bound, in
at most :data:`WIDTH` columns."""
from __future__ import annotations

import textwrap
from collections import defaultdict

from inference_conformance.conformance.outcomes import Outcome

#: The widest line of the table (columns): long law names are cut, long implementation names
#: numbered and named above it.
WIDTH = 100


def _cell(outcomes: list[tuple[str, float | None, float | None]]) -> str:
    """One law x implementation cell: its outcome over the law's parameters (dtypes, cases), with
    the counts where they differ, worst first in the one order of
    :class:`inference_conformance.conformance.outcomes.Outcome` ("fail:1,pass:3", its short words),
    and for a failure its worst measured error and bound ("fail(3.6e-01>5.6e-13)") when a
    comparison failed (a failure of another check, a malformed result say, is a plain "fail": its
    comparisons held); no spaces, one token per cell."""
    counts: dict[Outcome, int] = {}
    for verdict, _, _ in outcomes:
        counts[Outcome.of(verdict)] = counts.get(Outcome.of(verdict), 0) + 1
    parts = sorted(counts, key=lambda o: -o.severity)
    text = parts[0].value if len(parts) == 1 else ",".join(f"{o.terminal}:{counts[o]}" for o in parts)
    failed = [(m / b if b else float("inf"), m, b) for v, m, b in outcomes
              if Outcome.of(v).new_failure and m is not None and b is not None and not m <= b]
    if failed:
        _, m, b = max(failed)
        text += f"({m:.1e}>{b:.1e})"
    return text.replace(" ", "_")


def _table(verdicts: list[tuple]) -> tuple[dict, list[str]]:
    """(law key -> implementation -> cell, the implementations in order of appearance)."""
    outcomes: dict[tuple[str, str], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    impls: list[str] = []
    for technique, law, claim, name, verdict, *figures in verdicts:
        key = (technique, f"{law} {claim}".strip())
        if name not in impls:
            impls.append(name)
        measured, bound = (figures + [None, None])[:2]
        outcomes[key][name].append((verdict, measured, bound))
    return {key: {name: _cell(cells) for name, cells in row.items()} for key, row in outcomes.items()}, impls


def _widths(table: dict, impls: list[str], heads: list[str]) -> list[int]:
    return [max(len(h), *(len(row.get(i, ".")) for row in table.values())) for h, i in zip(heads, impls)]


def _heads(table: dict, impls: list[str]) -> list[str]:
    """The columns' heads: the implementations' names, or "[1]", "[2]", ... ("-" stays) where the
    names would make the table wider than :data:`WIDTH`."""
    longest = max(len(f"{t}: {k}") for t, k in table)
    if longest + sum(c + 2 for c in _widths(table, impls, impls)) <= WIDTH:
        return impls
    return [i if i == "-" else f"[{n}]" for n, i in enumerate(impls, 1)]


def impl_heads(verdicts: list[tuple]) -> dict[str, str]:
    """implementation -> the head of its column in the table (its name, or its number "[2]")."""
    if not verdicts:
        return {}
    table, impls = _table(verdicts)
    return dict(zip(impls, _heads(table, impls)))


def write(terminalreporter, verdicts: list[tuple]) -> None:
    """The section "conformance verdicts" of the terminal summary: one line per law, one column
    per implementation, from the ``conformance_verdicts`` the plugin collects (technique, law,
    claim, implementation, verdict, measured, bound)."""
    if not verdicts:
        return
    table, impls = _table(verdicts)
    tr = terminalreporter
    tr.section("conformance verdicts (per law and implementation, over its parameters)")
    labels = {key: f"{key[0]}: {key[1]}" for key in table}
    heads = _heads(table, impls)
    for head, name in zip(heads, impls):
        if head != name:                        # numbered: named above the table
            tr.write_line(_fit(f"{head} {name}"))
    cols = _widths(table, impls, heads)
    width = max(12, min(max(len(v) for v in labels.values()), WIDTH - sum(c + 2 for c in cols)))
    tr.write_line(" " * width + "".join(f"  {h:>{c}}" for h, c in zip(heads, cols)))
    for key, row in sorted(table.items()):
        cells = "".join(f"  {row.get(i, '.'):>{c}}" for i, c in zip(impls, cols))
        tr.write_line(_fit(_fit(labels[key], width).ljust(width) + cells))
    for line in textwrap.wrap(
            "a cell: the outcome over the law's parameters (counts where they differ, worst first; "
            + "; ".join(f"{o.terminal} = {o.value}" for o in reversed(Outcome) if o.terminal != o.value)
            + "; stale: a listed failure now refused or skipped; thin: fewer than a quarter of the examples "
            "accepted), a failure with its worst measured error > bound; '.': not run there", WIDTH):
        tr.write_line(line)


def _fit(text: str, width: int | None = None) -> str:
    """``text`` cut to ``width`` columns (default :data:`WIDTH`), its end marked "~"."""
    width = WIDTH if width is None else width
    return text if len(text) <= width else text[: width - 1] + "~"
