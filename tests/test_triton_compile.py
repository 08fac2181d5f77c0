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

F16, F32, F64 = "*fp16", "*fp32", "*fp64"


def _variants():
    import optimized.attention_tiles as tiles
    import optimized.flash_attention as fa
    import optimized.flash_decoding as fd
    import optimized.kv_append as kc
    import optimized.paged_attention as pa
    import optimized.quant_matmul as qm
    import optimized.triton_shared as shared
    import optimized.w8a8_matmul as w8

    attn = fa._flash_attn_fwd_kernel
    # (each dtype's tile products; both masks on 16-bit, where the autotuned benchmarks run)
    for dt, mode, bm, bn, bd, causal in ((F16, shared.DOT_NATIVE, 64, 64, 64, True),
                                         (F16, shared.DOT_NATIVE, 64, 64, 64, False),
                                         (F32, shared.DOT_IEEE, 64, 32, 64, True),
                                         (F64, shared.DOT_SUM, 16, 16, 16, True)):
        yield (f"flash_attn {dt[1:]} causal={causal}", attn,
               {"Q_ptr": dt, "K_ptr": dt, "V_ptr": dt, "O_ptr": dt, "scale": "fp32"},
               dict(CAUSAL=causal, EVEN_D=False, DOT_MODE=mode, TWO_STAGE=True,
                    BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd))
    yield ("split_kv fp16 causal", fd._split_kv_kernel,
           {"Q_ptr": F16, "K_ptr": F16, "V_ptr": F16, "OP_ptr": F32, "LSE_ptr": F32, "scale": "fp32"},
           dict(CAUSAL=True, EVEN_D=True, DOT_MODE=shared.DOT_NATIVE, TWO_STAGE=True, BLOCK_M=16, BLOCK_N=64,
                BLOCK_D=64))
    yield ("merge fp32", tiles.split_kv_merge_kernel, {"OP_ptr": F32, "LSE_ptr": F32, "O_ptr": F16},
           dict(BLOCK_M=16, BLOCK_S=8, BLOCK_D=64))
    yield ("kv_append fp16", kc.kv_append_kernel,
           {"k_new_ptr": F16, "v_new_ptr": F16, "k_cache_ptr": F16, "v_cache_ptr": F16,
            "start_ptr": "*i64", "count_ptr": "*i64"},
           dict(BLOCK_T=4, BLOCK_KH=128))
    for dt, acc64, split in ((F16, False, True), (F64, True, False)):
        yield (f"paged_decode {dt[1:]} split={split}", pa._paged_decode_kernel,
               {"Q_ptr": dt, "K_ptr": dt, "V_ptr": dt, "BT_ptr": "*i32", "LENS_ptr": "*i32", "O_ptr": dt,
                "OP_ptr": F32, "LSE_ptr": F32, "scale": "fp32"},
               dict(PAGE=16, SPLIT=split, ACC64=acc64, BLOCK_H=16, BLOCK_N=32, BLOCK_D=64))
    yield ("merge fp32 BLOCK_M=2", tiles.split_kv_merge_kernel, {"OP_ptr": F32, "LSE_ptr": F32, "O_ptr": F16},
           dict(BLOCK_M=2, BLOCK_S=8, BLOCK_D=64))                # (paged decode: one row per sequence)
    yield ("paged write fp16", pa._write_kv_kernel,
           {"K_ptr": F16, "V_ptr": F16, "KC_ptr": F16, "VC_ptr": F16, "SLOT_ptr": "*i64"},
           dict(PAGE=16, BLOCK_HKV=8, BLOCK_D=64))
    # (without g_idx the wrapper passes the codes as g_idx_ptr; act-order takes an int32 g_idx)
    for dt, bits, per, bm, mode, act in ((F16, 4, 2, 16, shared.DOT_NATIVE, False),
                                         ("*bf16", 8, 1, 64, shared.DOT_NATIVE, False),
                                         (F32, 4, 2, 32, shared.DOT_IEEE, False), (F16, 4, 2, 64, shared.DOT_NATIVE, True)):
        yield (f"quant_matmul {dt[1:]} int{bits} BLOCK_M={bm}" + " g_idx" * act, qm.quant_matmul_kernel,
               {"x_ptr": dt, "codes_ptr": "*u8", "scales_ptr": F32, "zeros_ptr": "*u8",
                "g_idx_ptr": "*i32" if act else "*u8", "out_ptr": dt},
               dict(BITS=bits, PER=per, BLOCK_M=bm, BLOCK_N=64 if bm == 16 else 32, BLOCK_K=64, DOT_MODE=mode,
                    HAS_G_IDX=act))
    for dt, bits, per, mode, act in ((F16, 4, 2, shared.DOT_NATIVE, False), ("*bf16", 8, 1, shared.DOT_NATIVE, False),
                                     (F16, 4, 2, shared.DOT_NATIVE, True)):
        yield (f"quant_gemv {dt[1:]} int{bits}" + " g_idx" * act, qm.quant_gemv_kernel,
               {"x_ptr": dt, "codes_ptr": "*u8", "scales_ptr": F32, "zeros_ptr": "*u8",
                "g_idx_ptr": "*i32" if act else "*u8", "part_ptr": F32},
               dict(BITS=bits, PER=per, BLOCK_M=qm.GEMV_MAX_M, BLOCK_N=qm.GEMV_BLOCKS[0], BLOCK_K=qm.GEMV_BLOCKS[1],
                    DOT_MODE=mode, HAS_G_IDX=act))
    for out, bm in (("*i32", 16), ("*bf16", 64)):
        yield (f"w8a8_matmul out {out[1:]} BLOCK_M={bm}", w8.w8a8_matmul_kernel,
               {"xq_ptr": "*i8", "wq_ptr": "*i8", "xs_ptr": F32, "ws_ptr": F32, "out_ptr": out},
               dict(BLOCK_M=bm, BLOCK_N=64, BLOCK_K=64, SCALED=out != "*i32", ROUND_BF16=False))


def compile_all() -> dict[str, dict]:
    """{variant: {"ok": bool, "error": str, "for": n scf.for, "while": n scf.while}} for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", 90, 32)
    out = {}
    for name, fn, types, consts in _variants():
        sig = {a: ("constexpr" if a in consts else types.get(a, "i32")) for a in fn.arg_names}
        src = ASTSource(fn=fn, signature=sig,
                        constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
        try:
            k = triton.compile(src, target=target, options={"num_warps": 4, "num_stages": 3})
            ttir = k.asm["ttir"]
            out[name] = {"ok": "cubin" in k.asm, "error": "", "for": ttir.count("scf.for"),
                         "while": ttir.count("scf.while")}
        except Exception as e:  # noqa: BLE001 - reported per variant
            out[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:3000], "for": 0, "while": 0}
    return out


def test_triton_kernels_compile_for_sm90_with_pipelined_tile_loops(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
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
        if name.startswith(("flash_attn", "split_kv")):
            assert v["for"] >= 2 and v["while"] == 0, (name, v)  # two-stage: two key-tile loops
        if name.startswith(("paged_decode", "quant_matmul", "quant_gemv", "w8a8_matmul")):
            assert v["for"] >= 1 and v["while"] == 0, (name, v)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    try:
        from triton.backends.nvidia.compiler import get_ptxas  # noqa: F401
    except ImportError as e:
        print(f"this Triton has no CUDA backend to compile for ({e})")
        sys.exit(3)
    print(json.dumps(compile_all()))
