"""The plugin's terminal summary: per law x implementation, the outcome over the law's
parameters (counts where they differ) and a failure's worst measured error against its bound."""
from __future__ import annotations

from collections import defaultdict


_SHORT = {"unsupported": "unsup", "expected fail": "xfail", "unexpected pass": "xpass", "stale expectation": "stale",
          "not enough evidence": "thin"}


def _cell(outcomes: list[tuple[str, float | None, float | None]], order: list[str]) -> str:
    """One law x implementation cell: its outcome over the law's parameters (dtypes, cases), with
    the counts where they differ ("pass:3,unsup:1"), and for a failure its worst measured error
    and bound ("fail(3.6e-01>5.6e-13)") when a comparison failed (a failure of another check, a
    malformed result say, is a plain "fail": its comparisons held); no spaces, one token per cell."""
    counts: dict[str, int] = {}
    for verdict, _, _ in outcomes:
        counts[verdict] = counts.get(verdict, 0) + 1
    rank = {v: order.index(v) if v in order else len(order) for v in counts}
    parts = sorted(counts, key=lambda v: -rank[v])
    text = parts[0] if len(parts) == 1 else ",".join(f"{_SHORT.get(v, v)}:{counts[v]}" for v in parts)
    failed = [(m / b if b else float("inf"), m, b) for v, m, b in outcomes
              if v in ("fail", "error") and m is not None and b is not None and not m <= b]
    if failed:
        _, m, b = max(failed)
        text += f"({m:.1e}>{b:.1e})"
    return text.replace(" ", "_")


def write(terminalreporter, verdicts: list[tuple]) -> None:
    """The section "conformance verdicts" of the terminal summary: one line per law, one column
    per implementation, from the ``conformance_verdicts`` the plugin collects (technique, law,
    claim, implementation, verdict, measured, bound)."""
    if not verdicts:
        return
    order = ["pass", "skip", "unsupported", "partial", "not enough evidence", "unexpected pass", "expected fail",
             "stale expectation", "error", "fail"]
    outcomes: dict[tuple[str, str], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    impls: list[str] = []
    for technique, law, claim, name, verdict, *figures in verdicts:
        key = (technique, f"{law} {claim}".strip())
        if name not in impls:
            impls.append(name)
        measured, bound = (figures + [None, None])[:2]
        outcomes[key][name].append((verdict, measured, bound))
    table = {key: {name: _cell(cells, order) for name, cells in row.items()} for key, row in outcomes.items()}
    tr = terminalreporter
    tr.section("conformance verdicts (per law and implementation, over its parameters)")
    width = max(len(f"{t}: {k}") for t, k in table) + 2
    col = max(12, *(len(c) for row in table.values() for c in row.values()), *(len(i) for i in impls))
    tr.write_line(" " * width + "  ".join(f"{i:>{col}}" for i in impls))
    for (t, k), row in sorted(table.items()):
        tr.write_line(f"{t}: {k}".ljust(width) + "  ".join(f"{row.get(i, '.'):>{col}}" for i in impls))
    tr.write_line("a cell: the outcome over the law's parameters (counts where they differ; unsup = "
                  "unsupported; stale = a listed failure now refused or skipped; thin = not enough evidence, "
                  "fewer than a quarter of the examples accepted), a failure with its worst "
                  "measured error > bound; '.': not run there")
