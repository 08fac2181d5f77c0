"""Adapters of vLLM's dense Triton kernels, interpreted on a CPU (``TRITON_INTERPRET=1``), to the
``attention`` contract: ``unified_attention`` (prefill, or decode at Tq = 1) and
``context_attention_fwd`` (prefix prefill). The import of vLLM, its Triton backend checks and the
one ``unified_attention`` call are :mod:`inference_conformance.optimized.vllm_shared`'s, the
sources listed in :mod:`inference_conformance.optimized.paged_attention.outside_vllm` (the paged
adapters); the environment is ``requirements/peers-vllm.txt`` (``tox -e peers-vllm``).

Contract (``conformance/contracts/attention.py``)::

    attention(q, k, v, *, causal, scale) -> (B, Hq, Tq, D)
        q (B, Hq, Tq, D); k, v (B, Hkv, Tk, D); causal aligned bottom-right (claims FA-3, FA-7)

``triton_unified_attention`` also takes FA-8's options, as ``unified_attention`` names them in
vLLM's source (``vllm/v1/attention/ops/triton_unified_attention.py``): the window as
``window_size=(W - 1, 0)`` (its kernel reads SLIDING_WINDOW = 1 + window_size[0] and masks the
keys with query position − key position >= SLIDING_WINDOW), the cap as ``softcap`` (> 0 turns it
on) and the sinks as ``sinks`` (one float32 logit per query head, the softmax's initial max with
a sum of 1). Untested here: vLLM is not installed in this environment; the signature was read
from vLLM's source, and the peers-vllm job runs it.
"""
from __future__ import annotations

import sys

import torch

from inference_conformance.conformance.contracts.attention import validate as validate_dense
from inference_conformance.optimized.vllm_shared import (
    require_triton,
    require_triton_backend,
    unified_attention,
    vllm_module,
)

#: Block size of the paged cache the dense adapters cut K/V into (a multiple of 16).
DENSE_BLOCK_SIZE = 16


def _dense_support(what: str, q, s) -> None:
    """Refuse (NotImplementedError) what vLLM's Triton backend does not declare for ``q`` in
    DENSE_BLOCK_SIZE-token blocks, and Tq > Tk (a request's queries are a suffix of its sequence)."""
    require_triton_backend(what, q.dtype, s.D, DENSE_BLOCK_SIZE)
    if s.Tq > s.Tk:
        raise NotImplementedError(f"{what}: a request's queries are the last tokens of its sequence, "
                                  f"so Tq <= Tk (got Tq={s.Tq}, Tk={s.Tk})")
    require_triton(what)


def triton_unified_attention(q, k, v, *, causal: bool, scale: float, window: int | None = None,
                             softcap: float | None = None, sinks: torch.Tensor | None = None):
    """The attention contract through vLLM's Triton ``unified_attention`` (prefill, or decode at
    Tq = 1): each batch row is one request whose Tq queries are the last of its Tk tokens, its
    K/V cut into a paged cache of DENSE_BLOCK_SIZE-token blocks (zero past Tk, an identity block
    table). q (B, Hq, Tq, D); k, v (B, Hkv, Tk, D) -> (B, Hq, Tq, D) (claims FA-3, FA-7);
    ``window``, ``softcap``, ``sinks`` as vLLM's own arguments (FA-8, untested here). Raises
    TypeError / ValueError as the contract's ``validate``; NotImplementedError for float64,
    bfloat16 under the interpreter, and Tq > Tk (vLLM's queries are a suffix of their sequence)."""
    s = validate_dense(q, k, v, causal, scale, window, softcap, sinks)
    what = "vLLM's Triton unified attention"
    _dense_support(what, q, s)
    bs = DENSE_BLOCK_SIZE
    nblk = -(-s.Tk // bs)
    cache_shape = (s.B, nblk * bs, s.Hkv, s.D)
    kc = torch.zeros(cache_shape, dtype=q.dtype, device=q.device)
    vc = torch.zeros(cache_shape, dtype=q.dtype, device=q.device)
    kc[:, :s.Tk] = k.transpose(1, 2)                                            # (B, Tk, Hkv, D)
    vc[:, :s.Tk] = v.transpose(1, 2)
    kc = kc.view(s.B * nblk, bs, s.Hkv, s.D)                                    # (num_blocks, bs, Hkv, D)
    vc = vc.view(s.B * nblk, bs, s.Hkv, s.D)
    table = torch.arange(s.B * nblk, dtype=torch.int32, device=q.device).view(s.B, nblk)
    lens = torch.full((s.B,), s.Tk, dtype=torch.int32, device=q.device)
    cu = torch.arange(0, s.B * s.Tq + 1, s.Tq, dtype=torch.int32, device=q.device)
    q_tokens = q.transpose(1, 2).reshape(s.B * s.Tq, s.Hq, s.D)                # (B·Tq, Hq, D)
    out = unified_attention(q_tokens, kc, vc, table, lens, cu, s.Tq, causal=causal, scale=scale, window=window,
                            softcap=softcap, sinks=sinks)
    return out.view(s.B, s.Tq, s.Hq, s.D).transpose(1, 2).contiguous()


def triton_prefix_prefill(q, k, v, *, causal: bool, scale: float):
    """The attention contract through vLLM's Triton ``context_attention_fwd`` (prefix prefill):
    each batch row is one request whose first Tk − Tq tokens are its cached context, laid out as
    vLLM's key cache (num_blocks, Hkv, D/x, block_size, x) with x = 16 bytes / element size and
    value cache (num_blocks, Hkv, D, block_size) in DENSE_BLOCK_SIZE-token blocks (identity block
    table), and whose last Tq tokens are the new ones, packed (B·Tq, H, D) beside their K/V.
    q (B, Hq, Tq, D); k, v (B, Hkv, Tk, D) -> (B, Hq, Tq, D) (claims FA-3, FA-7). Raises
    TypeError / ValueError as the contract's ``validate``; NotImplementedError for float64,
    bfloat16 under the interpreter, head sizes vLLM's Triton backend does not list, Tq > Tk."""
    s = validate_dense(q, k, v, causal, scale)
    what = "vLLM's Triton prefix prefill"
    _dense_support(what, q, s)
    pp = vllm_module("vllm.v1.attention.ops.prefix_prefill")
    bs, x = DENSE_BLOCK_SIZE, 16 // q.element_size()
    if s.D % x:
        raise NotImplementedError(f"{what}: its key cache splits D into chunks of x = {x}; D = {s.D} is not a multiple")
    ctx = s.Tk - s.Tq
    nblk = max(1, -(-ctx // bs))
    kc = torch.zeros((s.B, nblk * bs, s.Hkv, s.D), dtype=q.dtype, device=q.device)
    vc = torch.zeros_like(kc)
    kc[:, :ctx] = k[:, :, :ctx].transpose(1, 2)                                  # (B, ctx, Hkv, D)
    vc[:, :ctx] = v[:, :, :ctx].transpose(1, 2)
    k_cache = (kc.view(s.B * nblk, bs, s.Hkv, s.D // x, x).permute(0, 2, 3, 1, 4)
               .contiguous())                                                   # (nb, Hkv, D/x, bs, x)
    v_cache = vc.view(s.B * nblk, bs, s.Hkv, s.D).permute(0, 2, 3, 1).contiguous()  # (nb, Hkv, D, bs)
    table = torch.arange(s.B * nblk, dtype=torch.int32, device=q.device).view(s.B, nblk)

    def packed(t):                                                              # (B, H, T, D) -> (B·T, H, D)
        return t.transpose(1, 2).reshape(-1, t.shape[1], s.D).contiguous()

    q_new, k_new, v_new = packed(q), packed(k[:, :, ctx:]), packed(v[:, :, ctx:])
    out = torch.empty_like(q_new)
    one = torch.ones((), dtype=torch.float32, device=q.device)
    pp.context_attention_fwd(q_new, k_new, v_new, out, "auto", k_cache, v_cache, table,
                             torch.arange(0, s.B * s.Tq + 1, s.Tq, dtype=torch.int32, device=q.device),
                             torch.full((s.B,), s.Tk, dtype=torch.int32, device=q.device), s.Tk, s.Tq, one, one,
                             sm_scale=float(scale), causal=causal)
    return out.view(s.B, s.Tq, s.Hq, s.D).transpose(1, 2).contiguous()


def attention_registrations():
    """The attention adapters ``vllm_triton_unified`` and ``vllm_triton_prefix_prefill`` (Triton,
    interpreted on a CPU)."""
    from inference_conformance.conformance.registry import builtin

    kernels = (sys.modules[__name__],)   # the module whose calls launch vLLM's Triton kernels
    return (builtin("attention", "vllm_triton_unified", triton_unified_attention, needs="vllm", adapter=True,
                    kernel_modules=kernels),
            builtin("attention", "vllm_triton_prefix_prefill", triton_prefix_prefill, needs="vllm", adapter=True,
                    kernel_modules=kernels))
