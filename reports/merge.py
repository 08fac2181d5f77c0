"""The conformance matrix: result rows of runs made in different environments, on other machines
and devices, or as shards of one run (``pytest --shard K/N``), merged into one table.

    python -m inference_conformance.reports merge RUN... [--out DIR]

A RUN is a ``pytest --results DIR`` folder (its rows, ``run.json`` and ``impls-*.json``,
:mod:`inference_conformance.conformance.runinfo`), a report folder of ``python -m inference_conformance.reports`` (its ``rows/``), or a
folder holding such folders (a CI job's downloaded artifacts). ``--out`` (default
``inference-conformance-out/matrix`` under the current folder) receives ``index.html`` (the matrix, filterable by technique),
``report.md`` and ``results.json``.

Rows of the matrix are implementations in one environment (technique, name, package versions,
device, Hypothesis profile and example count); columns are the laws of its technique by claim;
a cell is the law's outcome over its parameters (:data:`STATUSES`, combined in the one order of
:class:`inference_conformance.conformance.outcomes.Outcome`: "crashed" outranks all),
names its runs and, failing, links its message and input; an engine's row shows its declared
capabilities (:func:`inference_conformance.reports.cells.declared_text`); the batch-invariance cell also names
the property (bitwise invariant, or the largest difference; declared or not:
:func:`inference_conformance.reports.cells.batch_invariance_text`). A newer run replaces an
older one's results for a test only as :func:`_why_kept` allows (the page says which run
replaced, or did not replace, which; shards add up). Run folders are found and read by
:mod:`inference_conformance.reports.merge_runs`; a missing or damaged one is a :class:`MergeError`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import defaultdict
from pathlib import Path

from inference_conformance.conformance import atomic
from inference_conformance.conformance.outcomes import CRASH, MATRIX_STATUSES, NOT_RUN, Outcome, matrix_status, read
from inference_conformance.conformance.results import Row, crashed
from inference_conformance.perf import env
from inference_conformance.reports import publish, templating
from inference_conformance.reports.cells import batch_invariance_text, declared_text
from inference_conformance.reports.ledger import claims
from inference_conformance.reports.merge_runs import MergeError, Run, find_runs, load, read_run, run_of  # noqa: F401

#: relative to the current folder, inside the suite's one output folder (a pip-installed suite
#: would otherwise write beside its package in site-packages, or into a project's own reports/)
DEFAULT_OUT = Path(publish.OUT_NAME) / "matrix"
#: cell statuses, worst first, as the legend lists them
STATUSES = MATRIX_STATUSES


def env_key(fp: dict) -> str:
    """The environment a run's results belong to: device kind and model, Python, torch, Triton,
    CUDA (never the date, commit or host count: re-runs of one environment share it)."""
    return " · ".join([env.device_label(dict(fp, cpu_count=None, gpu_count=None)), f"Python {fp.get('python')}",
                       f"torch {fp.get('torch')}", f"Triton {fp.get('triton')}"]
                      + ([f"CUDA {fp['cuda']}"] if fp.get("cuda") else []))


def _packages_text(packages: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(packages.items()))


def _input_of(message: str) -> tuple[str, str]:
    """(the message, the failing input): Hypothesis's shrunk "Falsifying example" or the pinned
    "Failing explicit example" with what follows, split from the assertion's own text."""
    for marker in ("Falsifying explicit example", "Failing explicit example", "Falsifying example"):
        i = message.find(marker)
        if i >= 0:
            return message[:i].strip(), message[i:].strip()
    return message.strip(), ""


def _attribute(runs: list[Run]) -> None:
    """Give each crashed row the verdict "crashed", its run's profile and its test's technique,
    claim, implementation and dtype (from the rows of the same test, law or file in any run; the
    implementation whose name starts the test's parameters; "(unknown)" where nothing says)."""
    by_check, by_law, by_file, names = {}, {}, {}, defaultdict(set)
    for run in runs:
        for (t, n) in run.packages:
            names[t].add(n)
        for r in run.rows:
            if r.technique and not crashed(r):
                by_check.setdefault(r.check, r)
                by_law.setdefault(r.check.split("[")[0], r)
                by_file.setdefault(r.check.split("::")[0], r.technique)
                if r.implementation:
                    names[r.technique].add(r.implementation)
    for run in runs:
        profile, examples = next(((r.profile, r.max_examples) for r in run.rows if r.max_examples), ("", 0))
        for i, r in enumerate(run.rows):
            if not crashed(r):
                continue
            same = by_check.get(r.check)
            law = same or by_law.get(r.check.split("[")[0])
            technique = r.technique or (law.technique if law else by_file.get(r.check.split("::")[0], "(unknown)"))
            params = r.check.partition("[")[2].rstrip("]")
            fits = [n for n in names.get(technique, ()) if params == n or params.startswith(n + "-")]
            impl = r.implementation or (same.implementation if same else max(fits, key=len) if fits
                                        else params.split("-")[0] or "(unknown)")
            run.rows[i] = dataclasses.replace(r, technique=technique, implementation=impl, verdict=Outcome.CRASHED.value,
                                              claim=r.claim or (law.claim if law else ""),
                                              dtype=r.dtype or (same.dtype if same else ""),
                                              profile=r.profile or profile, max_examples=r.max_examples or examples)


def _impl_env(run: Run, row: Row) -> str:
    """An implementation's environment in a run: the machine and stack (``env_key``) and the
    versions of the packages it needs, so that a run where its package is missing (its rows
    "not run") never replaces one where it ran, whichever is newer."""
    text = _packages_text(run.packages.get((row.technique, row.implementation), {}))
    return env_key(run.fingerprint) + (f" · {text}" if text else "")


def _profile(rows: list[Row]) -> str:
    """The Hypothesis profile and example count rows ran under ("" for rows that do not say)."""
    n = max((r.max_examples or 0 for r in rows), default=0)
    names = sorted({r.profile for r in rows if r.profile})
    return f"profile {'/'.join(names) or '?'} ({n} examples)" if n or names else ""


def _failed(o: Outcome) -> bool:
    """A failure a newer run's refusal never replaces: one that fails the law, or a listed
    failure now refused (its listing stands until a run judges the input)."""
    return o.fails_law or o is Outcome.STALE



def _refused_some(rows: list[Row]) -> tuple[int, int] | None:
    """(inputs judged, inputs drawn) over ``rows`` where some of their inputs were refused (a
    partial law's evidence), else None."""
    ev = [r.evidence for r in rows if Outcome.of(r.verdict) is Outcome.PARTIAL and (r.evidence or {}).get("examples")]
    k, n = sum(e.get("accepted", 0) for e in ev), sum(e["examples"] for e in ev)
    return (k, n) if k < n else None


def _why_kept(new: tuple[Run, list[Row]], old: tuple[Run, list[Row]]) -> str:
    """"" when the newer run's rows of a test replace the older run's, else why they do not:
    a crash replaces anything and is never replaced, a weaker profile (fewer examples) never
    replaces a stronger one, a skip never replaces a test that ran, a refusal never replaces a
    failure: a newer run that refused part of its input replaces a failure only where it judged
    (and passed) every input the failure was measured on (the failure's ``inputs``, matched
    with the newer rows' ``judged`` evidence), one that refused none judged every input."""
    (v_new, n_new), (v_old, n_old) = ((Outcome.worst(Outcome.of(r.verdict) for r in rs),
                                       max((r.max_examples or 0 for r in rs), default=0)) for _, rs in (new, old))
    if v_new is Outcome.CRASHED:
        return ""
    if v_old is Outcome.CRASHED:
        return "a crash is never replaced"
    if n_new < n_old:
        return f"it ran fewer examples ({n_new} < {n_old}): a weaker profile"
    if v_new is Outcome.SKIP and v_old is not Outcome.SKIP:
        return "it skipped the test"
    if not _failed(v_old) or _failed(v_new):
        return ""
    if v_new is Outcome.UNSUPPORTED:
        return "it refused the input the older run failed on"
    some = _refused_some(new[1])
    if some is None:
        return ""
    failed = {d for r in old[1] if _failed(Outcome.of(r.verdict)) for d in (r.failure or {}).get("inputs", ())}
    judged = {d for r in new[1] for d in (r.evidence or {}).get("judged", ())}
    if failed and failed <= judged:
        return ""
    return (f"it refused part of its input ({some[0]} of {some[1]} examples judged) and "
            + ("did not judge the input the older run failed on" if failed
               else "the older run's failure names no input it was measured on"))


def merge(runs: list[Run]) -> tuple[list[tuple[Row, Run]], list[str]]:
    """The rows the matrix shows, each with its run, and the notes on runs replaced or kept: for
    each test of an implementation in an environment (with its packages' versions), a newer run's
    rows replace an older run's only where :func:`_why_kept` allows; the rows of both are kept
    otherwise (a weaker profile's in a matrix row of their own, a skip dropped)."""
    order = sorted(runs, key=lambda r: (r.started, r.folder))
    for i, r in enumerate(order):
        r.id = f"run{i + 1}"
    _attribute(order)
    groups: dict[tuple, list] = defaultdict(list)        # key -> [(run, rows)], oldest first
    for run in order:
        mine: dict[tuple, list[Row]] = defaultdict(list)
        for row in (r for r in run.rows if r.technique and r.implementation and not r.implementation.startswith("zoo:")):
            mine[(row.technique, row.implementation, _impl_env(run, row), row.check)].append(row)
        for key, rows in mine.items():
            groups[key].append((run, rows))
    kept, replaced, refused = [], defaultdict(int), defaultdict(int)
    for key, found in groups.items():
        held: list[tuple[Run, list[Row]]] = []
        for new in found:
            stay = []
            for old in held:
                for a, b in ((new[1], old[1]), (old[1], new[1])):     # a crash that names no profile: the other's
                    a[:] = [dataclasses.replace(r, profile=b[0].profile, max_examples=b[0].max_examples)
                            if crashed(r) and not r.max_examples else r for r in a]
                why = _why_kept(new, old)
                if why:
                    stay.append(old)
                    refused[(key[0], key[1], key[2], new[0].id, old[0].id, why)] += len(new[1])
                else:
                    replaced[(key[0], key[1], key[2], old[0].id, new[0].id)] += len(old[1])
            ran = [old for old in stay if any(Outcome.of(r.verdict) is not Outcome.SKIP for r in old[1])]
            held = stay + ([] if ran and all(Outcome.of(r.verdict) is Outcome.SKIP for r in new[1]) else [new])
        kept += [(row, run) for run, rows in held for row in rows]
    by = {r.id: r for r in order}
    notes = [f"{t} / {impl} on {e}: {n} result row{'s' if n != 1 else ''} of {old} ({by[old].folder}, started "
             f"{by[old].started}) replaced by the newer {new} ({by[new].folder}, started {by[new].started})"
             for (t, impl, e, old, new), n in sorted(replaced.items())]
    notes += [f"{t} / {impl} on {e}: {n} result row{'s' if n != 1 else ''} of the newer {new} ({by[new].folder}) "
              f"did not replace {old}'s: {why}" for (t, impl, e, new, old, why), n in sorted(refused.items())]
    return kept, notes


def matrix(runs: list[Run]) -> dict:
    """The matrix as one JSON-able dict: ``runs``, ``notes`` (replaced runs), ``techniques``
    (each: ``columns`` [{claim, law}] grouped by claim, ``rows`` [{implementation, packages,
    environment, device, runs, cells}]), ``details`` (each failing cell's ``tests``: test id, dtype, verdict, message, input, run),
    ``counts`` (cells per status), ``rows`` (the kept result rows, each with its ``run``)."""
    kept, notes = merge(runs)
    rank = {c.id: i for i, c in enumerate(claims())}   # the shipped ledger: columns in ledger order
    techniques: dict[str, dict] = {}
    for row, run in kept:
        t = techniques.setdefault(row.technique, {"columns": set(), "rows": {}})
        col = (row.claim, row.check.split("::")[-1].split("[")[0])      # (claim, law)
        t["columns"].add(col)
        packages = run.packages.get((row.technique, row.implementation), {})
        profile = _profile([row])
        rkey = (row.implementation, env_key(run.fingerprint) + (f" · {profile}" if profile else ""),
                _packages_text(packages))
        mrow = t["rows"].setdefault(rkey, {"implementation": row.implementation, "environment": rkey[1],
                                           "packages": packages, "packages_text": rkey[2],
                                           "device": row.device or run.fingerprint.get("device") or "",
                                           "device_label": env.device_label(run.fingerprint),
                                           "runs": set(), "cells": defaultdict(list), "declares": ""})
        mrow["runs"].add(run.id)
        mrow["declares"] = declared_text([row.extra or {}]) or mrow["declares"]   # an engine's, beside its row
        mrow["cells"][col].append((row, run))
    details, counts, out = [], defaultdict(int), []
    for name in sorted(techniques):
        t = techniques[name]
        cols = sorted(t["columns"], key=lambda c: (rank.get(c[0], len(rank)), c[0], c[1]))
        groups = []
        for claim, law in cols:
            if groups and groups[-1]["claim"] == claim:
                groups[-1]["span"] += 1
            else:
                groups.append({"claim": claim or "(no claim)", "span": 1})
        rows = []
        for rkey in sorted(t["rows"]):
            m = t["rows"][rkey]
            cells = []
            for col in cols:
                got = m["cells"].get(col, [])
                vc: dict[Outcome, int] = defaultdict(int)
                for row, _ in got:
                    vc[read(row)] += 1
                status = matrix_status(vc)
                counts[status] += 1
                words: dict[str, int] = defaultdict(int)
                for v, n in vc.items():
                    words[v.matrix] += n
                cell = {"status": status, "counts": dict(words),
                        "text": status if len(words) <= 1 else " · ".join(f"{v} {n}" for v, n in sorted(words.items())),
                        "detail": None, "runs": sorted({run.id for _, run in got}, key=lambda i: int(i[3:]))}
                ev = [row.evidence for row, _ in got if "examples" in (row.evidence or {})]   # a partial cell: how much ran
                refused = "; ".join(sorted({c for e in ev for c in e.get("refused_classes", ())}))  # names hold commas
                cell["text"] += (f" ({sum(e['accepted'] for e in ev)} of {sum(e['examples'] for e in ev)} examples"
                                 + (f"; refused classes: {refused})" if refused else ")")) if ev else ""
                prop = batch_invariance_text([row.extra or {} for row, _ in got])   # properties/test_batch_invariance.py
                cell["text"] += f": {prop}" if prop else ""
                bad = [(row, run) for row, run in got if read(row).needs_look]
                if bad:
                    cell["detail"] = f"d{len(details) + 1}"
                    items = []
                    for row, run in bad:
                        message, example = _input_of(row.message)
                        exc = (row.failure or {}).get("exception", "")     # a law's crash: the implementation's own
                        crash = f" (crash: {exc})" if exc and exc not in ("AssertionError", CRASH) else ""
                        items.append({"check": row.check, "dtype": row.dtype, "verdict": row.verdict + crash,
                                      "message": message, "input": example, "run": run.id})
                    details.append({"id": cell["detail"], "technique": name, "implementation": m["implementation"],
                                    "environment": m["environment"], "claim": col[0], "law": col[1],
                                    "status": status, "tests": items})
                cells.append(cell)
            rows.append({k: (sorted(v) if k == "runs" else v) for k, v in m.items() if k != "cells"} | {"cells": cells})
        out.append({"name": name, "columns": [{"claim": c or "(no claim)", "law": law} for c, law in cols],
                    "groups": groups, "rows": rows})
    return {"runs": [{"id": r.id, "folder": r.folder, "started": r.started, "ended": r.ended, "shard": r.shard,
                      "environment": env_key(r.fingerprint), "commit": (r.fingerprint.get("commit") or "")[:12],
                      "n_rows": len(r.rows)} for r in sorted(runs, key=lambda r: r.id)],
            "notes": notes, "techniques": out, "details": details,
            "counts": {s: counts.get(s, 0) for s in STATUSES}, "statuses": list(STATUSES), "not_run": NOT_RUN,
            "rows": [dict(vars(row), run=run.id) for row, run in kept]}


def write(ctx: dict, out: Path) -> list[Path]:
    """index.html (the matrix page), report.md and results.json (the context and its kept rows)
    into ``out``, each whole or not at all."""
    out.mkdir(parents=True, exist_ok=True)
    html = templating.html_env().get_template("matrix.html.j2").render(matrix=ctx, standalone=True)
    md = templating.md_env().get_template("matrix.md.j2").render(matrix=ctx)
    return [atomic.write_text(out / "index.html", html), atomic.write_text(out / "report.md", md),
            atomic.write_text(out / "results.json", json.dumps(dict(ctx, kind="conformance matrix"),
                                                               default=str))]


def main(argv: list[str] | None = None, prog: str = "inference-conformance merge") -> int:
    """``merge RUN... [--out DIR]``: write the matrix of the runs; 0, or 2 naming a bad run folder."""
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", metavar="RUN", help="run folders (pytest --results DIR), report folders, "
                                                           "or folders holding them")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: %(default)s)")
    args = ap.parse_args(argv)
    try:
        runs = load(args.runs)
    except MergeError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    ctx = matrix(runs)
    for p in write(ctx, args.out):
        print(p)
    n_rows = sum(len(t["rows"]) for t in ctx["techniques"])
    print(f"{len(runs)} runs, {n_rows} implementation rows, "
          + ", ".join(f"{n} {s}" for s, n in ctx["counts"].items() if n) + " cells")
    for note in ctx["notes"]:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

