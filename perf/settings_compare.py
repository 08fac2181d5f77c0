"""How a benchmark run was measured, read from any input the gate and the A/B mode take, and
the comparison that refuses two runs measured differently.

Every input is read as one dict of **measured settings** (:func:`measured`)::

    {"timer": "process_time" | "perf_counter" | "cuda_event" | "do_bench" | ...,
     "threads": int | None,   # torch.get_num_threads() of the benchmark process; None: not known
     "pinned": bool,          # the pinned benchmark environment (inference_conformance.perf.settings) applied
     "device": {...}, "source": str}

from, in this order:

- the ``settings`` a benchmark JSON records (:mod:`inference_conformance.perf.settings_record`, pytest-benchmark's
  ``pytest_benchmark_update_json`` hook), kept as is in a history entry;
- the ``settings`` of a history entry written by ``python -m inference_conformance.reports`` before that
  (:func:`inference_conformance.perf.settings.bench_settings`: ``{"timer": "cpu"|"wall", "env": {...}}``): the
  pinned environment applied, ``threads`` its ``OMP_NUM_THREADS``;
- nothing (format-1 history entries, plain pytest-benchmark JSON): read as what such runs were,
  pytest-benchmark's default timer ``perf_counter`` (or the timer its benchmarks' ``options``
  name), torch's default thread count (the fingerprint's core count: 2 for the committed
  ``history/cpu-amd-epyc`` entries), unpinned.

:func:`differences` names every compared field that differs (timer, threads, pinned, device
model); torch/Triton/Python versions are reported (:func:`version_notes`), not refused: timing
a library upgrade is what the A/B mode's ``--python-a``/``--python-b`` is for.
"""
from __future__ import annotations

import json
from pathlib import Path

from inference_conformance.perf.settings import is_pinned

#: The fields two runs must share to be compared, in the order messages name them.
COMPARED = ("timer", "threads", "pinned", "device")
#: Library versions recorded with the device: a difference is shown, never refused.
VERSIONS = ("torch", "triton", "python")
#: pytest-benchmark's timer when none was chosen.
DEFAULT_TIMER = "perf_counter"
#: Timer names as recorded (``--benchmark-timer`` values, the pinned settings' names) -> one name.
_TIMER_NAMES = {"cpu": "process_time", "wall": "perf_counter", "time.process_time": "process_time",
                "time.perf_counter": "perf_counter", "process_time": "process_time",
                "perf_counter": "perf_counter"}


def timer_name(timer) -> str:
    """One name for a timer: ``"time.perf_counter"``, ``"wall"`` -> ``"perf_counter"``;
    ``"time.process_time"``, ``"cpu"`` -> ``"process_time"``; any other name (``"cuda_event"``,
    ``"do_bench"``, ``"module.fn"``) as given, without a ``time.`` prefix. Raises TypeError for a
    ``timer`` that is not a string."""
    if not isinstance(timer, str):
        raise TypeError(f"timer must be a string, got {type(timer).__name__}")
    t = timer.strip()
    return _TIMER_NAMES.get(t, t[len("time."):] if t.startswith("time.") else t)


def _threads_of(env: dict) -> int | None:
    try:
        n = int(str((env or {}).get("OMP_NUM_THREADS", "")))
    except ValueError:
        return None
    return n if n > 0 else None


def _count(fp: dict) -> int | None:
    """torch's default intra-op thread count as a fingerprint tells it: its core count."""
    n = fp.get("cpu_count")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def device_of(fp: dict | None) -> dict:
    """The device part of a fingerprint (kind, model, count) and the library versions."""
    fp = fp or {}
    gpu = fp.get("device") == "cuda" and fp.get("gpu")
    return {"kind": "cuda" if gpu else "cpu", "model": fp.get("gpu") if gpu else fp.get("cpu"),
            "count": fp.get("gpu_count") if gpu else fp.get("cpu_count"),
            **{k: fp.get(k) for k in VERSIONS}}


def _options_timer(doc: dict) -> str | None:
    """The timer pytest-benchmark wrote into its benchmarks' ``options`` (None when absent)."""
    for b in doc.get("benchmarks") or []:
        t = ((b or {}).get("options") or {}).get("timer") if isinstance(b, dict) else None
        if isinstance(t, str) and t:
            return timer_name(t)
    return None


def measured(doc: dict, fp: dict | None = None, applied: dict | None = None) -> dict:
    """The measured settings of a history entry or pytest-benchmark JSON ``doc`` (see the module
    docstring); ``fp``: its fingerprint when ``doc`` has none of its own; ``applied``: what the
    caller knows it applied to the process (the A/B mode's ``{"timer", "env"}``), used where the
    document records nothing (a pass of a revision older than the recording)."""
    fp = doc.get("fingerprint") if isinstance(doc.get("fingerprint"), dict) else (fp or {})
    s = doc.get("settings") if isinstance(doc.get("settings"), dict) else {}
    if "pinned" in s and "threads" in s:
        out = {"timer": timer_name(s.get("timer") or DEFAULT_TIMER), "threads": s.get("threads"),
               "pinned": bool(s["pinned"]), "device": s.get("device") or device_of(fp),
               "source": s.get("source") or "recorded"}
    elif s.get("timer") or applied:
        s = s if s.get("timer") else applied
        dev = device_of(fp)
        out = {"timer": timer_name(s["timer"]), "threads": _threads_of(s.get("env") or {}),
               "pinned": is_pinned(dev["kind"], s.get("env") or {}), "device": dev,
               "source": "settings of the report" if s is not applied else "applied by the caller"}
        if out["threads"] is None and dev["kind"] == "cpu":
            out["threads"] = _count(fp)
    else:
        out = {"timer": _options_timer(doc) or DEFAULT_TIMER, "threads": _count(fp),
               "pinned": False, "device": device_of(fp), "source": "not recorded (read as the defaults)"}
    return out


def _device_text(d: dict | None) -> str:
    d = d or {}
    n = d.get("count")
    return f"{d.get('kind') or '?'} {d.get('model') or 'unknown'}" + (f" x{n}" if n else "")


def _show(field: str, s: dict) -> str:
    v = s.get(field)
    if field == "device":
        return _device_text(v)
    if field == "threads" and v is None:
        return "not recorded"
    return str(v).lower() if isinstance(v, bool) else str(v)


def differences(base: dict, new: dict, labels: tuple[str, str] = ("base", "new")) -> list[str]:
    """One message per compared field (:data:`COMPARED`) in which two measured settings
    (:func:`measured`) differ, e.g. ``"timer differs: base perf_counter, new cuda_event"``; []
    when they may be compared. Threads are compared where both record them; the device by kind,
    model and count (a count only where both record it)."""
    out = []
    for f in COMPARED:
        b, n = base.get(f), new.get(f)
        if f == "threads" and (b is None or n is None):
            continue
        if f == "device":
            b, n = dict(b or {}), dict(n or {})
            if b.get("count") is None or n.get("count") is None:
                b["count"] = n["count"] = None
            same = all(b.get(k) == n.get(k) for k in ("kind", "model", "count"))
        else:
            same = b == n
        if not same:
            out.append(f"{f} differs: {labels[0]} {_show(f, base)}, {labels[1]} {_show(f, new)}")
    return out


def version_notes(base: dict, new: dict, labels: tuple[str, str] = ("base", "new")) -> list[str]:
    """The library versions (:data:`VERSIONS`) that differ between two measured settings."""
    bd, nd = base.get("device") or {}, new.get("device") or {}
    return [f"{k} {labels[0]} {bd.get(k)}, {labels[1]} {nd.get(k)}" for k in VERSIONS
            if bd.get(k) and nd.get(k) and bd.get(k) != nd.get(k)]


def unpinned(label: str, s: dict) -> str | None:
    """A warning when ``s`` was not measured with the pinned benchmark environment, else None."""
    if s.get("pinned"):
        return None
    return (f"{label} was not taken with the pinned benchmark settings (timer {_show('timer', s)}, threads "
            f"{_show('threads', s)}; {s.get('source', 'recorded')}): its times move with the machine's load and "
            f"allocator state; take runs with python -m inference_conformance.reports or inference_conformance.perf.ab")


def compare_sides(sides: dict[str, list[dict]]) -> list[str]:
    """The differences that forbid comparing the sides of an A/B session: ``sides`` maps a side's
    label ("A", "B") to the measured settings (:func:`measured`) of each of its passes, in order.
    One message per difference, each once: between the sides' first passes
    (``"timer differs: A process_time, B cuda_event"``) and between the passes of one side."""
    out = []
    labels = list(sides)
    for lab in labels:
        runs = sides[lab]
        for i, s in enumerate(runs[1:], 2):
            out += differences(runs[0], s, (f"{lab} pass 1", f"{lab} pass {i}"))
    for lab in labels[1:]:
        if sides[labels[0]] and sides[lab]:
            out += differences(sides[labels[0]][0], sides[lab][0], (labels[0], lab))
    return list(dict.fromkeys(out))


def recorded(path: Path) -> dict | None:
    """The ``settings`` a pass's benchmark JSON recorded (:mod:`inference_conformance.perf.settings_record`), None
    where it recorded none (a checkout older than the recording) or cannot be read."""
    try:
        s = json.loads(Path(path).read_text()).get("settings")
    except (OSError, ValueError, AttributeError):
        return None
    return s if isinstance(s, dict) else None


def check_passes(passes: list[dict], applied: dict, fp: dict) -> tuple[list[str], list[str]]:
    """(differences, warnings) of the settings of an A/B session's passes (:mod:`inference_conformance.perf.ab`:
    dicts with "side" and "settings", what :func:`recorded` read): each setting in which the passes were
    measured differently (:func:`compare_sides`; a pass that recorded
    none is read as ``applied``, the timer and environment this session gave it, on the device
    of ``fp``) and one warning per side not taken with the pinned settings."""
    sides: dict[str, list[dict]] = {}
    for p in passes:
        doc = {"settings": p["settings"]} if p.get("settings") else {}
        sides.setdefault(p["side"].upper(), []).append(measured(doc, fp, applied))
    sides = dict(sorted(sides.items()))
    warns = [w for lab, runs in sides.items() for w in [unpinned(f"side {lab}", runs[0])] if w]
    return compare_sides(sides), warns
