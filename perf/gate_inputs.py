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
    ci = doc.get("commit_info") if isinstance(doc.get("commit_info"), dict) else {}
    if ci.get("id"):
        fp["commit"], fp["dirty"] = ci["id"], bool(ci.get("dirty"))
    entry = history.make_entry(fp, records.records(doc))
    entry["settings"] = settings_compare.measured(doc, fp)
    return entry


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
