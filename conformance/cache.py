"""The experiment cache: an expensive experiment's result, kept by the content of what it
depends on, so that a rerun recomputes only what changed and says which results it reused.

An entry's key is the SHA-256 of: the experiment's name, its seed, its size and parameters (a
JSON-able dict), the source of the whole suite (every ``.py`` file of every subpackage: the code
it calls, whichever that is; simple and safe), the bytes of the small world's checkpoints, and
the versions of Python, torch and Triton. An experiment timed by the wall clock adds the machine
(:func:`machine`) to its parameters. Change any of them and the key changes: the old entry is
never read again.

Entries are JSON files ``<key>.json`` under ``~/.cache/inference-conformance/experiments/``, or
under the folder ``INFERENCE_CONFORMANCE_CACHE`` names; ``INFERENCE_CONFORMANCE_CACHE=off``
turns the cache off (every experiment computes). Writes are atomic
(:mod:`inference_conformance.conformance.atomic`); an entry that cannot be read back (damaged,
truncated by hand, written for another key) is recomputed with a warning.

An entry holds the experiment's value and the figures it recorded
(:func:`inference_conformance.conformance.results.record`); a hit records them again, each marked
``cached: true`` with the time it was computed, so the report's row says ``cached``.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from inference_conformance.conformance import atomic, results

#: The environment variable naming the cache's folder, or "off" to turn it off.
CACHE_ENV = "INFERENCE_CONFORMANCE_CACHE"
DEFAULT_DIR = Path("~/.cache/inference-conformance/experiments")
FORMAT = 1


@dataclass(frozen=True)
class Outcome:
    """What :func:`experiment` gives back: the experiment's ``value`` (as JSON gives it back:
    tuples become lists, dict keys strings), whether it came from the cache (``cached``), its
    ``key`` and ``computed`` (ISO time the value was computed)."""

    value: Any
    cached: bool
    key: str
    computed: str


def folder() -> Path | None:
    """The cache's folder, or None when ``INFERENCE_CONFORMANCE_CACHE=off``."""
    env = os.environ.get(CACHE_ENV, "").strip()
    if env.lower() in ("off", "0", "no", "false"):
        return None
    return Path(env or DEFAULT_DIR).expanduser()


@lru_cache(maxsize=1)
def suite_digest() -> str:
    """SHA-256 over the suite's source (every subpackage's ``.py`` files, by relative path) and
    the small world's checkpoints (every file under ``smallworld/checkpoints``)."""
    import inference_conformance as pkg

    h = hashlib.sha256()
    for base in map(Path, pkg.__path__):
        for sub in pkg.SUBPACKAGES:
            root = base / sub
            if not root.is_dir():
                continue
            files = sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                           and (p.suffix == ".py" or "checkpoints" in p.relative_to(root).parts))
            for p in files:
                h.update(str(p.relative_to(base)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def versions() -> dict:
    """Python, torch and Triton versions (Triton: None when it is not installed)."""
    import torch

    try:
        import triton
        tv = triton.__version__
    except ImportError:
        tv = None
    return {"python": platform.python_version(), "torch": torch.__version__, "triton": tv}


def machine() -> dict:
    """The machine a wall-clock experiment ran on: CPU model and count, architecture, and the
    GPU's name when torch sees one."""
    import torch

    model = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": model, "cpus": os.cpu_count(), "arch": platform.machine(), "gpu": gpu}


def key(name: str, *, seed: Any, size: Any, params: dict | None = None) -> str:
    """The entry key (hex SHA-256) of experiment ``name`` at ``seed``, ``size`` and ``params``
    (JSON-able). Raises TypeError when ``name`` is not a str or ``params`` not a dict or None,
    ValueError when one of them is not JSON-able."""
    return _key(_inputs(name, seed, size, params))


def _inputs(name, seed, size, params) -> dict:
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    if params is not None and not isinstance(params, dict):
        raise TypeError(f"params must be a dict or None, got {type(params).__name__}")
    inputs = {"name": name, "seed": seed, "size": size, "params": params or {}, "suite": suite_digest(),
              "versions": versions()}
    try:
        json.dumps(inputs, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"seed, size and params of {name!r} must be JSON-able: {exc}") from None
    return inputs


def _key(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def _plain(o):
    if hasattr(o, "item") and callable(o.item):      # numpy / torch scalars
        return o.item()
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    raise TypeError(f"{type(o).__name__} is not JSON-able")


def _load(path: Path, k: str) -> dict | None:
    """The entry at ``path`` for key ``k``; None when absent; warns and gives None when damaged."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        warnings.warn(f"experiment cache: {path} unreadable ({exc}); recomputing", stacklevel=3)
        return None
    try:
        entry = json.loads(text)
        if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("key") != k:
            raise ValueError("not an entry of this key and format")
        if "value" not in entry or not isinstance(entry.get("figures"), list):
            raise ValueError("value or figures missing")
    except ValueError as exc:
        warnings.warn(f"experiment cache: {path} is damaged ({exc}); recomputing", stacklevel=3)
        return None
    return entry


def experiment(name: str, compute: Callable[[], Any], *, seed: Any, size: Any,
               params: dict | None = None) -> Outcome:
    """Run ``compute()`` (no arguments; returns a JSON-able value) for experiment ``name`` at
    ``seed``, ``size`` and ``params``, or replay its stored result.

    On a miss, the figures ``compute`` records are kept with its value in a new entry; on a hit,
    ``compute`` is not called and the stored figures are recorded again with ``cached=True`` and
    ``cached_at`` (the ISO time of the computation), ``what`` ending in "(cached)". Either way the
    value is returned as JSON gives it back, so a hit and a miss behave alike. Raises like
    :func:`key`; exceptions of ``compute`` propagate (nothing is stored)."""
    inputs = _inputs(name, seed, size, params)
    k = _key(inputs)
    where = folder()
    path = where / f"{k}.json" if where is not None else None
    entry = _load(path, k) if path is not None else None
    rec = results.recorder()
    if entry is not None:
        for fig in entry["figures"]:
            fig = dict(fig, extra=dict(fig.get("extra") or {}, cached=True, cached_at=entry["computed"]))
            what = fig["extra"].get("what")
            fig["extra"]["what"] = f"{what} (cached)" if what else "(cached)"
            rec.figures.append(fig)
        return Outcome(entry["value"], True, k, entry["computed"])
    start = len(rec.figures)
    t0 = time.time()
    value = compute()
    figures = rec.figures[start:]
    computed = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    entry = {"format": FORMAT, "key": k, "inputs": inputs, "computed": computed,
             "seconds": round(time.time() - t0, 3), "value": value, "figures": figures}
    try:
        text = json.dumps(entry, default=_plain, allow_nan=True)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"experiment {name!r}: its value and figures must be JSON-able: {exc}") from None
    if path is not None:
        try:
            atomic.write_text(path, text)
        except OSError as exc:
            print(f"experiment cache: not stored ({exc})", file=sys.stderr)
    return Outcome(json.loads(text)["value"], False, k, computed)
