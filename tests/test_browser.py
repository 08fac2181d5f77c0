"""The HTML report, checked in a real browser: headless Chromium loads index.html from disk
(no server) and the summary, every claim row and every plot render; the conformance matrix
merged from two environments (an expected failure among its cells) renders and its technique
filter hides the other techniques. Built from a small
synthetic rows folder so the test is fast; the screenshot is kept in reports/out/ as an artifact.
Skipped (with the reason) when Chromium is absent, so the README's test command passes wherever
Python is; required (a missing browser fails) where the environment asks for it with
REQUIRE_BROWSER=1, as `.ci/run` does after installing Chromium.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inference_conformance.reports import merge
from inference_conformance.reports.ledger import claims
from tests.test_merge import two_environments
from tests.test_report import build_synthetic

ROOT = Path(__file__).resolve().parent.parent
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        p = shutil.which(name)
        if p:
            return p
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


def browser_required() -> bool:
    """REQUIRE_BROWSER=1 (or true/yes): a missing Chromium is a failure, not a skip."""
    return os.environ.get("REQUIRE_BROWSER", "").strip().lower() in ("1", "true", "yes")


def without_browser() -> None:
    """What a browser test does where no Chromium is found: fail if required, else skip."""
    if browser_required():
        pytest.fail("Chromium is not installed but REQUIRE_BROWSER is set "
                    "(.ci/run sets it after apt-get install chromium)")
    pytest.skip("Chromium is not installed (apt-get install chromium; REQUIRE_BROWSER=1 makes this "
                "a failure); the HTML report is not checked in a browser")


#: A file that exists while a Chromium install runs beside the tests (.ci/run starts it in the
#: background so that its minute overlaps the package install): the browser tests wait for it.
INSTALLING_ENV = "BROWSER_INSTALLING"


def wait_for_install(timeout: float = 600.0) -> str | None:
    """Chromium's path once found, waiting while the ``BROWSER_INSTALLING`` file exists (at most
    ``timeout`` seconds); None when none is found and no install is running."""
    marker = os.environ.get(INSTALLING_ENV, "")
    t0 = time.monotonic()
    while (exe := chromium()) is None and marker and Path(marker).exists() and time.monotonic() - t0 < timeout:
        time.sleep(1.0)
    return exe


@pytest.fixture(scope="module")
def browser():
    exe = wait_for_install()
    if exe is None:
        without_browser()
    return exe


@pytest.mark.parametrize("env, outcome", [({"CI": "true"}, pytest.skip.Exception),
                                          ({}, pytest.skip.Exception),
                                          ({"REQUIRE_BROWSER": "0"}, pytest.skip.Exception),
                                          ({"REQUIRE_BROWSER": "1"}, pytest.fail.Exception),
                                          ({"CI": "true", "REQUIRE_BROWSER": "1"}, pytest.fail.Exception)])
def test_missing_browser_fails_only_where_required(monkeypatch, env, outcome):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("REQUIRE_BROWSER", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(outcome, match="Chromium is not installed"):
        without_browser()


def _run(exe: str, tmp: Path, *args: str, timeout: int = 60) -> subprocess.CompletedProcess:
    profile = tmp / "profile"
    profile.mkdir(exist_ok=True)
    cmd = [exe, *FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser")
    return tmp, build_synthetic(tmp) / "index.html"


def test_summary_claims_and_plots_render(browser, page):
    tmp, index = page
    r = _run(browser, tmp, "--virtual-time-budget=5000", "--dump-dom", index.as_uri())
    dom = r.stdout
    assert r.returncode == 0 and "<body" in dom, r.stderr[-2000:]
    assert 'id="summary"' in dom and "claims checked" in dom
    for key in ("checked", "holding", "failing", "not_measured"):
        assert re.search(rf'data-count="{key}"><div class="n">\d+</div>', dom), key
    ids = re.findall(r'<tr class="claim[^"]*" id="claim-([A-Z]{2}-\d+)"', dom)
    assert ids == [c.id for c in claims()]
    imgs = re.findall(r'<img [^>]*class="plot"[^>]*>', dom)
    assert len(imgs) >= 4, "the synthetic run has data for the roofline, batch, NLL and history plots"
    assert all('data-rendered="yes"' in i for i in imgs), [i for i in imgs if 'data-rendered="yes"' not in i]
    m = re.search(r'data-plots-rendered="(\d+)/(\d+)"', dom)
    assert m and m.group(1) == m.group(2) == str(len(imgs))
    assert re.search(r'data-claim-rows="(\d+)"', dom).group(1) == str(len(claims()))


def test_screenshot_artifact(browser, page):
    tmp, index = page
    shot = ROOT / "reports" / "out" / "browser-screenshot.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    r = _run(browser, tmp, "--window-size=1280,2400", f"--screenshot={shot}", index.as_uri())
    assert r.returncode == 0 and shot.exists() and shot.stat().st_size > 10_000, r.stderr[-2000:]


def test_matrix_page_renders_and_filters_by_technique(browser, tmp_path):
    ctx = merge.matrix(merge.load(two_environments(tmp_path)))
    index = merge.write(ctx, tmp_path / "matrix")[0]
    n_cells = sum(len(r["cells"]) for t in ctx["techniques"] for r in t["rows"])
    r = _run(browser, tmp_path, "--virtual-time-budget=3000", "--dump-dom", index.as_uri())
    dom = r.stdout
    assert r.returncode == 0 and "<body" in dom, r.stderr[-2000:]
    assert f'data-cells="{n_cells}"' in dom and 'data-shown="all"' in dom      # the page's script ran
    assert len(re.findall(r'<td class="cell s-expected-fail"[^>]*><a href="#d\d+">expected fail</a>', dom)) == 1
    assert re.search(r'<td class="cell s-fail"[^>]*><a href="#(d\d+)">fail</a>', dom)
    assert not re.search(r'class="matrix-technique"[^>]*hidden', dom)
    r = _run(browser, tmp_path, "--virtual-time-budget=3000", "--dump-dom", index.as_uri() + "#technique=quantization")
    dom = r.stdout
    assert 'data-shown="quantization"' in dom, r.stderr[-2000:]
    assert re.search(r'data-technique="attention" id="matrix-attention" hidden', dom)
    assert not re.search(r'data-technique="quantization" id="matrix-quantization" hidden', dom)


def test_an_install_running_beside_the_tests_is_waited_for(monkeypatch, tmp_path):
    """While the BROWSER_INSTALLING file exists the browser is waited for; once it is gone (the
    install ended without a browser), or without such a file, there is no wait."""
    import threading

    marker = tmp_path / "installing"
    marker.write_text("")
    monkeypatch.setenv(INSTALLING_ENV, str(marker))
    found = {"exe": None}
    monkeypatch.setattr(sys.modules[__name__], "chromium", lambda: found["exe"])
    threading.Timer(1.5, lambda: found.update(exe="/opt/chromium")).start()
    t0 = time.monotonic()
    assert wait_for_install(timeout=30) == "/opt/chromium" and time.monotonic() - t0 >= 1.0
    found["exe"] = None
    marker.unlink()
    t0 = time.monotonic()
    assert wait_for_install(timeout=30) is None and time.monotonic() - t0 < 1.0
