"""The optimized built-ins of the ``mla_decode`` contract (claim KV-12): "torch", batched PyTorch
over the latent cache (:mod:`inference_conformance.optimized.mla_decode.vectorized`, which also
holds the host-side absorption both share), and "triton", the split-KV decode kernel over the
latent cache, contiguous and paged (:mod:`inference_conformance.optimized.mla_decode.split_kv`),
and "triton_invariant", its batch-invariant mode (the absorption row by row, splits of a fixed
size, the ordered merge; declared ``batch_invariant=True``, a mode of "triton"); and the adapter
of vLLM's Triton MLA decode, "vllm_triton_mla" (:mod:`inference_conformance.optimized.mla_decode.outside_vllm`,
where vLLM is installed).
"""
from __future__ import annotations


def implementations():
    """The torch and Triton implementations of the mla_decode contract (and the Triton kernel's
    batch-invariant mode)."""
    from inference_conformance.conformance.registry import builtin
    from inference_conformance.optimized.mla_decode import outside_vllm, split_kv, vectorized

    return (
        builtin("mla_decode", "torch", vectorized.mla_decode),
        builtin("mla_decode", "triton", split_kv.mla_decode, kernel_modules=(split_kv,)),
        builtin("mla_decode", "triton_invariant", split_kv.mla_decode_invariant, kernel_modules=(split_kv,),
                batch_invariant=True, mode_of="triton"),
        *outside_vllm.mla_registrations(),
    )
