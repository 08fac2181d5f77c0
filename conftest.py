"""Root conftest. The suite's options, profiles, registry parametrization and result rows live
in the pytest plugin :mod:`conformance.plugin`, which the installed package registers as a
``pytest11`` entry point, so they work the same from this checkout and from another project's CI.
"""
