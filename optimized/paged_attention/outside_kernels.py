"""Adapters for the paged decode kernels users compare against: vLLM's and FlashInfer's (the
``paged_attention`` contract; the dense ones are in
:mod:`inference_conformance.optimized.attention.outside_kernels`, whose device and dtype checks
these share).

They meet ``conformance/contracts/paged_attention/contract.py``::

    paged_attention(q, k_cache, v_cache, block_table, seq_lens, *, scale) -> Tensor
    q (B, Hq, D); k_cache, v_cache (num_blocks, block_size, Hkv, D); block_table (B, max_blocks)
    int32; seq_lens (B,) int32; returns (B, Hq, D)

Each translates the call into the outside library's layout; the registry marks them unavailable
where the library is missing, and a (dtype, head dim, block size) the library does not support
raises ``NotImplementedError`` (reported "unsupported", never a pass).

Sources:
- vLLM: ``vllm._custom_ops.paged_attention_v1(out, query, key_cache, value_cache, num_kv_heads,
  scale, block_tables, seq_lens, block_size, max_seq_len, alibi_slopes, kv_cache_dtype, k_scale,
  v_scale)``, key cache (num_blocks, Hkv, D/x, block_size, x) with x = 16 bytes / element size,
  value cache (num_blocks, Hkv, D, block_size); block sizes 8, 16, 32.
- FlashInfer paged decode: ``flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")``,
  ``plan(indptr, indices, last_page_len, Hq, Hkv, D, page_size, sm_scale=..., q_data_type=...)``
  then ``run(q, (k_cache, v_cache))``; NHD pages are (num_pages, page_size, Hkv, D), the
  contract's own layout, and a sequence's pages are ``indices[indptr[b]:indptr[b+1]]``.
"""
from __future__ import annotations

import importlib

import torch

from inference_conformance.conformance.contracts.paged_attention.validate import validate as validate_paged
from inference_conformance.optimized.attention import outside_kernels as dense


VLLM_BLOCK_SIZES = (8, 16, 32)
VLLM_HEAD_DIMS = (64, 80, 96, 112, 120, 128, 192, 256)


def vllm_paged(q, k_cache, v_cache, block_table, seq_lens, *, scale: float):
    """The paged_attention contract through vLLM's ``paged_attention_v1``: the contract's cache
    (num_blocks, block_size, Hkv, D) is laid out as vLLM's key cache (num_blocks, Hkv, D/x,
    block_size, x) and value cache (num_blocks, Hkv, D, block_size); the block table and the
    lengths are passed as they are."""
    s = validate_paged(q, k_cache, v_cache, block_table, seq_lens, scale)
    ops = importlib.import_module("vllm._custom_ops")
    dense._need(q, "vLLM paged attention", head_dims=set(VLLM_HEAD_DIMS), D=s.D)
    if s.block_size not in VLLM_BLOCK_SIZES:
        raise NotImplementedError(f"vLLM paged attention supports block sizes {VLLM_BLOCK_SIZES}, not {s.block_size}")
    x = 16 // q.element_size()
    nb, bs, Hkv, D = k_cache.shape
    key_cache = k_cache.reshape(nb, bs, Hkv, D // x, x).permute(0, 2, 3, 1, 4).contiguous()  # (nb, Hkv, D/x, bs, x)
    value_cache = v_cache.permute(0, 2, 3, 1).contiguous()                                  # (nb, Hkv, D, bs)
    out = torch.empty_like(q)                                                               # (B, Hq, D)
    one = torch.ones((), dtype=torch.float32, device=q.device)
    args = (out, q.contiguous(), key_cache, value_cache, Hkv, float(scale), block_table.contiguous(),
            seq_lens.contiguous(), bs, int(seq_lens.max()), None, "auto")
    try:
        ops.paged_attention_v1(*args, one, one)          # vLLM >= 0.6: k_scale, v_scale tensors
    except (TypeError, RuntimeError):
        ops.paged_attention_v1(*args, 1.0, 1.0)          # older: float scales
    return out


def flashinfer_paged(q, k_cache, v_cache, block_table, seq_lens, *, scale: float):
    """The paged_attention contract through FlashInfer's batch decode over NHD pages: the
    block table's live entries become FlashInfer's (indptr, indices, last_page_len)."""
    s = validate_paged(q, k_cache, v_cache, block_table, seq_lens, scale)
    fi = importlib.import_module("flashinfer")
    dense._need(q, "FlashInfer paged decode", head_dims={64, 128, 256}, D=s.D)
    lens = seq_lens.to(torch.int64)
    pages = (lens + s.block_size - 1) // s.block_size                                     # (B,)
    indptr = torch.zeros(s.B + 1, dtype=torch.int32, device=q.device)
    indptr[1:] = torch.cumsum(pages, 0).to(torch.int32)
    live = torch.arange(block_table.shape[1], device=q.device)[None, :] < pages[:, None]  # (B, max_blocks)
    indices = block_table[live].to(torch.int32)                                            # row-major: per sequence
    last_page_len = (lens - (pages - 1) * s.block_size).to(torch.int32)
    workspace = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=q.device)
    wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    wrapper.plan(indptr, indices, last_page_len, s.Hq, s.Hkv, s.D, s.block_size,
                 sm_scale=float(scale), q_data_type=q.dtype)
    return wrapper.run(q.contiguous(), (k_cache, v_cache))
