"""Compile and run each Triton kernel of the suite once, on tiny inputs, on this machine's torch
and Triton: the first step of ``scripts/gpu_tier.sh``, so that a stack the kernels do not build
on is reported in one line within seconds, not after minutes of tests.

Usage: python scripts/kernel_smoke.py [--device cpu|cuda]   (default: cuda when available)

Prints the versions, then one line per kernel call; exits 1 at the first failure with one line
``kernel smoke check FAILED: <kernel call>: <error>``. Outputs are judged by the tolerance policy
(attention against the float64 reference; the KV append bit-exactly against its PyTorch twin).
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _calls(device: str):
    import torch

    from conformance import tolerance
    from optimized.flash_attention import flash_attention
    from optimized.flash_decoding import flash_decoding
    from optimized.kv_append import kv_append, kv_append_torch
    from reference.attention import attention as attention_ref
    from reference.attention import attention_naive

    def attn(fn, dtype, Tq, Tk, causal, **kw):
        def run():
            g = torch.Generator().manual_seed(0)
            q = torch.randn(1, 4, Tq, 40, generator=g).to(device, dtype)
            k = torch.randn(1, 2, Tk, 40, generator=g).to(device, dtype)
            v = torch.randn(1, 2, Tk, 40, generator=g).to(device, dtype)
            scale = 40 ** -0.5
            out = fn(q, k, v, causal=causal, scale=scale, **kw)
            out_ref = attention_ref(q, k, v, causal=causal, scale=scale)
            out_pt = attention_naive(q, k, v, causal=causal, scale=scale) if dtype in (torch.float16, torch.bfloat16) else None
            return tolerance.check_close(out, out_ref, out_pt=out_pt)
        return run

    def append():
        g = torch.Generator().manual_seed(0)
        k_cache = torch.full((2, 2, 16, 8), float("nan"), device=device)
        v_cache = k_cache.clone()
        k_new = torch.randn(2, 2, 3, 8, generator=g).to(device)
        v_new = torch.randn(2, 2, 3, 8, generator=g).to(device)
        start = torch.tensor([0, 5], device=device)
        count = torch.tensor([3, 2], device=device)
        k2, v2 = k_cache.clone(), v_cache.clone()
        kv_append(k_cache, v_cache, k_new, v_new, start, count)
        kv_append_torch(k2, v2, k_new, v_new, start, count)
        return tolerance.check_exact(torch.nan_to_num(torch.stack([k_cache, v_cache]), nan=7.0),
                                     torch.nan_to_num(torch.stack([k2, v2]), nan=7.0))

    def quant(bits, granularity, dtype, M):
        def run():
            from optimized import quant_matmul, quantization as quant_torch

            g = torch.Generator().manual_seed(0)
            w = torch.randn(40, 96, generator=g).to(device, dtype)
            x = torch.randn(M, 96, generator=g).to(device, dtype)
            qw = quant_torch.quantize(w, bits=bits, granularity=granularity)
            d = quant_torch.dequantize(qw)
            out = quant_torch.TRITON_SYMMETRIC.matmul(x, qw)
            return tolerance.check_close(out, x.double() @ d.double().T, out_pt=x @ d.T, rule="quant-matmul")
        return run

    def w8a8(out_dtype):
        def run():
            from optimized import w8a8_matmul as w8
            from reference.quant_methods import fake_quantize_activations, fake_quantize_weight

            g = torch.Generator().manual_seed(0)
            if out_dtype == torch.int32:
                x_q = torch.randint(-127, 128, (3, 300), generator=g, dtype=torch.int8).to(device)
                w_q = torch.randint(-127, 128, (40, 300), generator=g, dtype=torch.int8).to(device)
                ones = torch.ones(40, device=device)
                acc = w8.w8a8_matmul(x_q, ones[:3], w_q, ones, out_dtype=torch.int32)
                return tolerance.check_exact(acc.cpu().long(), x_q.cpu().long() @ w_q.cpu().long().T)
            x = torch.randn(3, 96, generator=g).to(device, out_dtype)
            w = torch.randn(40, 96, generator=g).to(device, out_dtype)
            out = w8.w8a8_linear(x, *w8.quantize_weight(w))
            return tolerance.check_close(out, fake_quantize_activations(x.double(), 8, "token")
                                         @ fake_quantize_weight(w.double(), 8).T)
        return run

    return [
        ("flash_attention float16 causal Tq=Tk=50", attn(flash_attention, torch.float16, 50, 50, True)),
        ("flash_attention float32 Tq=7 Tk=33", attn(flash_attention, torch.float32, 7, 33, False)),
        ("flash_attention float64 causal Tq=5 Tk=21", attn(flash_attention, torch.float64, 5, 21, True)),
        ("flash_decoding bfloat16 causal Tq=1 Tk=70 num_splits=3",
         attn(flash_decoding, torch.bfloat16, 1, 70, True, num_splits=3)),
        ("kv_append float32 B=2 T=3", append),
        ("quant_matmul bfloat16 int4 g32 M=1", quant(4, 32, torch.bfloat16, 1)),
        ("quant_matmul float32 int8 per channel M=20", quant(8, "channel", torch.float32, 20)),
        ("w8a8_matmul int32 accumulator M=3 K=300", w8a8(torch.int32)),
        ("w8a8_matmul bfloat16 M=3", w8a8(torch.bfloat16)),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None)
    args = ap.parse_args(argv)
    from conformance.device import select_device

    device = select_device(args.device)
    import torch
    import triton

    gpu = torch.cuda.get_device_name(0) if device == "cuda" else "none (Triton interpreted)"
    print(f"python {platform.python_version()}  torch {torch.__version__}  triton {triton.__version__}  "
          f"device {device}  gpu {gpu}", flush=True)
    for name, run in _calls(device):
        t0 = time.perf_counter()
        try:
            verdict = run()
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - any failure is reported, in one line
            msg = " ".join(f"{type(e).__name__}: {e}".split())
            print(f"kernel smoke check FAILED: {name}: {msg[:400]}", flush=True)
            return 1
        if not verdict.ok:
            print(f"kernel smoke check FAILED: {name}: error {verdict.error:.3e} > bound {verdict.bound:.3e} "
                  f"({verdict.rule})", flush=True)
            return 1
        print(f"ok  {name}  ({time.perf_counter() - t0:.2f} s, error {verdict.error:.2e} <= {verdict.bound:.2e})",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
