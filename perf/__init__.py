"""The benchmark machinery, one job per module: how a benchmark process runs
(:mod:`perf.settings`), its results read from pytest-benchmark JSON (:mod:`perf.records`), where
a run was measured (:mod:`perf.env`), the device's measured ceilings (:mod:`perf.ceilings`), the
stored history (:mod:`perf.history`), the statistics and decision rule (:mod:`perf.stats`), and
the tools built on them: the regression gate (``python -m perf.gate``), interleaved A/B runs
(``python -m perf.ab``, with the pytest plugin :mod:`perf.lockstep`) and the gate's calibration
(``python -m perf.calibrate``, :mod:`perf.calibration_analysis`, the pytest plugin
:mod:`perf.inject`; data in ``perf/calibration/``). The report (``reports/``) reads their
results; it imports the library modules, never a command.
"""
