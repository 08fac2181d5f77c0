"""``--list-impls`` from a cache: building the registry's listing imports every implementation
module and the peers' packages (10-54 s); its answer depends only on the installed
distributions, the suite's files, the device and the peer sets, so it is kept under
:func:`inference_conformance.conformance.plugin_profiles.storage_dir` (``list-impls/``, set the
folder with INFERENCE_CONFORMANCE_DIR) keyed by a digest of all of these, and rebuilt when any
changes. Implementations registered by entry point are covered by the distributions' versions.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from importlib import metadata
from pathlib import Path

from inference_conformance.conformance import atomic
from inference_conformance.conformance.plugin_profiles import storage_dir
from inference_conformance.conformance.plugin_state import suite_roots

FORMAT = 1


def cache_key(device: str) -> str:
    """The digest (hex) of what the listing on ``device`` depends on: Python, the installed
    distributions and their versions, every suite file's path, size and mtime (ns), the device
    and ``INFERENCE_CONFORMANCE_PEERS``."""
    from inference_conformance.conformance.registry import PEERS_VARIABLE

    h = hashlib.sha256()
    h.update(f"{FORMAT}|{sys.version}|{sys.executable}|{device}|{os.environ.get(PEERS_VARIABLE, '')}".encode())
    dists = sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions())
    h.update("\n".join(dists).encode())
    for root in suite_roots():
        for path in sorted(root.rglob("*.py")):
            st = path.stat()
            h.update(f"{path}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()


def cache_file(device: str) -> Path:
    """Where the listing on ``device`` is kept for the current installation and files."""
    return Path(storage_dir(), "list-impls", f"{cache_key(device)}.json")


def listing(device: str) -> tuple[list[tuple[str, str, str, str]], bool]:
    """The registry's listing on ``device`` (``registry.listing``'s rows) and whether it came
    from the cache. A cache that cannot be written is not an error: the listing is returned."""
    path = cache_file(device)
    try:
        rows = [tuple(r) for r in json.loads(path.read_text())["rows"]]
        return rows, True
    except (OSError, ValueError, KeyError, TypeError):
        pass
    from inference_conformance.conformance.registry import listing as build

    rows = build(device)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(str(path), json.dumps({"format": FORMAT, "device": device, "rows": [list(r) for r in rows]}))
    except OSError:
        pass
    return rows, False
