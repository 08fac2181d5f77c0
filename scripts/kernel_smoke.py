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
    """(label, run) of every kernel module's own ``smoke_calls(device)``, module by module
    (``inference_conformance.optimized.triton_shared.kernel_modules``: no list of kernels is kept here)."""
    from inference_conformance.optimized.triton_shared import kernel_modules

    return [(c.label, c.run) for module in kernel_modules() for c in module.smoke_calls(device)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None)
    args = ap.parse_args(argv)
    from inference_conformance.conformance.device import select_device

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
