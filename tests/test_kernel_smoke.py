"""scripts/kernel_smoke.py, the first step of the GPU tier: every Triton kernel compiled (here:
interpreted) and run once on tiny inputs, the versions printed, and a failure told in one line."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def smoke():
    spec = importlib.util.spec_from_file_location("kernel_smoke", ROOT / "scripts" / "kernel_smoke.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_kernel_runs_once_and_versions_are_printed(smoke, device, capsys):
    assert smoke.main(["--device", device]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("python ") and " torch " in out[0] and " triton " in out[0], out[0]
    names = [line.split("  ")[1] for line in out[1:]]
    from inference_conformance.optimized.triton_shared import kernel_modules

    want = [c.label for m in kernel_modules() for c in m.smoke_calls(device)]
    assert names == want, out
    assert {n.split()[0] for n in names} >= {"flash_attention", "flash_decoding", "split_kv_merge", "kv_append",
                                             "paged_attention", "quant_matmul", "w8a8_matmul"}, out


@pytest.mark.parametrize("broken", ["raises", "wrong"])
def test_a_failing_kernel_stops_the_check_in_one_line(smoke, device, capsys, monkeypatch, broken):
    import inference_conformance.optimized.attention.flash_decoding as fd

    real = fd.flash_decoding

    def bad(q, k, v, **kw):
        if broken == "raises":
            raise RuntimeError("no kernel\nfor you")
        return real(q, k, v, **kw) + 1.0

    monkeypatch.setattr(fd, "flash_decoding", bad)
    assert smoke.main(["--device", device]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("kernel smoke check FAILED: flash_decoding"), out
    assert ("RuntimeError: no kernel for you" in out[-1]) == (broken == "raises"), out[-1]
    assert not any(line.startswith("ok  kv_append") for line in out), "the check stops at the first failure"


def test_gpu_tier_runs_it_before_anything_long():
    lines = (ROOT / "scripts" / "gpu_tier.sh").read_text(encoding="utf-8").splitlines()
    smoke = [i for i, line in enumerate(lines) if "scripts/kernel_smoke.py --device cuda" in line and "if !" in line]
    long_ = [i for i, line in enumerate(lines) if "-m inference_conformance.reports" in line and not line.lstrip().startswith("#")]
    assert smoke and long_ and smoke[0] < long_[0], (smoke, long_)
    assert "exit 1" in "\n".join(lines[smoke[0]:smoke[0] + 4]), "a failed check must stop the tier"
