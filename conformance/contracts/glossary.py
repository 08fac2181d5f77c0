"""The suite's one vocabulary: every contract, kernel, reference, law and benchmark uses these names
for sizes and objects, in code, shape comments and docstrings.

Sizes (single letters are sizes, never two things):

=============  ==============================================================================
``B``          batch: sequences (requests) in one call
``Hq``         query heads (``n_heads`` in a model config)
``Hkv``        key/value heads (``n_kv_heads``); Hq is a multiple of Hkv
``G``          group size of grouped-query attention, Hq // Hkv (GQA; G = 1 is MHA, Hkv = 1 MQA)
``D``          head dim (``head_dim``; a model's ``hd``); ``Dv`` where values differ (MLA)
``Tq``         query length of one call (1 for a decode step)
``Tk``         key length: cached tokens a query may attend
``T``          sequence length where queries and keys coincide (prefill, full forward)
``S``          padded prompt length of a prefill batch; ``S_max`` the cache's max_seq_len
``L``          layers
``d_model``    model width (the residual stream); ``d_ff`` the MLP's hidden width
``V``          vocabulary size (the tokenizer's); ``V_out`` >= V the rows of an output matrix padded past it
``M, N, K``    a matmul (M, K) @ (K, N) (quantized weights: W is (N, K))
``C``          MLA's latent dim: the compressed KV cached per token (DeepSeek-V2: 512)
``R``          MLA's decoupled RoPE dim: the RoPE key cached per token beside the latent (64)
=============  ==============================================================================

Objects of paged attention (vLLM's terms; Kwon et al. 2023):

``block_size``   tokens per KV block (a page); ``num_blocks`` blocks in the pool
``block_table``  (B, max_blocks) int32: logical block i of sequence b is physical block
                 ``block_table[b, i]``
``slot_mapping`` (num_tokens,) int64: the flat slot ``block * block_size + offset`` each new
                 token's K/V is written to
``seq_lens``     (B,) int32: tokens cached per sequence

Speculative decoding (Leviathan et al. 2023; lecture 002): target distribution ``p``, draft
distribution ``q``, ``γ`` (``gamma``) draft tokens per round, acceptance rate ``α`` (``alpha``).

Quantization: ``bits``, ``group_size`` (weights per scale along K), ``absmax`` scaling,
``scale`` / ``zero_point``; granularity "tensor", "channel" or a group size.

One documented exception: the analytic models of the lectures (``reference/roofline/__init__.py``,
``reference/roofline/perf_model.py``) keep CS336's letters (D model dim, F MLP dim, N/K query/KV heads,
H head dim, S context) so that every formula reads as the lecture prints it; their docstrings say so.

Tensors under test: ``out`` (the implementation's output), ``out_ref`` (the float64 reference),
``out_pt`` (the naive reference computation in the output's dtype). Triton kernels: ``*_ptr`` pointers,
``stride_*`` strides, UPPER_CASE constexpr (``BLOCK_M``, ``BLOCK_N``, ``BLOCK_D``).
"""
from __future__ import annotations

#: size name -> meaning (the table above, for tools and tests)
SIZES = {
    "B": "batch: sequences (requests) in one call",
    "Hq": "query heads",
    "Hkv": "key/value heads",
    "G": "group size, Hq // Hkv",
    "D": "head dim",
    "Dv": "value head dim where it differs from D",
    "Tq": "query length of one call",
    "Tk": "key length",
    "T": "sequence length where queries and keys coincide",
    "S": "padded prompt length of a prefill batch",
    "S_max": "max_seq_len of a cache",
    "L": "layers",
    "d_model": "model width",
    "d_ff": "MLP hidden width",
    "V": "vocabulary size",
    "V_out": "rows of a model's output matrix: V padded to a multiple of 64 or 128 (V_out >= V)",
    "M": "rows of a matmul's activations x (M, K)",
    "N": "output features of a matmul: rows of a Linear weight W (N, K)",
    "K": "the reduction dimension of a matmul (input features of W)",
    "C": "MLA's latent dim (the compressed KV cached per token)",
    "R": "MLA's decoupled RoPE dim (the RoPE key cached per token)",
}
