"""The suite from its wheel, in a kernel project (tests/plugin_project.py: its own ``tests/``,
``benchmarks/``, ``reports/``, ``expectations/`` packages and Hypothesis ``ci`` profile): the wheel
is built once (``pip wheel --no-deps``) from this checkout's files and installed with ``pip
install --no-deps --target`` (torch and the rest come from this environment), and then

- the wheel installs one import name, ``inference_conformance``, and the plugin's entry point;
- the project's own tests behave identically with the suite and without it;
- ``pytest --pyargs inference_conformance.benchmarks --benchmark-disable --co`` from the project
  collects the suite's benchmarks (the plugin collects ``bench_*.py``, whatever the project's
  ``python_files``), beside the project's own ``benchmarks`` package;
- a law runs against an outside implementation given with ``--impl``;
- day one: the commands the README and the guide give a new user (``list``, pytest ``--impl``
  on a kernel with three known bugs beside a test of the project's, ``expect update``,
  ``merge``; the gate's history mode on two runs, never comparing a run with itself) exit as
  documented and change nothing of the project.

About two minutes; marked ``installed``, so a job can leave it out with ``-m "not installed"``.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.plugin_project import check_inert, make_project

pytestmark = pytest.mark.installed

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
_SKIP = {".git", ".venv", "build", "dist", "__pycache__", ".hypothesis", ".benchmarks", ".tox"}


def _sources(dest: Path) -> Path:
    """This checkout's files (tracked and new ones git does not ignore; without git, all but
    build output) copied into ``dest``, so that building leaves nothing in the checkout."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, text=True)
    if listed.returncode == 0 and listed.stdout:
        for name in filter(None, listed.stdout.split("\0")):
            src = ROOT / name
            if src.is_symlink() and src.is_dir():      # inference_conformance/<folder> -> ../<folder>
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                os.symlink(os.readlink(src), dest / name)
            elif src.is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / name)
    else:
        shutil.copytree(ROOT, dest, ignore=lambda d, names: [n for n in names if n in _SKIP or n.endswith(".egg-info")])
    return dest


def _pip(*args: str, cwd: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert r.returncode == 0, f"pip {' '.join(args)}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The folder the wheel is installed into (put it first on PYTHONPATH to use it)."""
    work = tmp_path_factory.mktemp("wheel")
    src = _sources(work / "src")
    _pip("wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(work / "dist"), str(src), cwd=work)
    wheels = sorted((work / "dist").glob("inference_conformance-*.whl"))
    assert len(wheels) == 1, wheels
    _pip("install", "--no-deps", "-q", "--target", str(work / "site"), str(wheels[0]), cwd=work)
    return work / "site"


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return make_project(tmp_path_factory.mktemp("installed") / "kernel_project")


def _pytest(project: Path, site: Path, *args: str, extra: Path = EXAMPLES) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_", "HYPOTHESIS_"))}
    env.update(CI="true", PYTHONPATH=os.pathsep.join([str(site), str(project), str(extra)]))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args], cwd=project,
                          env=env, capture_output=True, text=True, timeout=300)


def test_the_wheel_installs_one_import_name_and_the_plugin(site, project):
    assert sorted(p.name for p in site.iterdir() if p.name not in ("bin",)) == [
        "inference_conformance", next(p.name for p in site.glob("inference_conformance-*.dist-info"))]
    assert not (site / "conftest.py").exists() and (site / "inference_conformance" / "benchmarks").is_dir()
    env = dict(os.environ, PYTHONPATH=str(site))
    where = subprocess.run([sys.executable, "-c", "import inference_conformance as m, importlib.metadata as md; "
                            "print(m.__file__); print([e.value for e in md.entry_points(group='pytest11') "
                            "if e.name == 'inference_conformance'])"],
                           cwd=project, env=env, capture_output=True, text=True, timeout=120)
    lines = where.stdout.splitlines()
    assert where.returncode == 0 and lines[0].startswith(str(site)), where.stdout + where.stderr
    assert lines[1] == "['inference_conformance.conformance.plugin']", lines


def test_the_projects_tests_behave_as_without_the_suite(site, project):
    check_inert(project, None, site)


def test_the_suites_benchmarks_are_collected_from_the_project(site, project):
    r = _pytest(project, site, "--pyargs", "inference_conformance.benchmarks", "--benchmark-disable", "--co")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    found = re.search(r"(\d+) tests? collected", r.stdout)
    assert found and int(found.group(1)) >= 100, r.stdout[-2000:]
    assert "bench_attention.py::" in r.stdout and str(site) not in r.stderr


def test_a_law_runs_an_outside_implementation(site, project):
    r = _pytest(project, site, "--pyargs", "inference_conformance.properties.attention.test_attention", "--device", "cpu",
                "--impl", "attention=my_attention:attention", "-k", "test_fa3_noncontiguous_inputs")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert re.search(r"\b1 passed\b", r.stdout) and "my_attention:attention" in r.stdout, r.stdout[-3000:]


def _snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by its path: its bytes; but the suite's output folder, and the
    caches Python and the project's own Hypothesis tests write (``.hypothesis``: its database)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not {"inference-conformance-out", "__pycache__", ".hypothesis"} & set(p.parts)}


def _command(project: Path, site: Path, extra: Path, *args: str, shell: str = "") -> subprocess.CompletedProcess:
    """``inference-conformance ARGS`` (its ``python -m`` form) from the wheel, in the project."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_", "HYPOTHESIS_"))}
    env.update(CI="true", PYTHONPATH=os.pathsep.join([str(site), str(project), str(extra)]))
    cmd = [sys.executable, "-m", "inference_conformance", *args]
    if shell:
        cmd = " ".join(cmd) + shell
    return subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=600, shell=bool(shell))


#: a kernel of the user's with three known bugs at once (tests/one_bug_impls.py's three_bug_attention)
THREE_BUGS = "import math\nimport torch\nfrom inference_conformance.conformance.contracts.attention import validate\n\n\n"


def test_day_one_from_the_wheel(site, project, tmp_path):
    """The commands the README and the guide give a new user, from the wheel in the kernel
    project (``run`` from the wheel: tests/test_cli_wheel.py; each subcommand's help:
    tests/test_cli.py): each exits as documented, the
    failures of a kernel with three known bugs fit a screen (at most 40 lines of at most 100
    columns) and name the three, the project's own test given in the same command runs, and
    nothing of the project changes."""
    import inspect

    from tests.one_bug_impls import three_bug_attention

    (tmp_path / "three_bugs.py").write_text(THREE_BUGS + inspect.getsource(three_bug_attention).replace(
        "def three_bug_attention(", "def attention("))
    before = _snapshot(project)
    run = lambda *args, **kw: _command(project, site, tmp_path, *args, **kw)   # noqa: E731

    listed = run("list", shell=" | head -1")
    assert listed.returncode == 0 and listed.stdout.startswith("attention: ") and not listed.stderr, listed
    laws = _pytest(project, site, "--pyargs", "inference_conformance.properties.attention.laws",
                   "tests/test_props.py", "--device", "cpu", "-k", "fa8_options and not bfloat16 or profile_says",
                   "--impl", "attention=three_bugs:attention", "--results", str(tmp_path / "rows"), extra=tmp_path)
    out = (laws.stdout + laws.stderr).rstrip("\n")
    assert laws.returncode == 1 and out.splitlines()[-1].startswith("1 failed, 1 passed"), out  # the project's test ran
    lines = out.splitlines()
    assert len(lines) <= 40 and max(map(len, lines)) <= 100 and str(site) not in out, out
    for bug in ("top_left_causal", "ignores_scale", "sinks_dropped_in_merge"):
        assert bug in out.split(" conformance failures: ")[-1], (bug, out)

    expected = run("expect", "update", str(tmp_path / "rows"), "--out", str(tmp_path / "expectations"))
    assert expected.returncode == 0 and expected.stdout.startswith("wrote "), expected
    assert run("expect", "update", str(tmp_path / "rows"), "--out", str(tmp_path / "x"), "--impl", "nope").returncode == 2
    merged = run("merge", str(tmp_path / "rows"), "--out", str(tmp_path / "matrix"))
    assert merged.returncode == 0, merged.stdout[-2000:] + merged.stderr[-2000:]
    assert _snapshot(project) == before, sorted(set(_snapshot(project)) ^ set(before))


def test_the_history_gate_compares_two_runs_from_the_wheel(site, project, tmp_path):
    """Two benchmark runs of ``run`` from the wheel, then the documented history mode: the gate
    compares the newest entry with the one before (exit 0, naming it), never with itself."""
    for _ in range(2):
        done = _command(project, site, tmp_path, "run", "--no-properties", "-n", "0", "--bench-k", "test_bench_fp8_cast")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    entries = sorted((project / "inference-conformance-out" / "history").rglob("*.json"))
    assert len(entries) == 2, entries
    gated = _command(project, site, tmp_path, "gate", str(entries[-1]))
    assert gated.returncode == 0 and entries[0].name in gated.stdout, gated.stdout + gated.stderr
    itself = _command(project, site, tmp_path, "gate", str(entries[-1]), "--baseline", str(entries[-1].parent))
    assert itself.returncode != 0 or entries[0].name in itself.stdout, itself.stdout + itself.stderr
