"""The environment fingerprint every report and history entry carries, and the key that names a
benchmark history series: the device model and its core (or GPU) count, and the pinned benchmark
settings (:mod:`inference_conformance.perf.settings`), so that runs of one series are comparable with each other."""
from __future__ import annotations

import hashlib
import json
import re

# the fingerprint itself lives in conformance/ (the plugin writes it into every run folder)
from inference_conformance.conformance.environment import ROOT, cpu_model, fingerprint  # noqa: F401 - re-exported


def slug(text: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    s = re.sub(r"\(r\)|\(tm\)|\bcpu\b|@.*$", "", text.lower())
    s = re.sub(r"[^a-z0-9]+", "-", s).strip("-")
    return s or "unknown"


def device_model(fp: dict) -> str:
    """The device model a run's numbers belong to: the GPU for CUDA runs, else the CPU."""
    if fp.get("device") == "cuda" and fp.get("gpu"):
        return fp["gpu"]
    return fp.get("cpu") or "unknown"


def _count(fp: dict) -> int | None:
    """The device's core count (CPU) or GPU count (CUDA) as recorded, None when not recorded."""
    n = fp.get("gpu_count") if fp.get("device") == "cuda" and fp.get("gpu") else fp.get("cpu_count")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def device_slug(fp: dict) -> str:
    """The device part of a series name: ``gpu-<model>[-<n>gpu]`` or ``cpu-<model>[-<n>cores]``
    (the count where the fingerprint records it)."""
    gpu = fp.get("device") == "cuda" and fp.get("gpu")
    n = _count(fp)
    tail = "" if n is None else (f"-{n}gpu" if gpu else f"-{n}cores")
    return f"{'gpu' if gpu else 'cpu'}-{slug(device_model(fp))}{tail}"


def device_label(fp: dict) -> str:
    """The device in words, for messages: 'cpu AMD EPYC (2 cores)', 'gpu NVIDIA H100 (1 GPU)'."""
    gpu = fp.get("device") == "cuda" and fp.get("gpu")
    n = _count(fp)
    what = "" if n is None else (f" ({n} GPU{'s' if n > 1 else ''})" if gpu else f" ({n} core{'s' if n > 1 else ''})")
    return f"{'gpu' if gpu else 'cpu'} {device_model(fp)}{what}"


def same_device(a: dict, b: dict) -> bool:
    """Whether two fingerprints name the same device: kind and model alike, and the count alike
    where both record it."""
    ka = ("gpu" if a.get("device") == "cuda" and a.get("gpu") else "cpu", slug(device_model(a)))
    kb = ("gpu" if b.get("device") == "cuda" and b.get("gpu") else "cpu", slug(device_model(b)))
    na, nb = _count(a), _count(b)
    return ka == kb and (na is None or nb is None or na == nb)


def settings_tag(settings: dict | None) -> str:
    """A short, stable tag of the pinned benchmark settings (timer and environment,
    :func:`inference_conformance.perf.settings.bench_settings` less its pytest arguments): 'pinned-<8 hex>'; '' when
    none were recorded."""
    core = {k: v for k, v in (settings or {}).items() if k != "pytest_args"}
    if not core:
        return ""
    return "pinned-" + hashlib.sha256(json.dumps(core, sort_keys=True).encode()).hexdigest()[:8]


def series_key(fp: dict, settings: dict | None = None) -> str:
    """History series name: :func:`device_slug` and, where the run recorded them, the tag of its
    pinned settings (:func:`settings_tag`), e.g. ``cpu-intel-xeon-processor-2cores-pinned-1a2b3c4d``.
    Runs of another machine model, core count or benchmark setting never share a series."""
    tag = settings_tag(settings)
    return device_slug(fp) + (f"-{tag}" if tag else "")
