"""Where a run was made: the environment fingerprint (CPU/GPU model, driver, library versions,
commit) that every report, history entry and run folder carries. ``inference_conformance.perf.env`` re-exports it and
names history series from it; the pytest plugin writes it into each ``--results`` folder
(:mod:`inference_conformance.conformance.runinfo`), so that runs made on other machines can be merged."""
from __future__ import annotations

import datetime as _dt
import importlib.metadata
import importlib.util
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux), else the platform's processor or machine name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown-cpu"


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _torch_versions() -> tuple[str | None, str | None]:
    """(``torch.__version__``, ``torch.version.cuda``), read from torch's generated ``version.py``
    where torch is not imported yet (importing it costs ~2 s, and a CPU report's parent process
    needs nothing else of it); imported where that file cannot be read."""
    if "torch" not in sys.modules:
        try:
            spec = importlib.util.find_spec("torch")
            text = (Path(spec.origin).parent / "version.py").read_text(encoding="utf-8")
            version = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M).group(1)
            cuda = re.search(r"^cuda\s*(?::[^=\n]*)?=\s*(None|['\"]([^'\"]*)['\"])", text, re.M)
            return version, (cuda.group(2) if cuda.group(1) != "None" else None)
        except (AttributeError, ImportError, OSError, TypeError, ValueError):
            pass
    import torch

    return torch.__version__, torch.version.cuda


def _triton_version() -> str | None:
    if "triton" in sys.modules:
        return getattr(sys.modules["triton"], "__version__", None)
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return None


def fingerprint(device: str | None = None) -> dict:
    """Where a run was measured: CPU/GPU model, driver, library versions, commit.

    ``device`` ("cpu"/"cuda"/None) selects which model names the series: the GPU's when the run
    used CUDA, else the CPU's. Never raises; unknown fields are None.
    """
    torch_version, torch_cuda = _torch_versions()
    fp = {"python": platform.python_version(), "platform": platform.platform(),
          "cpu": cpu_model(), "cpu_count": os.cpu_count(), "torch": torch_version,
          "triton": _triton_version(), "cuda": torch_cuda, "gpu": None, "gpu_count": 0,
          "driver": None, "device": device}
    if device != "cpu" and _cuda():
        import torch

        fp["gpu"] = torch.cuda.get_device_name(0)
        fp["gpu_count"] = torch.cuda.device_count()
        try:
            fp["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                          capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0] or None
        except (OSError, subprocess.SubprocessError, IndexError):
            pass
        if fp["device"] is None:
            fp["device"] = "cuda"
    elif fp["device"] is None:
        fp["device"] = "cpu"
    fp["commit"] = _git("rev-parse", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    fp["dirty"] = bool(dirty)
    fp["date"] = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return fp
