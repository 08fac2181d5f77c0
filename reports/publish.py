"""How ``python -m inference_conformance.reports`` writes its output folder so that nothing is lost or mixed.

- The folder is the suite's only when it carries the marker file ``.conformance-report``
  (written when the suite creates the folder, or adopts an empty one); an existing folder that
  is not empty and has no marker is refused (:class:`Refused`), and nothing is removed outside a
  marked folder.
- One run at a time per folder: ``.lock`` is held with ``fcntl.flock`` for the whole run
  (:class:`Lock`); a second run refuses at once, naming the folder and the holder's pid. The
  kernel releases the lock of a dead process; its pid, still in the file, is named in a note.
- Each run writes into its own folder ``runs/<id>/`` (rows, benchmarks, the rendered files) with
  a ``manifest.json``: id, kind (``run`` or ``render``), status (``running``, ``complete``,
  ``interrupted``), start and end, the pytest commands with their exit codes, the counts. Its
  children write under scratch names (``.rows.partial/``, ``.benchmarks.json.partial``) renamed
  when they exit normally. Publishing is one rename: the link ``current`` -> ``runs/<id>``;
  ``index.html``, ``report.md``, ``results.json``, ``benchmarks.json``, ``plots``, ``rows`` and
  ``manifest.json`` in the folder are fixed links into ``current/``, so they all change at once.
- The pytest children run in their own process group under a small group leader
  (``python -m inference_conformance.reports.publish lead``) that kills the whole group when the parent dies (Linux
  ``PR_SET_PDEATHSIG``, even on SIGKILL) or when it is sent SIGTERM / SIGINT / SIGHUP.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from inference_conformance.conformance import atomic

MARKER = ".conformance-report"
LOCK = ".lock"
RUNS = "runs"
CURRENT = "current"
MANIFEST = "manifest.json"
ROWS_PARTIAL = ".rows.partial"
#: What the folder shows, each a fixed link into ``current/``.
PUBLISHED = ("index.html", "report.md", "results.json", "benchmarks.json", "plots", "rows", MANIFEST)
#: What the suite itself put into its default folder before it was marked (adopted with a note).
LEGACY = frozenset(PUBLISHED) | {"browser-screenshot.png", "benchmarks-gpu.json", "gpu",
                                 "ci", "matrix"}  # the README test command's run folders, merge's default out
#: The one folder, under the current directory, that every output of the suite goes to by default
#: (the report, the matrix, expectation drafts, and from an installed suite the history and docs):
#: never inside the installed package, never a project's own ``reports/``.
OUT_NAME = "inference-conformance-out"
#: The suite's root: the checkout (``CLAIMS.md``, ``history/``, ``tests/`` beside the folders), or
#: the installed package folder ``site-packages/inference_conformance``.
ROOT = Path(__file__).resolve().parent.parent
#: Whether the suite runs from its checkout (on ``PYTHONPATH`` or installed editable), where its
#: ``tests/`` and ``history/`` are, rather than from a wheel.
CHECKOUT = (ROOT / "pyproject.toml").is_file() and (ROOT / "tests").is_dir()


def default_out(*parts: str) -> Path:
    """``./inference-conformance-out/<parts>`` under the current directory (:data:`OUT_NAME`)."""
    return Path.cwd().joinpath(OUT_NAME, *parts)


#: Run folders kept (the published one is always kept).
KEEP = 5
FORMAT = 1


class Refused(Exception):
    """The output folder cannot be used: the message says why (exit status 2)."""


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


alive = atomic.alive


# ---- the marker ----
def is_marked(folder: str | os.PathLike) -> bool:
    """Whether the suite created ``folder`` (it carries the marker file)."""
    return (Path(folder) / MARKER).is_file()


def mark(folder: str | os.PathLike) -> None:
    atomic.write_text(Path(folder) / MARKER, "made by python -m inference_conformance.reports: its contents are the suite's "
                                             f"and may be replaced (marked {now()})\n")


def prepare_out(out: Path, *, default: Path | None = None) -> list[str]:
    """Make ``out`` a marked output folder or raise :class:`Refused`; returns notes. A missing
    folder is created and marked, an empty one marked; the suite's ``default`` folder holding
    only files the suite writes there (an output of an earlier version) is adopted."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise Refused(f"--out {out} is a file, not a folder: nothing was written")
    if out.is_dir() and is_marked(out):
        return []
    notes = []
    if out.is_dir() and any(out.iterdir()):
        names = sorted(p.name for p in out.iterdir())
        legacy = all(n in LEGACY or n.startswith("benchmarks-pass") for n in names)
        if not (default is not None and out.resolve() == Path(default).resolve() and legacy):
            shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
            raise Refused(f"--out {out} is not a report folder: it is not empty ({shown}) and has no {MARKER} "
                          "marker; nothing was written or removed there: choose a new or empty folder")
        notes.append(f"adopted {out} (an earlier report's output: {', '.join(names)})")
    out.mkdir(parents=True, exist_ok=True)
    mark(out)
    return notes


def remove_tree(path: Path, marked_root: Path) -> None:
    """``shutil.rmtree(path)`` where ``path`` lies inside the marked folder ``marked_root``."""
    path, root = Path(path), Path(marked_root)
    if not is_marked(root) or root.resolve() not in path.resolve().parents:
        raise Refused(f"not removing {path}: it is not inside a folder the suite made ({root} has no {MARKER})")
    shutil.rmtree(path)


# ---- the lock ----
class Lock:
    """``fcntl.flock`` on ``<out>/.lock`` (the holder's pid written in it), taken without waiting."""

    def __init__(self, out: Path):
        self.path = Path(out) / LOCK
        self.fd: int | None = None
        self.note = ""

    def acquire(self) -> "Lock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 200, 0).decode(errors="replace").split()
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            pid = holder[0] if holder else "unknown"
            raise Refused(f"{self.path.parent} is in use by another python -m inference_conformance.reports (pid {pid}, "
                          f"started {' '.join(holder[1:2]) or 'at an unknown time'}); wait for it or choose another --out")
        old = os.pread(fd, 200, 0).decode(errors="replace").split()
        if old and old[0].isdigit() and int(old[0]) != os.getpid():
            self.note = (f"took over the lock of {self.path.parent} from pid {old[0]}, "
                         f"{'no longer running' if not alive(int(old[0])) else 'which no longer holds it'}")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {now()}\n".encode(), 0)
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            os.close(self.fd)  # closing releases the flock
            self.fd = None

    def __enter__(self) -> "Lock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


# ---- runs ----
def read_manifest(folder: Path) -> dict | None:
    try:
        m = json.loads((Path(folder) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and "id" in m else None


class Run:
    """One run's folder ``<out>/runs/<id>/`` and its manifest."""

    def __init__(self, out: Path, kind: str, argv: list[str], source: str | None = None):
        self.out = Path(out)
        rid = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ") + f"-{os.getpid()}"
        self.folder = self.out / RUNS / rid
        self.folder.mkdir(parents=True)
        mark(self.folder)
        self.manifest = {"format": FORMAT, "id": rid, "kind": kind, "status": "running", "pid": os.getpid(),
                         "started": now(), "ended": None, "stage": "start", "argv": list(argv),
                         "source_run": source, "commands": [], "counts": {}, "notes": []}
        self.save()

    @property
    def id(self) -> str:
        return self.manifest["id"]

    def save(self) -> None:
        atomic.write_text(self.folder / MANIFEST, json.dumps(self.manifest, indent=1) + "\n")

    def update(self, **fields) -> None:
        self.manifest.update(fields)
        self.save()

    def command(self, argv: list[str], rc: int | None, started: str) -> None:
        self.manifest["commands"].append({"argv": list(argv), "exit": rc, "started": started, "ended": now()})
        self.save()

    def finish(self, status: str, reason: str = "") -> None:
        self.update(status=status, ended=now(), **({"reason": reason} if reason else {}))


def runs(out: Path, *, holder: str | None = None, settle: bool = True) -> list[dict]:
    """The manifests of ``<out>/runs/*``, newest first, each with ``folder``. With ``settle``
    (the caller holds the lock; ``holder``: its own run id), a run still ``running`` that is not
    the caller's was cut short (killed): its manifest is rewritten ``interrupted``."""
    d = Path(out) / RUNS
    found = []
    for p in sorted(d.iterdir(), reverse=True) if d.is_dir() else []:
        if not p.is_dir():
            continue
        m = read_manifest(p) or {"format": FORMAT, "id": p.name, "kind": "run", "status": "running",
                                 "pid": None, "started": None, "stage": "before its manifest was written",
                                 "commands": [], "counts": {}}
        if settle and m.get("status") == "running" and m["id"] != holder:
            m.update(status="interrupted", reason=f"its process (pid {m.get('pid')}) ended during stage "
                                                  f"{m.get('stage')!r} without finishing (killed)",
                     noticed_by=holder, noticed=now())
            atomic.write_text(p / MANIFEST, json.dumps(m, indent=1) + "\n")
        found.append(dict(m, folder=p))
    return found


def published(out: Path) -> str | None:
    """The id of the published run (the target of ``current``), or None."""
    link = Path(out) / CURRENT
    return Path(os.readlink(link)).name if link.is_symlink() else None


def _link(target: str, at: Path) -> None:
    """Point the link ``at`` to ``target`` in one rename."""
    tmp = at.with_name(f".{at.name}.{os.getpid()}.link.tmp")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, at)


def publish(out: Path, run: Run) -> None:
    """Make ``run`` the one the folder shows: one rename of ``current``."""
    out = Path(out)
    atomic.kill_point("publish")
    _link(f"{RUNS}/{run.id}", out / CURRENT)
    for name in PUBLISHED:
        p = out / name
        if not os.path.lexists(run.folder / name):  # not made by this run (--no-bench: no benchmarks, no plots)
            if p.is_symlink():
                p.unlink()                          # never a link to nothing
            continue
        if p.is_symlink() and os.readlink(p) == f"{CURRENT}/{name}":
            continue
        if p.is_dir() and not p.is_symlink():
            remove_tree(p, out)  # an earlier version's output, in a marked folder
        _link(f"{CURRENT}/{name}", p)


def prune(out: Path, keep: int = KEEP) -> list[Path]:
    """Remove the oldest run folders beyond ``keep`` (never the published one); only marked
    folders holding a manifest are touched. Returns the removed folders."""
    out = Path(out)
    cur = published(out)
    gone = []
    for m in runs(out, settle=False)[keep:]:
        d = m["folder"]
        if m["id"] != cur and is_marked(d):
            remove_tree(d, out)
            gone.append(d)
    return gone


def is_scratch(name: str) -> bool:
    """Whether ``name`` is unpublished work in progress: a temporary file of
    :mod:`inference_conformance.conformance.atomic` or a child's ``.*.partial`` output (rows, benchmark JSON)."""
    return atomic.is_partial(name) or (name.startswith(".") and name.endswith(".partial"))


def sweep(out: Path) -> list[Path]:
    """Remove what killed writers left (call it under the lock, after :func:`runs` settled the
    interrupted runs): temporary files whose writer is gone, and the children's scratch output
    of interrupted runs (their manifests stay). Returns the removed paths."""
    out = Path(out)
    gone = atomic.sweep(out) + atomic.sweep(out / RUNS)
    for m in runs(out, settle=False):
        d = m["folder"]
        gone += atomic.sweep(d) + atomic.sweep(d / "plots")
        if m["status"] != "interrupted":
            continue
        for p in d.iterdir():
            if is_scratch(p.name):
                remove_tree(p, out) if p.is_dir() else p.unlink()
                gone.append(p)
    return gone


# ---- children in their own process group, dying with the parent ----
PR_SET_PDEATHSIG = 1


def _death_signal(sig: int) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux only)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


def _child_setup() -> None:  # preexec_fn: runs in the child between fork and exec
    _death_signal(signal.SIGTERM)


def spawn(cmd: list[str], **popen) -> subprocess.Popen:
    """Start ``cmd`` under the group leader, in a new process group."""
    lead = [sys.executable, "-m", "inference_conformance.reports.publish", "lead", str(os.getpid()), "--", *cmd]
    return subprocess.Popen(lead, process_group=0, preexec_fn=_child_setup, **popen)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL every process of ``proc``'s group and reap ``proc``."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def group_members(pgid: int) -> list[int]:
    """The live pids of process group ``pgid`` (Linux /proc)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            pids.append(int(stat.parent.name))
    return pids


def lead(parent: int, cmd: list[str]) -> int:
    """The group leader: run ``cmd`` in this process group; when the parent dies (the kernel
    sends SIGTERM, set before exec) or a signal arrives, SIGKILL the whole group."""

    def die(*_):
        os.killpg(0, signal.SIGKILL)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, die)
    _death_signal(signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the death signal was set
        die()
    rc = subprocess.call(cmd)
    return 128 - rc if rc < 0 else rc  # killed by a signal: the shell's 128 + N


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[1] != "lead" or sys.argv[3] != "--":
        sys.exit("usage: python -m inference_conformance.reports.publish lead PARENT_PID -- COMMAND...")
    sys.exit(lead(int(sys.argv[2]), sys.argv[4:]))
