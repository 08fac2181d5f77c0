"""The wheel: one top-level name, everything the suite reads shipped inside it, and the one
command working from it (``list``, a tiny report, ``merge`` in ledger order) in a folder that
is not the checkout.

The wheel is built from a copy of the checkout (``pip wheel --no-build-isolation``: the running
environment's setuptools, no download) and installed with ``pip install --no-deps --target``,
so it runs on this environment's torch and Triton with nothing but the wheel's files for the suite.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from inference_conformance.reports import publish
from tests.test_cli import command, imported, ledger_order_holds, ledger_ordered_run

ROOT = Path(__file__).resolve().parent.parent
#: what a build must not copy from the checkout (environments, outputs, caches, history)
SKIP = shutil.ignore_patterns(".git", ".venv*", ".tox", "build", "*.egg-info", "__pycache__", publish.OUT_NAME, "out",
                              "history", ".hypothesis", ".benchmarks")
#: files the suite reads at run time, which the wheel must hold
SHIPPED = ("inference_conformance/CLAIMS.md", "inference_conformance/reports/templates/index.html.j2",
           "inference_conformance/reports/templates/report.md.j2", "inference_conformance/reports/templates/matrix.html.j2",
           "inference_conformance/reports/templates/matrix.md.j2", "inference_conformance/perf/calibration/gate_calibration.json",
           "inference_conformance/smallworld/checkpoints/target.safetensors",
           "inference_conformance/smallworld/checkpoints/draft_good.safetensors",
           "inference_conformance/smallworld/checkpoints/heads/target_medusa2.safetensors",
           "inference_conformance/cli.py", "inference_conformance/catalog.py", "inference_conformance/__main__.py")

pytestmark = pytest.mark.skipif(importlib.util.find_spec("setuptools") is None,
                                reason="building the wheel without a download needs setuptools in this environment "
                                       "(the [test] extra installs it)")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, the folder it is installed into)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=SKIP, symlinks=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(src)], check=True,
                   timeout=300)
    wheel = next((tmp / "dist").glob("inference_conformance-*.whl"))
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(tmp / "site"), str(wheel)], check=True,
                   timeout=300)
    return wheel, tmp / "site"


def test_the_wheel_has_one_top_level_name_and_ships_what_the_suite_reads(installed):
    wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"inference_conformance"}, sorted(tops)
    missing = [f for f in SHIPPED if f not in names]
    assert not missing, missing
    assert any(n.startswith("inference_conformance/expectations/") and n.endswith(".toml") for n in names)
    claims = zipfile.ZipFile(wheel).read("inference_conformance/CLAIMS.md").decode()
    assert claims == (ROOT / "CLAIMS.md").read_text(encoding="utf-8"), "the wheel's ledger is the checkout's"
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "inference-conformance = inference_conformance.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_list_from_the_wheel_imports_no_torch(installed, tmp_path):
    _, site = installed
    done = command("list", flags=("-X", "importtime"), cwd=tmp_path, pythonpath=str(site))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "torch" not in imported(done.stderr)
    assert "attention: attention; claims" in done.stdout and "QT-9 " in done.stdout, done.stdout[:2000]
    where = subprocess.run([sys.executable, "-c", "import inference_conformance as p; print(p.__file__)"], cwd=tmp_path,
                           env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert where.stdout.strip() == str(site / "inference_conformance" / "__init__.py"), where


def test_a_report_and_a_merge_from_the_wheel_finish_in_the_current_folder(installed, tmp_path):
    """The main job from the wheel collects the installed laws (--pyargs), reads the shipped ledger
    and templates, and writes ./inference-conformance-out; merge keeps the ledger order."""
    _, site = installed
    done = command("run", "--no-bench", "--no-history", "-n", "0", "--select", "inference_conformance.properties.roofline.test_roofline",
                   "--", "-k", "intensity", cwd=tmp_path, pythonpath=str(site))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = tmp_path / publish.OUT_NAME
    doc = json.loads((out / "results.json").read_text())
    assert doc["summary"]["total"] >= 60 and doc["summary"]["checked"] >= 1, doc["summary"]
    rows = [json.loads(line) for f in (out / "rows").glob("*.jsonl") for line in f.read_text().splitlines() if line]
    assert rows and all(r["check"].startswith("properties/roofline/test_roofline.py::") for r in rows), rows[:3]
    assert sorted(p.name for p in tmp_path.iterdir()) == [publish.OUT_NAME]
    assert not any(p.name == publish.OUT_NAME for p in site.rglob(publish.OUT_NAME))
    run = ledger_ordered_run(tmp_path / "runs" / "one")
    merged = command("merge", str(run), "--out", str(tmp_path / "matrix"), cwd=tmp_path, pythonpath=str(site))
    assert merged.returncode == 0, merged.stderr
    ledger_order_holds(tmp_path / "matrix" / "results.json")


#: run from the installed wheel: each shipped datum read where the suite reads it, and printed
READ_DATA = """
import json, torch
from pathlib import Path
import inference_conformance as pkg
from inference_conformance.conformance import expectations
from inference_conformance.reports import build, ledger, templating
from inference_conformance.smallworld.checkpoints import load_model
from inference_conformance.smallworld.heads import shipped_heads
where = {"package": str(Path(pkg.__file__).parent), "claims": len(ledger.claims()),
         "expectations": len(expectations.load([expectations.BUILTIN])),
         "calibration": build.gate_calibration() is not None,
         "template": templating.html_env().get_template("matrix.html.j2").filename,
         "target": sum(p.numel() for p in load_model("target", torch.float32).parameters()),
         "heads": sum(p.numel() for p in shipped_heads().layers.parameters())}
print(json.dumps(where))
"""


def test_the_shipped_data_is_read_from_the_installed_package(installed, tmp_path):
    """The ledger, the expectations, the gate's calibration, a template, the world's checkpoints
    and the heads load from the wheel's files (nothing from the checkout is on the path)."""
    _, site = installed
    done = subprocess.run([sys.executable, "-c", READ_DATA], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["package"] == str(site / "inference_conformance"), got
    assert got["claims"] >= 60 and got["expectations"] >= 10 and got["calibration"], got
    assert got["template"].startswith(str(site / "inference_conformance" / "reports" / "templates")), got
    assert got["target"] > 0 and got["heads"] > 0, got


def _collected(args: list[str], cwd: Path, pythonpath: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": pythonpath, "PATH": "/usr/bin:/bin", "HOME": str(cwd)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return sorted(line for line in done.stdout.splitlines() if "::" in line)


def test_the_benchmarks_collect_from_the_wheel_as_from_the_checkout(installed, tmp_path):
    """Under the configuration ``run`` writes for an installed suite, ``--pyargs
    inference_conformance.benchmarks`` collects every bench_*.py test the checkout has, by the same ids."""
    from inference_conformance.reports.__main__ import INSTALLED_INI

    _, site = installed
    (tmp_path / "pytest.ini").write_text(INSTALLED_INI)
    wheel = _collected(["-c", "pytest.ini", f"--rootdir={site / 'inference_conformance'}", "--pyargs",
                        "inference_conformance.benchmarks"], tmp_path, str(site))
    checkout = _collected(["benchmarks"], ROOT, str(ROOT))
    assert len(checkout) > 50 and wheel == checkout, (len(wheel), len(checkout), sorted(set(wheel) ^ set(checkout))[:5])
