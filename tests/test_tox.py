"""Every tox environment of ``tox.ini`` installs from a fresh clone.

tox itself resolves the configuration (``tox config``, no install, a few seconds): each
environment must hand pip at least one real requirement (the package, or a dependency that is
not only a ``-c`` constraint: an environment whose ``deps`` hold just a constraint, with the
package skipped, fails at once with "You must give at least one requirement to install"), and
every constraint or requirements file it names must exist. The check is also run on that broken
configuration, which it must reject.
"""
from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# tox comes with the [test] extra; the main job (python -m inference_conformance.reports) may run without it
pytest.importorskip("tox", reason="tox is not installed (pip install -e '.[test]'): the tox environments are not checked")

ROOT = Path(__file__).resolve().parent.parent

#: tox.ini as it was when `tox -e cpu` failed before any test (deps held only a constraint).
BROKEN_TOX_INI = """\
[tox]
envlist = cpu
skipsdist = true

[testenv]
usedevelop = true
setenv =
    CI = true

[testenv:cpu]
deps = -c requirements/cpu.txt
extras = test
commands = pytest -n 2 --device cpu {posargs}
"""


def env_names(tox_ini: Path) -> list[str]:
    cp = configparser.ConfigParser(interpolation=None)
    cp.read(tox_ini, encoding="utf-8")
    return [s.split(":", 1)[1] for s in cp.sections() if s.startswith("testenv:")]


def tox_config(tox_ini: Path, envs: list[str]) -> dict[str, dict[str, str]]:
    """{env: {key: value}} as tox resolves it (multi-line values joined by newlines)."""
    r = subprocess.run([sys.executable, "-m", "tox", "config", "-c", str(tox_ini), "-e", ",".join(envs),
                        "-k", "package", "deps", "set_env", "commands"],
                       capture_output=True, text=True, timeout=120, cwd=tox_ini.parent)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out: dict[str, dict[str, str]] = {}
    env = key = None
    for line in r.stdout.splitlines():
        if m := re.fullmatch(r"\[testenv:(.+)\]", line):
            env, key = m.group(1), None
            out[env] = {}
        elif env and (m := re.fullmatch(r"(\w+) = ?(.*)", line)):
            key = m.group(1)
            out[env][key] = m.group(2)
        elif env and key and line.startswith("  "):
            out[env][key] += "\n" + line.strip()
    return out


def install_problems(tox_ini: Path) -> list[str]:
    """What would stop an environment of ``tox_ini`` from installing (empty: nothing)."""
    envs = env_names(tox_ini)
    cfg = tox_config(tox_ini, envs)
    problems = []
    for env in envs:
        c = cfg.get(env)
        if c is None:
            problems.append(f"{env}: not in `tox config` output")
            continue
        deps = [d for d in c.get("deps", "").splitlines() if d.strip()]
        real_deps = [d for d in deps if not d.startswith(("-c", "--constraint"))]
        if c.get("package", "skip") == "skip" and not real_deps:
            problems.append(f"{env}: installs nothing (package skipped, deps {deps}): "
                            "pip stops with 'You must give at least one requirement'")
        files = [d.split(None, 1)[1] if " " in d else d[2:] for d in deps if d.startswith(("-c", "-r"))]
        files += re.findall(r"PIP_CONSTRAINT=(\S+)", c.get("set_env", ""))
        for f in files:
            if not (tox_ini.parent / f).is_file():
                problems.append(f"{env}: names {f}, which does not exist")
        if not c.get("commands", "").strip():
            problems.append(f"{env}: runs no command")
    return problems


def test_every_tox_environment_installs_something():
    assert install_problems(ROOT / "tox.ini") == []


def test_the_check_rejects_the_constraint_only_configuration(tmp_path):
    (tmp_path / "tox.ini").write_text(BROKEN_TOX_INI, encoding="utf-8")
    (tmp_path / "requirements").mkdir()
    shutil.copy(ROOT / "requirements" / "cpu.txt", tmp_path / "requirements" / "cpu.txt")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    problems = install_problems(tmp_path / "tox.ini")
    assert problems and "cpu: installs nothing" in problems[0], problems


def test_tox_has_an_environment_per_stack_with_its_constraints():
    cfg = tox_config(ROOT / "tox.ini", ["cpu", "oldest"])
    assert f"PIP_CONSTRAINT={ROOT / 'requirements' / 'cpu.txt'}" in cfg["cpu"]["set_env"]
    assert f"PIP_CONSTRAINT={ROOT / 'requirements' / 'oldest.txt'}" in cfg["oldest"]["set_env"]
    for env in ("cpu", "oldest"):
        assert "--device cpu" in cfg[env]["commands"], cfg[env]


def test_every_peer_environment_writes_its_run_folder():
    """A peer job's rows reach the merged matrix without retyping its selection with --results."""
    peers = [e for e in env_names(ROOT / "tox.ini") if e.startswith("peers-")]
    assert len(peers) >= 4, peers
    cfg = tox_config(ROOT / "tox.ini", peers)
    for env in peers:
        assert f"--results {ROOT / 'reports' / 'out' / 'tox' / env} " in cfg[env]["commands"], (env, cfg[env]["commands"])
