"""The benchmark machinery, one job per module: how a benchmark process runs
(:mod:`inference_conformance.perf.settings`), what settings a run was measured with, recorded into every benchmark
JSON (the pytest plugin :mod:`inference_conformance.perf.settings_record`) and compared between runs
(:mod:`inference_conformance.perf.settings_compare`), its results read from pytest-benchmark JSON
(:mod:`inference_conformance.perf.records`), where a run was measured (:mod:`inference_conformance.perf.env`), the device's measured
ceilings (:mod:`inference_conformance.perf.ceilings`), the stored history (:mod:`inference_conformance.perf.history`), the statistics and
decision rule (:mod:`inference_conformance.perf.stats`), and the tools built on them: the regression gate
(``python -m inference_conformance.perf.gate``; its rule :mod:`inference_conformance.perf.gate_rule`, its inputs
:mod:`inference_conformance.perf.gate_inputs`), interleaved A/B runs (``python -m inference_conformance.perf.ab``, with the pytest plugin
:mod:`inference_conformance.perf.lockstep`) and the gate's calibration (``python -m inference_conformance.perf.calibrate``,
:mod:`inference_conformance.perf.calibration_analysis`, the pytest plugin :mod:`inference_conformance.perf.inject`; data in
``perf/calibration/``). The report (``reports/``) reads their results; it imports the library
modules, never a command.
"""
