"""Adapters for the dense kernels users compare against: flash-attn and FlashInfer prefill (the
``attention`` contract; the paged decode adapters are in
:mod:`inference_conformance.optimized.paged_attention.outside_kernels`).

They meet ``conformance/contracts/attention.py``::

    attention(q, k, v, *, causal: bool, scale: float) -> Tensor
    q (B, Hq, Tq, D); k, v (B, Hkv, Tk, D); causal mask aligned bottom-right; returns (B, Hq, Tq, D)

Each translates the call into the outside library's layout. The contract lists them with the
library each needs and the devices it runs on (CUDA): where the library is not installed the
registry marks them unavailable without importing anything. A (dtype, head dim, shape) the
library does not support raises ``NotImplementedError`` (reported "unsupported", never a pass);
anything the library itself raises is left to fail the test with its message.

Sources:
- flash-attn: ``flash_attn.flash_attn_func(q, k, v, dropout_p, softmax_scale, causal)``, layout
  (B, T, H, D), fp16/bf16, GQA when Hq is a multiple of Hkv; the causal mask is aligned
  bottom-right since version 2.1 (before: top-left, so Tq != Tk causal is refused).
- FlashInfer: ``flashinfer.single_prefill_with_kv_cache(q, k, v, causal, kv_layout="NHD",
  sm_scale)``, one request at a time, layout (T, H, D), causal bottom-right.
"""
from __future__ import annotations

import importlib

import torch

from inference_conformance.conformance.contracts.attention import validate

HALF = (torch.float16, torch.bfloat16)


def _version(module) -> tuple[int, ...]:
    text = getattr(module, "__version__", "0")
    parts = []
    for p in text.split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _need(q, what: str, dtypes=HALF, head_dims=None, D=None):
    if q.device.type != "cuda":
        raise NotImplementedError(f"{what} runs on CUDA only, got {q.device}")
    if q.dtype not in dtypes:
        raise NotImplementedError(f"{what} supports {[str(d) for d in dtypes]}, not {q.dtype}")
    if head_dims is not None and D not in head_dims:
        raise NotImplementedError(f"{what} supports head dims {sorted(head_dims)}, not {D}")


def flash_attn(q, k, v, *, causal: bool, scale: float):
    """The attention contract through ``flash_attn.flash_attn_func`` (Dao-AILab flash-attention)."""
    s = validate(q, k, v, causal, scale)
    fa = importlib.import_module("flash_attn")
    _need(q, "flash-attn")
    if s.D > 256:
        raise NotImplementedError(f"flash-attn supports head dims up to 256, not {s.D}")
    if causal and s.Tq != s.Tk and _version(fa) < (2, 1):
        raise NotImplementedError(f"flash-attn {fa.__version__} aligns the causal mask top-left (bottom-right since 2.1)")
    out = fa.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),  # (B, T, H, D)
                             dropout_p=0.0, softmax_scale=float(scale), causal=causal)
    return out.transpose(1, 2).contiguous()                                              # (B, Hq, Tq, D)


def flashinfer(q, k, v, *, causal: bool, scale: float):
    """The attention contract through ``flashinfer.single_prefill_with_kv_cache``, per request."""
    s = validate(q, k, v, causal, scale)
    fi = importlib.import_module("flashinfer")
    _need(q, "FlashInfer", head_dims={64, 128, 256}, D=s.D)
    outs = []
    for b in range(s.B):
        o = fi.single_prefill_with_kv_cache(q[b].transpose(0, 1).contiguous(),   # (Tq, Hq, D)
                                            k[b].transpose(0, 1).contiguous(),   # (Tk, Hkv, D)
                                            v[b].transpose(0, 1).contiguous(),
                                            causal=causal, kv_layout="NHD", sm_scale=float(scale))
        outs.append(o.transpose(0, 1))                                           # (Hq, Tq, D)
    return torch.stack(outs).contiguous()                                        # (B, Hq, Tq, D)
