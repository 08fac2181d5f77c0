"""``inference-conformance list``: the techniques, their claims and their built-in implementations,
read from the suite's source without importing torch, Triton or any outside package.

The live registry (:mod:`inference_conformance.conformance.registry`) imports every layer's module
to learn its implementations, which takes torch, the kernels and the peers' adapters (10 to 50 s).
This catalog reads the same declarations statically with :mod:`ast`: each technique's contract
(``CONTRACT = Contract(technique=..., functions=...)`` in ``conformance/contracts/``), every
``builtin(...)`` call in ``reference/`` and ``optimized/`` and every ``known_bad(...)`` call in
``properties/<technique>/zoo.py`` (a technique and a name written as strings, or names drawn from a dict
literal the call iterates), and the claims from ``CLAIMS.md`` (:mod:`inference_conformance.reports.ledger`).
``tests/test_cli.py`` checks the catalog against the live registry. Which implementations run on
this machine (devices, installed packages) is the live registry's question: ``pytest --list-impls``.
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from inference_conformance.reports import docs, ledger, publish

#: The suite's root (the checkout, or the installed package folder), where its layers' folders are.
ROOT = publish.ROOT
#: The registry functions whose calls declare implementations, and the origin each gives.
_DECLARERS = {"builtin": "builtin", "known_bad": "zoo"}


@dataclass(frozen=True)
class Entry:
    """One declared implementation: ``technique``, ``name``, ``origin`` ("builtin", "adapter" or
    "zoo"), the ``module`` file declaring it (relative to the suite's root), and what its
    declaration states as constants: ``needs`` (an outside package), ``requires`` (devices),
    ``peer`` (its peer set) and ``bug`` (a zoo entry's bug text); "" where not stated."""

    technique: str
    name: str
    origin: str
    module: str
    needs: str = ""
    requires: str = ""
    peer: str = ""
    bug: str = ""


def _const(node: ast.AST | None):
    """The value of a constant expression (strings, numbers, and sets/tuples/lists of them), else None."""
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def _dict_keys(scope: ast.AST) -> dict[str, list[str]]:
    """Names assigned a dict literal with string keys in ``scope``: name -> its keys, in order."""
    found = {}
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            keys = [_const(k) for k in node.value.keys]
            if keys and all(isinstance(k, str) for k in keys):
                found[node.targets[0].id] = keys
    return found


def _loop_names(scope: ast.AST, dicts: dict[str, list[str]]) -> dict[str, list[str]]:
    """Loop variables of ``scope`` (``for`` or comprehension) that run over a dict literal's keys
    (``for name in D``, ``for name, value in D.items()``): variable -> the keys."""
    out = {}
    gens = [n for n in ast.walk(scope) if isinstance(n, (ast.comprehension, ast.For))]
    for g in gens:
        it, target = g.iter, g.target
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and it.func.attr == "items":
            it = it.func.value
            target = target.elts[0] if isinstance(target, ast.Tuple) and target.elts else None
        if isinstance(it, ast.Name) and it.id in dicts and isinstance(target, ast.Name):
            out[target.id] = dicts[it.id]
    return out


def _declared(path: Path, root: Path) -> list[Entry]:
    """Every implementation the module at ``path`` declares with ``builtin(...)`` or ``known_bad(...)``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    out = []
    for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.Module))]:
        loops = _loop_names(fn, _dict_keys(fn))
        for call in ast.walk(fn):
            if not isinstance(call, ast.Call) or len(call.args) < 2:
                continue
            f = call.func
            declarer = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            technique = _const(call.args[0])
            if declarer not in _DECLARERS or not isinstance(technique, str):
                continue
            name = call.args[1]
            names = [name.value] if isinstance(name, ast.Constant) and isinstance(name.value, str) else \
                loops.get(name.id, []) if isinstance(name, ast.Name) else []
            kw = {k.arg: _const(k.value) for k in call.keywords if k.arg}
            origin = "adapter" if kw.get("adapter") is True else _DECLARERS[declarer]
            requires = ",".join(sorted(kw["requires"])) if isinstance(kw.get("requires"), (set, tuple, list)) else ""
            for n in names:
                out.append(Entry(technique, n, origin, path.relative_to(root).as_posix(), needs=kw.get("needs") or "",
                                 requires=requires, peer=kw.get("peer") or "", bug=kw.get("bug") or ""))
    unique = {(e.technique, e.origin == "zoo", e.name): e for e in out}     # a module walked as its function too
    return list(unique.values())


def techniques(root: Path = ROOT) -> dict[str, dict]:
    """Technique name -> ``{"functions": [...], "optional": [...], "doc": first line, "module": file}``
    from each contract module's ``CONTRACT = Contract(...)``: ``conformance/contracts/<technique>.py``
    or, for a contract in parts, ``conformance/contracts/<technique>/contract.py``."""
    out = {}
    contracts = root / "conformance" / "contracts"
    for path in sorted([*contracts.glob("*.py"), *contracts.glob("*/contract.py")]):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CONTRACT" for t in node.targets) \
                    and isinstance(node.value, ast.Call):
                kw = {k.arg: k.value for k in node.value.keywords if k.arg}
                name = _const(kw.get("technique"))
                if isinstance(name, str):
                    doc = ast.get_docstring(tree) or ""
                    out[name] = {"functions": list(_const(kw.get("functions")) or ()),
                                 "optional": list(_const(kw.get("optional")) or ()),
                                 "doc": doc, "module": path.relative_to(root).as_posix()}
    return out


def implementations(root: Path = ROOT) -> list[Entry]:
    """Every declared implementation: references, optimized built-ins and adapters, then the zoo."""
    files = sorted((root / "reference").rglob("*.py")) + sorted((root / "optimized").rglob("*.py")) \
        + sorted((root / "properties").glob("*/zoo.py"))
    return [e for f in files for e in _declared(f, root)]


def zoo(root: Path = ROOT) -> dict[str, list[str]]:
    """Technique -> the names of its known-bad implementations, as ``properties/<technique>/zoo.py``
    declares them (what the kill rate counts, every one)."""
    out: dict[str, list[str]] = {}
    for f in sorted((root / "properties").glob("*/zoo.py")):
        for e in _declared(f, root):
            if e.origin == "zoo":
                out.setdefault(e.technique, []).append(e.name)
    return out


def catalog(root: Path = ROOT) -> dict:
    """The whole catalog as one JSON-able dict: ``techniques`` (each with its contract's
    ``functions``, its ``claims`` (ids its contract or laws name) and ``implementations`` /
    ``zoo`` (:class:`Entry` dicts)) and ``claims`` (every ledger claim: id, kind, text, section)."""
    techs = techniques(root)
    impls = implementations(root)
    out = {}
    for name, t in sorted(techs.items()):
        own = (f"reference/{name}.py", f"optimized/{name}.py", f"reference/{name}/__init__.py", f"optimized/{name}/__init__.py")   # the technique's own modules first
        mine = [asdict(e) for e in sorted((e for e in impls if e.technique == name),
                                          key=lambda e: (e.origin == "zoo", e.module not in own, e.module[0] != "r"))]
        out[name] = {"functions": t["functions"], "optional": t["optional"], "contract": t["module"],
                     "claims": docs._technique_claims(name, t["doc"], root),
                     "implementations": [e for e in mine if e["origin"] != "zoo"],
                     "zoo": [e for e in mine if e["origin"] == "zoo"]}
    return {"techniques": out, "claims": [asdict(c) for c in ledger.claims()]}


def render(cat: dict, what: str = "all") -> str:
    """The catalog as text: ``what`` is "techniques", "claims", "impls" or "all"."""
    lines = []
    if what in ("all", "techniques", "impls"):
        for name, t in cat["techniques"].items():
            fns = ", ".join(t["functions"] + [f"[{o}]" for o in t["optional"]])
            lines.append(f"{name}: {fns}; claims {' '.join(t['claims']) or '-'}")
            if what == "techniques":
                continue
            for e in t["implementations"]:
                notes = "; ".join(x for x in (e["requires"] and f"device {e['requires']}", e["needs"] and
                                              f"needs {e['needs']}", e["peer"] and f"peer set {e['peer']}") if x)
                lines.append(f"  {e['origin']:<8} {e['name']}" + (f"  ({notes})" if notes else ""))
            zoo = [e["name"] for e in t["zoo"]]
            lines.append(f"  zoo      {len(zoo)} known-bad: {', '.join(zoo)}")
    if what in ("all", "claims"):
        lines += [f"{c['id']:<6} {c['kind']:<8} {c['text']}" for c in cat["claims"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None, prog: str = "inference-conformance list") -> int:
    """Print the catalog (``--json``: as JSON); returns 0."""
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0].replace("``", ""),
                                 epilog="Which implementations run here: pytest --list-impls (imports them).")
    ap.add_argument("what", nargs="?", default="all", choices=["all", "techniques", "claims", "impls"],
                    help="what to list (default: all)")
    ap.add_argument("--json", action="store_true", help="print the catalog as JSON")
    a = ap.parse_args(argv)
    cat = catalog()
    print(json.dumps(cat, indent=1) if a.json else render(cat, a.what))
    return 0


if __name__ == "__main__":
    sys.exit(main())
