"""Root conftest. The suite's options, profiles, registry parametrization and result rows live
in the pytest plugin :mod:`inference_conformance.conformance.plugin`, which the installed package registers as a
``pytest11`` entry point, so they work the same from this checkout and from another project's CI.

Run from a checkout that is not installed (``PYTHONPATH=.``, as on a machine where nothing can be
installed), the entry point is absent and the plugin is loaded from here instead; an installed
entry point is imported before conftests, so it is never registered twice. Either way the plugin
tells the suite's tests by their paths (this checkout's folders), not by this file.

The marker ``installed`` (tests/test_installed_project.py builds and installs the wheel, about a
minute) lets a job leave that test out: ``-m "not installed"``.
"""
import sys

pytest_plugins = [] if "inference_conformance.conformance.plugin" in sys.modules else ["inference_conformance.conformance.plugin"]


def pytest_configure(config):
    config.addinivalue_line("markers", "installed: builds the wheel and runs the suite installed from it "
                                       "(about a minute); leave out with -m 'not installed'")
