"""Adapters for the kernels users compare against: flash-attn, FlashInfer, vLLM paged attention.

Each adapter meets the ``attention`` contract (``conformance/contracts/attention.py``)::

    attention(q, k, v, *, causal: bool, scale: float) -> Tensor
    q (B, Hq, Tq, D); k, v (B, Hkv, Tk, D); causal mask aligned bottom-right; returns (B, Hq, Tq, D)

and translates the call into the outside library's layout. The contract lists them with the
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
- vLLM: ``vllm._custom_ops.paged_attention_v1`` (decode, Tq = 1) over a paged KV cache built
  here with a random block table (blocks of 16, key cache (blocks, Hkv, D/x, 16, x) with x = 16
  bytes / element size, value cache (blocks, Hkv, D, 16)).
"""
from __future__ import annotations

import importlib

import torch

from conformance.contracts.attention import validate

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


VLLM_BLOCK = 16


def vllm_paged(q, k, v, *, causal: bool, scale: float):
    """The attention contract's decode case (Tq = 1) through vLLM's ``paged_attention_v1``,
    over a paged cache whose block table is a random permutation (so ignoring it shows)."""
    s = validate(q, k, v, causal, scale)
    ops = importlib.import_module("vllm._custom_ops")
    _need(q, "vLLM paged attention", head_dims={64, 80, 96, 112, 120, 128, 192, 256}, D=s.D)
    if s.Tq != 1:
        raise NotImplementedError(f"vLLM paged_attention_v1 decodes one query token, got Tq={s.Tq}")
    B, Hq, Hkv, Tk, D = s.B, s.Hq, s.Hkv, s.Tk, s.D
    x = 16 // q.element_size()
    per_seq = -(-Tk // VLLM_BLOCK)
    n_blocks = 3 * B * per_seq
    g = torch.Generator().manual_seed(0)
    table = torch.randperm(n_blocks, generator=g)[: B * per_seq].view(B, per_seq)  # (B, blocks per seq)
    key_cache = torch.full((n_blocks, Hkv, D // x, VLLM_BLOCK, x), float("nan"), dtype=q.dtype, device=q.device)
    value_cache = torch.full((n_blocks, Hkv, D, VLLM_BLOCK), float("nan"), dtype=q.dtype, device=q.device)
    for b in range(B):
        for j in range(per_seq):
            lo, hi = j * VLLM_BLOCK, min(Tk, (j + 1) * VLLM_BLOCK)
            blk = int(table[b, j])
            kb = k[b, :, lo:hi]                                                     # (Hkv, n, D)
            key_cache[blk, :, :, : hi - lo, :] = kb.reshape(Hkv, hi - lo, D // x, x).permute(0, 2, 1, 3)
            value_cache[blk, :, :, : hi - lo] = v[b, :, lo:hi].transpose(1, 2)      # (Hkv, D, n)
    query = q[:, :, 0, :].contiguous()                                              # (B, Hq, D)
    out = torch.empty_like(query)
    seq_lens = torch.full((B,), Tk, dtype=torch.int32, device=q.device)
    one = torch.ones((), dtype=torch.float32, device=q.device)
    args = (out, query, key_cache, value_cache, Hkv, float(scale), table.to(q.device, torch.int32), seq_lens,
            VLLM_BLOCK, Tk, None, "auto")
    try:
        ops.paged_attention_v1(*args, one, one)          # vLLM >= 0.6: k_scale, v_scale tensors
    except (TypeError, RuntimeError):
        ops.paged_attention_v1(*args, 1.0, 1.0)          # older: float scales
    return out.unsqueeze(2)                                                         # (B, Hq, 1, D)
