"""Files written whole or not at all: each write goes to a temporary name in the target's folder
and is renamed over the target (:func:`os.replace`), so a kill at any moment leaves the old file
or the new one under the final name, never a truncated one.

A temporary name is ``.<name>.<pid>.<random>.tmp`` (:func:`is_partial` recognises it); one left
by a killed writer is removed by :func:`sweep` once its process is gone.

Fault injection (tests and ``python -m inference_conformance.reports.faults``): with ``CONFORMANCE_KILL_AT=<point>`` in
the environment, the process kills itself with SIGKILL at that point: in :func:`write_bytes`,
the point is the target's file name (``results.json``, ``index.html``, ``roofline.png``, a history
entry's ``<date>-<commit>.json``, ``*.json`` for any JSON file; shell-style patterns match) and
the kill comes after half of the data is on disk under the temporary name; other points are
named where :func:`kill_point` is called. Without the variable nothing happens.
"""
from __future__ import annotations

import fnmatch
import os
import re
import signal
import tempfile
from pathlib import Path

KILL_ENV = "CONFORMANCE_KILL_AT"
_PARTIAL = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[A-Za-z0-9_]+\.tmp$")


def kill_point(point: str) -> None:
    """SIGKILL this process when ``CONFORMANCE_KILL_AT`` names ``point`` (a shell pattern)."""
    want = os.environ.get(KILL_ENV)
    if want and fnmatch.fnmatchcase(point, want):
        os.kill(os.getpid(), signal.SIGKILL)


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            half = len(data) // 2
            f.write(data[:half])
            if os.environ.get(KILL_ENV):
                f.flush()
                kill_point(path.name)
            f.write(data[half:])
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """:func:`write_bytes` for text."""
    return write_bytes(path, text.encode(encoding))


def is_partial(path: str | os.PathLike) -> bool:
    """Whether ``path`` is the temporary name of an unfinished :func:`write_bytes`."""
    return _PARTIAL.match(Path(path).name) is not None


def alive(pid: int) -> bool:
    """Whether process ``pid`` is running (a zombie, dead but not yet reaped, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def sweep(folder: str | os.PathLike) -> list[Path]:
    """Remove the temporary files in ``folder`` (not below it) whose writer is no longer
    running; returns them."""
    folder = Path(folder)
    gone = []
    if not folder.is_dir():
        return gone
    for p in folder.iterdir():
        m = _PARTIAL.match(p.name)
        if m and p.is_file() and not alive(int(m["pid"])):
            p.unlink(missing_ok=True)
            gone.append(p)
    return gone
