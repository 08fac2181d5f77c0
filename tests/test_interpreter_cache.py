"""inference_conformance.conformance.device.cache_interpreter_patching: Triton's interpreter, its language scan read
once, wraps exactly what it wrapped before, and the kernels give the same bits; and
skip_discarded_overflow_checks: the overflow checks that debug=False discards are off, the bits again the same."""
from __future__ import annotations

import pytest
import torch

from inference_conformance.conformance.device import (cache_interpreter_patching, skip_discarded_overflow_checks,
                                                      triton_interpreted)

pytestmark = pytest.mark.skipif(not triton_interpreted(), reason="the interpreter runs only without CUDA")


class RecordingScope:
    """A stand-in for the interpreter's patch scope: records what is patched, restores it."""

    def __init__(self):
        self.changes = []

    def set_attr(self, obj, name, value):
        self.changes.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    def restore(self):
        while self.changes:
            obj, name, original = self.changes.pop()
            setattr(obj, name, original)


def _patched_names(patch_builtin, packages):
    """[(package, name)] wrapped by a first call per package and by a second one on top of it."""
    from triton.runtime import interpreter

    first, second = RecordingScope(), RecordingScope()
    try:
        for pkg in packages:
            patch_builtin(pkg, interpreter.interpreter_builder, first)
        once = [(id(o), n) for o, n, _ in first.changes]
        for pkg in packages:
            patch_builtin(pkg, interpreter.interpreter_builder, second)
        twice = [(id(o), n) for o, n, _ in second.changes]
    finally:
        second.restore()
        first.restore()
    return once, twice


def test_the_cached_scan_wraps_what_the_original_wraps():
    """In a fresh process: a kernel launch elsewhere in this process that was refused part-way (an
    implementation raising inside the interpreter) can leave a class's members wrapped, which the
    original scan then skips; the comparison is of the two scans, not of that leftover state."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-c", "from tests.test_interpreter_cache import _compare_scans; _compare_scans()"],
                       cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def _compare_scans():
    import triton.language as tl
    from triton.runtime import interpreter

    assert cache_interpreter_patching(), "this Triton's interpreter is not the shape the cache reads"
    cached = interpreter._patch_builtin
    packages = [tl, tl.tensor, tl.math, tl.core.tensor_descriptor_base]
    once, twice = _patched_names(cached.__wrapped__, packages)
    assert len(once) > 100 and twice == [], (len(once), twice[:5])
    assert _patched_names(cached, packages) == (once, twice)
    assert cache_interpreter_patching() and interpreter._patch_builtin is cached, "not idempotent"


def test_a_builtin_added_after_the_first_scan_is_wrapped_too(monkeypatch):
    """An extension (or a test) adding a builtin to triton.language after kernels ran: the new
    member count reads the names again, so it is wrapped as the original would wrap it."""
    import triton.language as tl
    from triton.runtime import interpreter

    assert cache_interpreter_patching()
    cached = interpreter._patch_builtin
    _patched_names(cached, [tl])                     # the names read before the addition

    @tl.core.builtin
    def twice_plus_one(x, _semantic=None):
        return tl.core.add(tl.core.mul(x, 2.0, _semantic=_semantic), 1.0, _semantic=_semantic)

    monkeypatch.setattr(tl, "twice_plus_one", twice_plus_one, raising=False)
    once, _ = _patched_names(cached, [tl])
    assert (id(tl), "twice_plus_one") in once
    assert once == _patched_names(cached.__wrapped__, [tl])[0]


def test_kernels_give_the_same_bits_with_and_without_the_cache(monkeypatch):
    from triton.runtime import interpreter

    from inference_conformance.optimized.attention.flash_attention import attention

    assert cache_interpreter_patching()
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 5, 16, generator=g) for _ in range(3))
    k, v = k[:, :2].repeat(1, 1, 9, 1)[:, :, :37], v[:, :2].repeat(1, 1, 9, 1)[:, :, :37]
    with_cache = attention(q, k, v, causal=True, scale=0.3)
    monkeypatch.setattr(interpreter, "_patch_builtin", interpreter._patch_builtin.__wrapped__)
    without = attention(q, k, v, causal=True, scale=0.3)
    assert torch.equal(with_cache, without)


def test_discarded_overflow_checks_are_off_and_the_bits_the_same(monkeypatch):
    """The checks are skipped only while debug is off (their verdict discarded): the split-KV
    kernel's output (index arithmetic in int32) is bit for bit the one with the checks computed."""
    import dataclasses

    from triton.runtime import interpreter

    from inference_conformance.optimized.attention.flash_decoding import flash_decoding

    assert skip_discarded_overflow_checks() and skip_discarded_overflow_checks(), "not idempotent"
    options = interpreter.interpreter_builder.options
    assert options.debug is False and options.sanitize_overflow is False
    g = torch.Generator().manual_seed(5)
    q, k, v = torch.randn(2, 4, 3, 16, generator=g), torch.randn(2, 2, 70, 16, generator=g), torch.randn(2, 2, 70, 16, generator=g)
    skipped = flash_decoding(q, k, v, causal=True, scale=0.25, num_splits=3)
    monkeypatch.setattr(interpreter.interpreter_builder, "options", dataclasses.replace(options, sanitize_overflow=True))
    checked = flash_decoding(q, k, v, causal=True, scale=0.25, num_splits=3)
    assert torch.equal(skipped, checked)
    monkeypatch.setattr(interpreter.interpreter_builder, "options", dataclasses.replace(options, debug=True,
                                                                                           sanitize_overflow=True))
    assert not skip_discarded_overflow_checks(), "checks that assert (debug=True) must stay"
    assert interpreter.interpreter_builder.options.sanitize_overflow is True


def test_a_run_time_loop_bound_on_an_old_interpreter_gets_a_hint(tmp_path):
    """Triton < 3.7's interpreter with numpy >= 2.4 stops at a kernel's run-time ``range`` bound:
    the failure says it is that limit (the kernel never ran), naming the way around it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from inference_conformance.conformance.device import interpreter_hint

    err = "InterpreterError: TypeError('only 0-dimensional arrays can be converted to Python scalars')"
    assert "while loop" in interpreter_hint(err) and interpreter_hint("AssertionError: 1 != 2") is None
    (tmp_path / "test_k.py").write_text(f"def test_kernel():\n    raise RuntimeError({err!r})\n")
    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT_TEST"))}
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    # --results: a test outside the suite gets the suite's rows and hints only in a run that asks for them
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
                        "--device", "cpu", f"--results={tmp_path / 'rows'}", "test_k.py"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert "the interpreter's limit, not the implementation's" in r.stdout and "while loop" in r.stdout, r.stdout[-3000:]
