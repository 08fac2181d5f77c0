"""The "torch" implementation of the attention contract: ``scaled_dot_product_attention``.

PyTorch's ``is_causal=True`` aligns the mask top-left, so when Tq != Tk the contract's
bottom-right causal mask is passed explicitly as a boolean ``attn_mask``; when Tq == Tk the two
agree and ``is_causal=True`` lets PyTorch pick its fused (flash / memory-efficient) kernels,
except for a scale <= 0: on CPU, ``is_causal=True`` with a negative scale returns NaN (float64,
float32) or wrong values (bfloat16) in torch 2.11 and 2.13, while the same call with the explicit
boolean mask is right, so those calls pass the mask.
Grouped-query attention uses ``enable_gqa`` (torch >= 2.5) or ``repeat_interleave`` before.
"""
from __future__ import annotations

import functools
import inspect

import torch
import torch.nn.functional as F

from inference_conformance.conformance.contracts.attention import causal_mask, validate


@functools.lru_cache(maxsize=1)
def _has_enable_gqa() -> bool:
    try:
        return "enable_gqa" in inspect.signature(F.scaled_dot_product_attention).parameters
    except (TypeError, ValueError):  # builtins without a signature: parse the docstring
        return "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
              scale: float) -> torch.Tensor:
    """Attention by ``torch.nn.functional.scaled_dot_product_attention``.

    q (B, Hq, Tq, D); k, v (B, Hkv, Tk, D) -> (B, Hq, Tq, D) in q's dtype. Causal masks are
    bottom-right aligned (the contract's :func:`causal_mask`). Raises as
    :func:`inference_conformance.conformance.contracts.attention.validate`.
    """
    shape = validate(q, k, v, causal, scale)
    kwargs = {}
    if shape.group > 1:
        if _has_enable_gqa():
            kwargs["enable_gqa"] = True
        else:
            k = k.repeat_interleave(shape.group, dim=1)  # (B, Hq, Tk, D)
            v = v.repeat_interleave(shape.group, dim=1)
    if causal and shape.Tq == shape.Tk and scale > 0:  # is_causal is wrong for scale < 0 on CPU
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=float(scale), **kwargs)
    mask = causal_mask(shape.Tq, shape.Tk, q.device) if causal else None  # (Tq, Tk) bool
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
