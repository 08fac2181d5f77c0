"""The suite's benchmarks record how they were measured: every ``--benchmark-json`` file gets a
``settings`` object (timer, threads, pinned or not, device and library versions) from the plugin
:mod:`inference_conformance.perf.settings_record`, registered here once (the suite's pytest plugin may have
registered it already), so that the gate and the A/B mode can refuse runs measured differently."""
from inference_conformance.perf.settings_record import NAME


def pytest_configure(config):
    if not config.pluginmanager.has_plugin(NAME):
        config.pluginmanager.import_plugin(NAME)
