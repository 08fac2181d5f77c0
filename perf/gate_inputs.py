"""The gate's inputs: the run and the history entries it is judged against, read strictly (a
damaged file is an :class:`InputError` naming the file, the entry and the field), and checked
to be comparable: measured on the same device (:func:`check_device`) and with the same settings
(:func:`check_settings`: timer, threads, pinned environment; an unpinned input is warned about).
"""
from __future__ import annotations

import sys
from pathlib import Path

from inference_conformance.perf import env, history, records, settings_compare


class InputError(Exception):
    """An input the gate cannot judge (exit 2): one line saying what and where."""


def load_run(path: str | Path) -> dict:
    """A history entry from a history entry or a pytest-benchmark JSON file, validated
    (:func:`inference_conformance.perf.history.load`): raises :class:`inference_conformance.perf.history.EntryError` naming the file, the
    entry and the field of anything unusable."""
    doc = history.validate(history.read_json(path), path)
    if "fingerprint" in doc and "series" in doc:
        return doc
    fp = env.fingerprint(None)
    recorded = doc.get("settings") if isinstance(doc.get("settings"), dict) else {}
    dev = recorded.get("device") if isinstance(recorded.get("device"), dict) else {}
    if dev.get("model"):  # the device the benchmarks ran on, as they recorded it
        gpu = dev.get("kind") == "cuda"
        fp.update({"device": "cuda" if gpu else "cpu", "gpu" if gpu else "cpu": dev["model"],
                   "gpu_count" if gpu else "cpu_count": dev.get("count"),
                   **{k: dev[k] for k in settings_compare.VERSIONS if dev.get(k)}})
    mi = doc.get("machine_info") if isinstance(doc.get("machine_info"), dict) else {}
    cpu = mi.get("cpu") if isinstance(mi.get("cpu"), dict) else {}
    if cpu.get("brand_raw") and fp.get("device") == "cpu" and not dev.get("model"):
        fp["cpu"] = cpu["brand_raw"]
        if isinstance(cpu.get("count"), int):
            fp["cpu_count"] = cpu["count"]
    # when the benchmarks ran (pytest-benchmark's datetime), not when the gate reads them
    fp["date"] = doc["datetime"] if isinstance(doc.get("datetime"), str) else None
    ci = doc.get("commit_info") if isinstance(doc.get("commit_info"), dict) else {}
    if ci.get("id"):
        fp["commit"], fp["dirty"] = ci["id"], bool(ci.get("dirty"))
    entry = history.make_entry(fp, records.records(doc))
    entry["settings"] = settings_compare.measured(doc, fp)
    if isinstance(doc.get("passes"), int):  # a run of several benchmark processes (--bench-passes)
        entry["settings"]["passes"] = doc["passes"]
    entry["series"] = series_of(doc, fp)
    return entry


#: The recorded timer names (:mod:`inference_conformance.perf.settings_record`) -> the pinned settings' names.
_PINNED_TIMERS = {"process_time": "cpu", "perf_counter": "wall"}


def series_of(doc: dict, fp: dict) -> str:
    """The history series a pytest-benchmark JSON ``doc`` (measured on ``fp``) belongs to: the key
    ``inference-conformance run`` gives the entry it stores for it (device, count and the pinned
    settings with the number of passes, :func:`inference_conformance.perf.env.series_key`) when
    the file records pinned settings, else the device's bare key."""
    rec = doc.get("settings") if isinstance(doc.get("settings"), dict) else {}
    timer = _PINNED_TIMERS.get(rec.get("timer"))
    if not (timer and rec.get("pinned")):
        return env.series_key(fp)
    passes = doc.get("passes") if isinstance(doc.get("passes"), int) else 1
    return env.series_key(fp, {"timer": timer, "env": dict(rec.get("env") or {}), "passes": passes})


def same_run(a: dict, b: dict, recorded: bool = False) -> bool:
    """Whether two inputs hold the same run: the same benchmarks with the same medians and raw
    samples (as a history entry keeps them, to 6 significant digits). An entry
    ``inference-conformance run`` stored and the ``benchmarks.json`` of that run are the same run;
    two runs, even of one commit, never have every sample alike. ``recorded``: ``a`` is a history
    entry too, so its fingerprint is its run's own: the date and commit must match as well."""
    def content(doc: dict) -> dict:
        return {r["fullname"]: (float(f"{(r.get('stats') or {}).get('median') or 0:.6g}"),
                                tuple(float(f"{x:.6g}") for x in (r.get("data") or [])))
                for r in records.records(doc) if r.get("fullname")}

    if recorded:
        fa, fb = a.get("fingerprint") or {}, b.get("fingerprint") or {}
        if (fa.get("date"), fa.get("commit")) != (fb.get("date"), fb.get("commit")):
            return False
    ka = content(a)
    return bool(ka) and ka == content(b)


def stored_entry(run_path: Path) -> Path | None:
    """The history entry ``inference-conformance run`` stored for the run whose output file is
    ``run_path`` (its run folder's ``manifest.json`` names it), None when there is none."""
    try:
        manifest = history.read_json(Path(run_path).resolve().parent / "manifest.json")
    except history.EntryError:
        return None
    entry = manifest.get("history_entry")
    return Path(entry) if isinstance(entry, str) and entry else None


def without_the_run(run: dict, run_path: Path, entries: list[tuple[Path, dict]],
                    recorded: bool = False) -> tuple[list, Path | None]:
    """``entries`` (oldest first) up to, not including, the run itself (:func:`same_run`, or the
    entry its run folder's manifest names, :func:`stored_entry`), and that entry's path (None when
    the run is not among them): a run is never its own baseline, nor judged against what came
    after it. ``recorded``: the run is a history entry itself (see :func:`same_run`)."""
    stored = stored_entry(run_path)
    for i, (q, doc) in enumerate(entries):
        if (stored is not None and q.resolve() == stored.resolve()) or same_run(run, doc, recorded):
            return entries[:i], q
    return entries, None


def is_entry(doc: dict) -> bool:
    """Whether ``doc`` is a history entry (rather than a pytest-benchmark JSON)."""
    return "fingerprint" in doc and "series" in doc


def earlier_files(folder: Path, run_path: Path, up_to: Path | None = None) -> list[Path]:
    """The ``*.json`` files of ``folder`` that come before the run (oldest first): the run itself
    excluded and, when the run lies in ``folder``, only the files named before it; with
    ``up_to``, only those up to that file."""
    rp = run_path.resolve()
    out = []
    for q in sorted(Path(folder).glob("*.json")):
        qr = q.resolve()
        if qr == rp or (rp.parent == qr.parent and q.name > rp.name) or (up_to is not None and q.name > up_to.name):
            continue
        out.append(q)
    return out


def load_entries(paths: list[Path], errors: list) -> list[tuple[Path, dict]]:
    """The usable history entries among ``paths``; every unusable file's
    :class:`inference_conformance.perf.history.EntryError` goes to ``errors`` (never skipped without a word)."""
    out = []
    for q in paths:
        try:
            doc = history.load(q)
        except history.EntryError as e:
            errors.append(e)
            continue
        if not is_entry(doc):
            errors.append(history.EntryError(q, "not a history entry (no 'fingerprint' and 'series')",
                                             field="fingerprint"))
            continue
        out.append((q, doc))
    return out


def check_device(run: dict, run_path: Path, doc: dict, path: Path, what: str) -> None:
    """:class:`InputError` when ``doc`` (at ``path``: ``what``, e.g. "the baseline") was measured
    on another device than ``run`` (at ``run_path``)."""
    rf, bf = run.get("fingerprint") or {}, doc.get("fingerprint") or {}
    if not env.same_device(rf, bf):
        raise InputError(f"{path}: field 'fingerprint': {what} was measured on {env.device_label(bf)}, the run "
                         f"{run_path} on {env.device_label(rf)}: times of two devices are not comparable "
                         f"(its series: history/{run['series']}/)")


def check_settings(run: dict, run_path: Path, doc: dict, path: Path, what: str) -> None:
    """:class:`InputError` naming each setting (timer, threads, pinned environment, device,
    :func:`inference_conformance.perf.settings_compare.differences`) in which ``doc`` (at ``path``: ``what``)
    and ``run`` (at ``run_path``) were measured differently: their times are not comparable."""
    diffs = settings_compare.differences(settings_compare.measured(doc), settings_compare.measured(run))
    if diffs:
        raise InputError(f"{path}: field 'settings': {what} (base) and the run {run_path} (new) were measured "
                         f"differently: {'; '.join(diffs)}: their times are not comparable (take the run with "
                         f"the base's settings, or start a new series with the run's)")


def warn_unpinned(inputs: list[tuple[str, dict]], prog: str = "gate") -> None:
    """One warning on stderr for each input (label, document) not taken with the pinned
    benchmark settings; the exit status is not affected."""
    for label, doc in inputs:
        why = settings_compare.unpinned(label, settings_compare.measured(doc))
        if why:
            print(f"{prog}: warning: {why}", file=sys.stderr)
