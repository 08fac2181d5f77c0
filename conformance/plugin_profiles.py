"""The suite's Hypothesis profiles, applied to the suite's own tests only.

Registered under names of the suite's own (``inference_conformance.ci``, ``.dev``, ``.compat``,
``.thorough``) and never loaded globally: the plugin makes the chosen one Hypothesis's default
only while it collects a module of the suite (so ``@given`` and ``@settings`` there take it as
their parent) and while it runs one of the suite's tests
(:func:`hypothesis._settings.local_settings`). A project's own tests keep the profile the
project loads, its example database and its defaults.

The profile: ``--hypothesis-profile NAME`` or ``HYPOTHESIS_PROFILE=NAME`` (a short name ``ci``,
``dev``, ``compat``, ``thorough`` means the suite's), else ``inference_conformance.ci`` when
``CI`` is true, else ``inference_conformance.dev``. Their example database lies under
:func:`storage_dir`, never in the project.
"""
from __future__ import annotations

import contextlib
import os

PREFIX = "inference_conformance."
#: Where the suite keeps what Hypothesis and pytest-benchmark store between runs (environment
#: variable INFERENCE_CONFORMANCE_DIR, default ~/.cache/inference-conformance), never in the
#: project that runs it.
STORAGE_ENV = "INFERENCE_CONFORMANCE_DIR"
_SUPPRESS = ("too_slow", "data_too_large", "filter_too_much", "function_scoped_fixture")
#: The suite's profiles by short name: ``ci`` (chosen when CI=true), ``compat`` (the oldest
#: stack's run in CI: every law's pinned boundary cases, drawn examples only for a law without
#: any, 3 of them; ``conformance/laws.py``), ``dev`` (the
#: default), ``thorough`` (nightly).
PROFILES = {
    "ci": dict(max_examples=10, derandomize=True),
    "dev": dict(max_examples=30),
    "compat": dict(max_examples=3, derandomize=True),
    "thorough": dict(max_examples=500),
}


def storage_dir() -> str:
    """The suite-owned folder for its Hypothesis example database and benchmark storage (an
    absolute path; not created here)."""
    base = os.environ.get(STORAGE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "inference-conformance")
    return os.path.abspath(base)


def register() -> None:
    """Register the suite's profiles under :data:`PREFIX` names (idempotent; loads none).
    Hypothesis is imported here, not with the plugin: a run that never reaches the suite's code
    does not pay for it."""
    from hypothesis import HealthCheck, settings
    from hypothesis.database import DirectoryBasedExampleDatabase
    from hypothesis.errors import InvalidArgument

    try:
        settings.get_profile(PREFIX + "dev")
        return
    except InvalidArgument:
        pass
    suppress = [getattr(HealthCheck, name) for name in _SUPPRESS]
    database = DirectoryBasedExampleDatabase(os.path.join(storage_dir(), "hypothesis", "examples"))
    for short, values in PROFILES.items():
        stored = {} if values.get("derandomize") else {"database": database}   # derandomized: none
        settings.register_profile(PREFIX + short, deadline=None, suppress_health_check=suppress,
                                  print_blob=True, **stored, **values)


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes")


def profile_name(config) -> str:
    """The name of the profile the suite's tests run under in the run ``config``."""
    chosen = config.getoption("hypothesis_profile", default=None) or os.environ.get("HYPOTHESIS_PROFILE")
    if chosen:
        return PREFIX + chosen if chosen in PROFILES else chosen
    return PREFIX + ("ci" if _truthy(os.environ.get("CI")) else "dev")


def alias_requested(config) -> None:
    """``--hypothesis-profile inference_conformance.ci``: the suite's profiles are registered now.
    ``--hypothesis-profile ci`` (a short name of the suite's) where no such profile is
    registered: register that name as the suite's profile, so that Hypothesis's own plugin,
    which loads it for the whole run, finds it (a name the project registered is left alone)."""
    chosen = config.getoption("hypothesis_profile", default=None)
    if chosen and chosen.startswith(PREFIX):
        register()           # Hypothesis's plugin loads it next: it must exist by then
    if chosen in PROFILES:
        from hypothesis import settings

        register()
        try:
            settings.get_profile(chosen)
        except Exception:  # noqa: BLE001 - hypothesis.errors.InvalidArgument: not registered
            settings.register_profile(chosen, settings.get_profile(PREFIX + chosen))


def applied(name: str):
    """A context in which ``name`` is Hypothesis's default settings (a null context where
    Hypothesis offers no way to do that locally). Raises hypothesis' InvalidArgument for an
    unregistered ``name``."""
    from hypothesis import settings

    try:  # Hypothesis keeps it here (a stable private helper since 2017)
        from hypothesis._settings import local_settings
    except ImportError:  # pragma: no cover - a Hypothesis without it: the profile applies nowhere
        return contextlib.nullcontext()
    register()
    return local_settings(settings.get_profile(name))
