"""The Triton kernels compile for a GPU, checked on a machine without one.

CI interprets the kernels; compiled code takes other paths (the two-stage tile loop, tl.dot on
16-bit tiles, the ``for`` tile loop that Triton software-pipelines). Triton compiles ahead of
time for a named target without a device, so this runs every kernel through the whole
pipeline (TTIR, TTGIR, LLVM IR, PTX, cubin) for sm_90 (H100/H200) on the installed Triton, in a
subprocess without TRITON_INTERPRET, and checks that the attention kernels' key-tile loops are
``scf.for`` loops (pipelined), never ``scf.while``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

def _variants():
    """Every kernel module's own ``compile_variants()`` (``inference_conformance.optimized.triton_shared.kernel_modules``
    finds the modules that define kernels: no list of kernels is kept here)."""
    from inference_conformance.optimized.triton_shared import kernel_modules

    for module in kernel_modules():
        yield from module.compile_variants()


def compile_all() -> dict[str, dict]:
    """{variant: {"ok": bool, "error": str, "for": n scf.for, "while": n scf.while}} for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", 90, 32)
    out = {}
    for variant in _variants():
        name, fn, types, consts = variant.label, variant.kernel, variant.types, variant.constexprs
        sig = {a: ("constexpr" if a in consts else types.get(a, "i32")) for a in fn.arg_names}
        src = ASTSource(fn=fn, signature=sig,
                        constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
        try:
            k = triton.compile(src, target=target, options={"num_warps": 4, "num_stages": 3})
            ttir = k.asm["ttir"]
            out[name] = {"ok": "cubin" in k.asm, "error": "", "for": ttir.count("scf.for"),
                         "while": ttir.count("scf.while"), "min_for": variant.min_for_loops}
        except Exception as e:  # noqa: BLE001 - reported per variant
            out[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:3000], "for": 0, "while": 0,
                         "min_for": variant.min_for_loops}
    return out


def test_triton_kernels_compile_for_sm90_with_pipelined_tile_loops(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    # no line tables (debug metadata: the same code, about a tenth less compile time)
    env["TRITON_DISABLE_LINE_INFO"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, __file__], capture_output=True, text=True, timeout=600, env=env,
                       cwd=ROOT)
    if r.returncode == 3:
        pytest.skip(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads(r.stdout.strip().splitlines()[-1])
    failed = {n: v["error"] for n, v in results.items() if not v["ok"]}
    assert not failed, failed
    for name, v in results.items():
        if v["min_for"]:  # pipelined tile loops (two-stage attention: two key-tile loops)
            assert v["for"] >= v["min_for"] and v["while"] == 0, (name, v)


def test_every_kernel_has_a_compile_variant_and_a_smoke_call(device):
    """A new kernel cannot be forgotten: every ``@triton.jit`` function named ``*_kernel`` in
    ``optimized/`` is compiled by some variant of its module, and its module has smoke calls."""
    import re

    from inference_conformance.optimized.triton_shared import kernel_modules

    modules = kernel_modules()
    assert {m.__name__.split(".")[-1] for m in modules} >= {"flash_attention", "flash_decoding", "paged_attention",
                                                            "quant_matmul", "w8a8_matmul", "append"}
    for m in modules:
        src = Path(m.__file__).read_text(encoding="utf-8")
        kernels = set(re.findall(r"@triton\.jit\s*\n\s*def (\w+_kernel)\(", src))
        compiled = {getattr(getattr(v.kernel, "fn", v.kernel), "__name__", "") for v in m.compile_variants()}
        assert kernels <= compiled, f"{m.__name__}: kernels without a compile variant: {sorted(kernels - compiled)}"
        assert m.smoke_calls(device), f"{m.__name__} has no smoke call"


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    try:
        from triton.backends.nvidia.compiler import get_ptxas  # noqa: F401
    except ImportError as e:
        print(f"this Triton has no CUDA backend to compile for ({e})")
        sys.exit(3)
    print(json.dumps(compile_all()))
