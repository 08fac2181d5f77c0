"""The "torch" implementation of the attention contract: ``scaled_dot_product_attention``.

PyTorch's ``is_causal=True`` aligns the mask top-left, so when Tq != Tk the contract's
bottom-right causal mask is passed explicitly as a boolean ``attn_mask``; when Tq == Tk the two
agree and ``is_causal=True`` lets PyTorch pick its fused (flash / memory-efficient) kernels,
except for a scale <= 0: on CPU, ``is_causal=True`` with a negative scale returns NaN (float64,
float32) or wrong values (bfloat16) in torch 2.11 and 2.13, while the same call with the explicit
boolean mask is right, so those calls pass the mask.
Grouped-query attention uses ``enable_gqa`` (torch >= 2.5) or ``repeat_interleave`` before.
The options (FA-8): a ``window`` alone is a boolean mask (:func:`window_mask`) handed to SDPA; a
``softcap`` or ``sinks`` need the scores, which SDPA does not expose, so those calls compute them
in one vectorized pass (float32 scores for 16-bit inputs, as the contract says): c·tanh(s/c),
the mask, then the softmax normalised by logsumexp over the scores and the sink.
"""
from __future__ import annotations

import functools
import inspect
import math

import torch
import torch.nn.functional as F

from inference_conformance.conformance.contracts.attention import validate, window_mask


@functools.lru_cache(maxsize=1)
def _has_enable_gqa() -> bool:
    try:
        return "enable_gqa" in inspect.signature(F.scaled_dot_product_attention).parameters
    except (TypeError, ValueError):  # builtins without a signature: parse the docstring
        return "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")


def _scores_attention(q, k, v, shape, causal, scale, window, softcap, sinks):
    """The options' path of :func:`attention`: (B, Hq, Tq, D) in q's dtype, computed in float32
    (float64 for float64 inputs) from the (B, Hkv, G, Tq, Tk) scores."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    qg = q.to(acc).unflatten(1, (shape.Hkv, shape.group))                  # (B, Hkv, G, Tq, D)
    s = torch.einsum("bhgqd,bhkd->bhgqk", qg, k.to(acc)) * scale             # (B, Hkv, G, Tq, Tk)
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    if causal:
        s = s.masked_fill(~window_mask(shape.Tq, shape.Tk, window, q.device), -math.inf)
    lse = torch.logsumexp(s, dim=-1, keepdim=True)                          # (B, Hkv, G, Tq, 1)
    if sinks is not None:
        sink = sinks.to(acc).reshape(1, shape.Hkv, shape.group, 1, 1)
        lse = torch.logaddexp(lse, sink)
    out = torch.einsum("bhgqk,bhkd->bhgqd", torch.exp(s - lse), v.to(acc))
    return out.flatten(1, 2).to(q.dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
              scale: float, window: int | None = None, softcap: float | None = None,
              sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Attention by ``torch.nn.functional.scaled_dot_product_attention``.

    q (B, Hq, Tq, D); k, v (B, Hkv, Tk, D) -> (B, Hq, Tq, D) in q's dtype. Causal masks are
    bottom-right aligned (the contract's :func:`causal_mask`); ``window`` / ``softcap`` /
    ``sinks`` as the contract defines them (FA-8). Raises as
    :func:`inference_conformance.conformance.contracts.attention.validate`.
    """
    shape = validate(q, k, v, causal, scale, window, softcap, sinks)
    if softcap is not None or sinks is not None:
        return _scores_attention(q, k, v, shape, causal, scale, window, softcap, sinks)
    kwargs = {}
    if shape.group > 1:
        if _has_enable_gqa():
            kwargs["enable_gqa"] = True
        else:
            k = k.repeat_interleave(shape.group, dim=1)  # (B, Hq, Tk, D)
            v = v.repeat_interleave(shape.group, dim=1)
    if causal and shape.Tq == shape.Tk and scale > 0 and window is None:  # is_causal: wrong for scale < 0 on CPU
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=float(scale), **kwargs)
    mask = window_mask(shape.Tq, shape.Tk, window, q.device) if causal else None  # (Tq, Tk) bool
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=float(scale), **kwargs)


def implementations():
    """The optimized attention implementations and the adapters of the kernels users compare
    against (flash-attn, FlashInfer: CUDA only; flex_attention, SDPA per CPU backend, JAX, ONNX
    Runtime: optimized/attention/outside.py), unavailable where their library is missing."""
    from inference_conformance.conformance.registry import builtin
    from inference_conformance.optimized.attention import flash_attention
    from inference_conformance.optimized.attention import flash_decoding
    from inference_conformance.optimized.attention import outside_kernels as outside_adapters
    from inference_conformance.optimized.attention import outside as oa
    from inference_conformance.optimized.attention import outside_vllm

    return (
        builtin("attention", "triton", flash_attention.attention, kernel_modules=(flash_attention,)),
        builtin("attention", "triton_splitkv", flash_decoding.attention,
                kernel_modules=(flash_decoding,)),
        builtin("attention", "triton_splitkv_invariant", flash_decoding.attention_invariant,
                kernel_modules=(flash_decoding,), batch_invariant=True, mode_of="triton_splitkv"),
        builtin("attention", "torch", attention),
        builtin("attention", "flash_attn", outside_adapters.flash_attn, requires={"cuda"}, needs="flash_attn",
                adapter=True),
        builtin("attention", "flashinfer", outside_adapters.flashinfer, requires={"cuda"}, needs="flashinfer",
                adapter=True),
        # CPU libraries (optimized/attention/outside.py; requirements/peers-libs.txt, tox -e peers-libs)
        builtin("attention", "flex_attention", oa.flex_attention, adapter=True, peer="libs"),
        builtin("attention", "sdpa_math", oa.sdpa_math, requires={"cpu"}, adapter=True, peer="libs"),
        builtin("attention", "sdpa_flash_cpu", oa.sdpa_flash_cpu, requires={"cpu"}, adapter=True, peer="libs"),
        builtin("attention", "jax", oa.jax_attention, needs="jax", adapter=True, peer="libs"),
        builtin("attention", "ort_attention", oa.ort_attention, needs="onnxruntime", adapter=True, peer="libs"),
        builtin("attention", "ort_mha", oa.ort_mha, needs="onnxruntime", adapter=True, peer="libs"),
        builtin("attention", "ort_gqa", oa.ort_gqa, needs="onnxruntime", adapter=True, peer="libs"),
        *outside_vllm.attention_registrations(),
    )
