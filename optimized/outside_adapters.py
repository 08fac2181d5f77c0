"""Adapters for the kernels users compare against: flash-attn and FlashInfer prefill (the
``attention`` contract), vLLM's and FlashInfer's paged decode (the ``paged_attention`` contract).

The dense adapters meet ``conformance/contracts/attention.py``::

    attention(q, k, v, *, causal: bool, scale: float) -> Tensor
    q (B, Hq, Tq, D); k, v (B, Hkv, Tk, D); causal mask aligned bottom-right; returns (B, Hq, Tq, D)

the paged ones ``conformance/contracts/paged_attention.py``::

    paged_attention(q, k_cache, v_cache, block_table, seq_lens, *, scale) -> Tensor
    q (B, Hq, D); k_cache, v_cache (num_blocks, block_size, Hkv, D); block_table (B, max_blocks)
    int32; seq_lens (B,) int32; returns (B, Hq, D)

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

from inference_conformance.conformance.contracts.attention import validate
from inference_conformance.conformance.contracts.paged_attention_validate import validate as validate_paged

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


# ------------------------------------------------------------------------- paged decode


VLLM_BLOCK_SIZES = (8, 16, 32)
VLLM_HEAD_DIMS = (64, 80, 96, 112, 120, 128, 192, 256)


def vllm_paged(q, k_cache, v_cache, block_table, seq_lens, *, scale: float):
    """The paged_attention contract through vLLM's ``paged_attention_v1``: the contract's cache
    (num_blocks, block_size, Hkv, D) is laid out as vLLM's key cache (num_blocks, Hkv, D/x,
    block_size, x) and value cache (num_blocks, Hkv, D, block_size); the block table and the
    lengths are passed as they are."""
    s = validate_paged(q, k_cache, v_cache, block_table, seq_lens, scale)
    ops = importlib.import_module("vllm._custom_ops")
    _need(q, "vLLM paged attention", head_dims=set(VLLM_HEAD_DIMS), D=s.D)
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
    _need(q, "FlashInfer paged decode", head_dims={64, 128, 256}, D=s.D)
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


# --------------------------------------------------------------- weight-only quantization
class TorchaoWeightOnly:
    """The quantization contract through torchao's weight-only quantization on a Linear layer
    (``torchao.quantization.quantize_``): ``"int8"`` is ``Int8WeightOnlyConfig`` (8 bits, one
    scale per output channel), ``"intx"`` is ``IntxWeightOnlyConfig(weight_dtype=torch.int<b>,
    granularity=PerGroup(g) | PerAxis(0))`` (2..8 bits, per channel or in groups; its CPU
    path). Both are symmetric (absmax with the range [-2^(b-1), 2^(b-1) - 1], a step of
    max|w| / (2^(b-1) - 1/2), within the contract's). QW is the quantized Linear; ``dequantize``
    is its weight's ``dequantize()``, ``matmul`` the Linear's forward. torchao's int4 path
    (``Int4WeightOnlyConfig``) needs CUDA kernels and is not adapted here. Refused
    (NotImplementedError): float64, granularity "tensor", and for ``"int8"`` anything but 8
    bits per channel."""

    symmetric = True

    def __init__(self, kind: str):
        self.kind = kind

    def _config(self, bits: int, granularity):
        from torchao.quantization import Int8WeightOnlyConfig, IntxWeightOnlyConfig
        from torchao.quantization.granularity import PerAxis, PerGroup

        if self.kind == "int8":
            if bits != 8 or granularity != "channel":
                raise NotImplementedError(f"torchao Int8WeightOnlyConfig is 8 bits per channel, not {bits} bits, "
                                          f"granularity {granularity!r}")
            return Int8WeightOnlyConfig()
        if granularity == 1:
            raise NotImplementedError("torchao's PerGroup(1) fails inside choose_qparams (a reshape error)")
        gran = PerAxis(0) if granularity == "channel" else PerGroup(int(granularity))
        return IntxWeightOnlyConfig(weight_dtype=getattr(torch, f"int{bits}"), granularity=gran,
                                    scale_dtype=torch.float32)

    def quantize(self, w, *, bits, granularity):
        from inference_conformance.conformance.contracts.quantization import validate_quantize

        shape = validate_quantize(w, bits, granularity)
        if w.dtype == torch.float64:
            raise NotImplementedError("torchao's weight-only quantization takes float32, float16, bfloat16, not float64")
        if granularity == "tensor":
            raise NotImplementedError("torchao's weight-only quantization has no per-tensor granularity")
        ao = importlib.import_module("torchao.quantization")
        lin = torch.nn.Linear(shape.K, shape.N, bias=False, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            lin.weight.copy_(w)
        ao.quantize_(lin, self._config(shape.bits, granularity))
        lin.contract_shape = (shape.N, shape.K, w.dtype)
        return lin

    @staticmethod
    def _check(qw) -> torch.nn.Linear:
        if not isinstance(qw, torch.nn.Linear) or not hasattr(qw, "contract_shape"):
            raise TypeError(f"qw must be the quantized Linear this adapter's quantize returned, got {type(qw).__name__}")
        return qw

    def dequantize(self, qw):
        qw = self._check(qw)
        return qw.weight.dequantize().to(qw.contract_shape[2])

    def matmul(self, x, qw):
        from inference_conformance.conformance.contracts.quantization import validate_matmul

        qw = self._check(qw)
        N, K, dtype = qw.contract_shape
        validate_matmul(x, K=K, dtype=dtype, device=qw.weight.device)
        with torch.no_grad():
            return qw(x)

    def __repr__(self) -> str:
        return f"inference_conformance.optimized.outside_adapters.TorchaoWeightOnly({self.kind!r})"


torchao_int8 = TorchaoWeightOnly("int8")
torchao_intx = TorchaoWeightOnly("intx")
