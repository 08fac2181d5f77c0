"""A pytest plugin that records in every benchmark JSON how its benchmarks were measured.

pytest-benchmark's ``pytest_benchmark_update_json`` hook adds a top-level ``settings`` object to
the ``--benchmark-json`` file::

    {"timer": "process_time",  # pytest-benchmark's --benchmark-timer, without "time."
     "threads": 1,             # torch.get_num_threads() of the benchmark process
     "pinned": true,           # inference_conformance.perf.settings.is_pinned: the pinned environment applied
     "env": {"OMP_NUM_THREADS": "1", ...},   # the pinned variables as the process found them
     "device": {"kind": "cpu", "model": "AMD EPYC", "count": 2, "torch": "2.13.0", "triton": "3.9.0",
                "python": "3.11.7"}}

which the gate and the A/B mode read (:func:`inference_conformance.perf.settings_compare.measured`) to refuse
comparing runs measured differently. It changes nothing else: no option, no environment, no
test. ``benchmarks/conftest.py`` registers it for the suite's benchmarks; elsewhere load it with
``-p inference_conformance.perf.settings_record``. Without pytest-benchmark its hook is never called.
"""
from __future__ import annotations

import os

import pytest

from inference_conformance.perf.settings import MALLOC_PINS, is_pinned
from inference_conformance.perf.settings_compare import DEFAULT_TIMER, device_of, timer_name

#: The name this plugin is registered under (``pluginmanager.has_plugin``).
NAME = "inference_conformance.perf.settings_record"


def _device(config) -> str:
    """The device the benchmarks ran on: the suite's ``--device`` where given, else CUDA when
    torch sees a GPU."""
    chosen = config.getoption("device", None) if config is not None else None
    if chosen in ("cpu", "cuda"):
        return chosen
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def settings_now(config=None, environ=None) -> dict:
    """The settings of this process (see the module docstring); ``config``: the pytest config
    (its ``--benchmark-timer`` and ``--device``), ``environ``: the environment (default
    ``os.environ``)."""
    import torch

    from inference_conformance.conformance.environment import fingerprint

    environ = os.environ if environ is None else environ
    device = _device(config)
    timer = config.getoption("benchmark_timer", None) if config is not None else None
    pins = [*MALLOC_PINS, "OMP_NUM_THREADS"]
    return {"timer": timer_name(str(timer)) if timer is not None else DEFAULT_TIMER,
            "threads": torch.get_num_threads(), "pinned": is_pinned(device, environ),
            "env": {k: environ[k] for k in pins if k in environ}, "device": device_of(fingerprint(device))}


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_json(config, benchmarks, output_json):
    output_json["settings"] = settings_now(config)
