"""Laws of MLA decode over the latent cache (claim KV-12; DeepSeek-V2 §2.1, CS336 lecture 10 part 3).

KV-12: an MLA decode kernel over the latent cache (C + R values per token, the key up-projection
absorbed into the query, the output in the latent space) equals attention over the materialised
keys and values (KV-7), contiguous and paged. The law and its zoo tests are in ``laws.py``;
here, besides the coverage table of its pinned examples:
DeepSeek's production shape (16 heads of a tensor-parallel rank, D = 128, C = 512, R = 64, blocks
of 64 tokens), and the bridge to KV-7's model: one decode step of the reference MLA layer
(``inference_conformance.reference.kv_cache``), whose latent and RoPE key are the cache and whose
query is split into its no-RoPE and RoPE parts, gives through each implementation and W_uv, W_o
the layer's output over materialised K and V.
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.conformance import results
from inference_conformance.conformance.outcomes import Unsupported
from inference_conformance.conformance.tolerance import assert_close, assert_exact
from inference_conformance.properties import strategies
from inference_conformance.properties.mla_decode.laws import KV12
from inference_conformance.properties.mla_decode.cases import (
    EXAMPLES,
    MLACase,
    call,
    case,
    check_against_materialised,
    make_inputs,
    paged,
)
from inference_conformance.reference import kv_cache as kvv
from inference_conformance.reference.transformer import apply_rope

#: tiny tensors: one intra-op thread is fastest and avoids OpenMP spin-waits between xdist workers
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.claim("KV-12")
@pytest.mark.suite_own("the suite's pinned examples reach every boundary class")
def test_kv12_coverage_table():
    """The boundary classes each pinned example reaches (every profile runs them)."""
    KV12.record_pinned_coverage("every class of the contract is reached in every Hypothesis profile")


# ----------------------------------------------- production-sized shapes, beyond the drawn ones
#: DeepSeek-V2/V3's MLA at one tensor-parallel rank of 8 (128 / 8 = 16 heads): D = 128, C = 512,
#: R = 64, paged in blocks of 64 (FlashMLA's) and contiguous, a batch of lengths past a block,
#: one past a tile and one token.
PRODUCTION_CASES = {
    "deepseek-Hq16-paged-bs64": case((300, 65, 1), 16, 128, 512, 64, 64, num_splits=3),
    "deepseek-Hq16-contiguous": case((129, 40), 16, 128, 512, 64, None),
}


@pytest.mark.technique("mla_decode")
@pytest.mark.claim("KV-12")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", list(PRODUCTION_CASES))
def test_kv12_production_shapes(impl, device, dtype, name):
    c = PRODUCTION_CASES[name]
    inp = make_inputs(c, 23, dtype, device)
    check_against_materialised(call(impl, inp, c), inp, c, what=f"MLA decode at {name}")


@pytest.mark.technique("mla_decode")
@pytest.mark.claim("KV-12")
@pytest.mark.parametrize("name", ["example-0", "example-2-large", "deepseek-Hq16-paged-bs64"])
@pytest.mark.suite_own("the suite's Triton kernel's GPU 16-bit path (its internals)")
def test_kv12_triton_gpu_16bit_path(device, name):
    """The Triton kernel's GPU 16-bit path (the absorbed query cast to the cache's dtype, P cast
    before P·C), forced on for float16 wherever the kernel runs, so that the interpreter checks it
    too, by the contract's 16-bit rule."""
    split_kv = pytest.importorskip("inference_conformance.optimized.mla_decode.split_kv")
    c = {"example-0": EXAMPLES[0], "example-2-large": EXAMPLES[2], **PRODUCTION_CASES}[name]
    inp = make_inputs(c, 3, torch.float16, device)
    saved, split_kv.NATIVE_FLOAT16_OVERRIDE = split_kv.NATIVE_FLOAT16_OVERRIDE, True
    try:
        out = split_kv.mla_decode(*inp.args(), scale=c.scale, rope_theta=c.rope_theta, num_splits=c.num_splits)
    finally:
        split_kv.NATIVE_FLOAT16_OVERRIDE = saved
    check_against_materialised(out, inp, c, what=f"Triton MLA decode, 16-bit GPU path, {name}")


# ------------------------------------------------------------ the bridge to KV-7's MLA layer
@pytest.mark.technique("mla_decode")
@pytest.mark.claim("KV-12")
@pytest.mark.parametrize("block_size", [None, 3], ids=["contiguous", "paged-bs3"])
def test_kv12_layer_decode_equals_kv7_materialised(impl, device, block_size):
    """The last token of KV-7's reference MLA layer (``mla_materialized``: every head's K and V
    materialised, causal) equals, in float64, the implementation's latent output for that token
    times W_uv[h] W_o[h], summed over heads: the cache holds the layer's latents x W_dkv and its
    RoPE keys rotated at their positions, the query its no-RoPE part x W_q[h] and RoPE part
    x W_qr[h] (unrotated)."""
    cfg = kvv.MLAConfig(d_model=16, heads=4, head_dim=8, latent=6, rope_dim=4)
    w = kvv.mla_weights(cfg, 5)
    T = 23
    x = strategies.randn((T, cfg.d_model), 7)
    want = kvv.mla_materialized(x, w, cfg)[-1]                                   # (d_model,)
    from inference_conformance.reference.transformer import rope_tables

    cos, sin = rope_tables(cfg.rope_dim, torch.arange(T), cfg.rope_theta, torch.float64)
    k_rope = apply_rope((x @ w["w_kr"])[None, None], cos, sin)[0, 0]            # (T, R)
    tokens = torch.cat([x @ w["w_dkv"], k_rope], -1)[None]                      # (1, T, C + R)
    table = None
    if block_size is not None:
        tokens, table = paged(tokens, (T,), block_size, 3)
        table = table.to(device)
    q_nope = torch.einsum("d,ndh->nh", x[-1], w["w_q"])[None]                   # (1, N, H)
    q_rope = torch.einsum("d,ndr->nr", x[-1], w["w_qr"])[None]                  # (1, N, R)
    c = MLACase((T,), cfg.heads, cfg.head_dim, cfg.latent, cfg.rope_dim, block_size,
                (cfg.head_dim + cfg.rope_dim) ** -0.5, rope_theta=cfg.rope_theta)
    with_device = [t.to(device) for t in (q_nope, q_rope, w["w_uk"], tokens)]
    from inference_conformance.properties.mla_decode.cases import MLAInputs

    inp = MLAInputs(*with_device, table, torch.tensor([T], dtype=torch.int32, device=device))
    out = call(impl, inp, c)                                                    # (1, N, C)
    got = torch.einsum("nc,nch,nhd->d", out[0].cpu(), w["w_uv"], w["w_o"])
    v = assert_close(got, want, what="KV-12: latent decode x W_uv W_o vs KV-7's materialised layer")
    results.record("KV-12", measured=v.error, bound=v.bound, unit="max |absorbed latent decode - materialised|",
                   rule=f"float64, the last of {T} tokens of KV-7's MLA layer, "
                        f"{'contiguous' if block_size is None else f'paged, blocks of {block_size}'}")


# ------------------------------------------------------------------------- calls of every impl
@pytest.mark.technique("mla_decode")
def test_outputs_do_not_alias_across_calls(impl, device):
    """A second call must not overwrite the first call's output (a reused workspace would)."""
    c = case((9, 20), 4, 8, 12, 4, 4, num_splits=2)
    inp = make_inputs(c, 5, torch.float32, device)
    out1 = call(impl, inp, c)
    kept = out1.clone()
    other = make_inputs(c, 6, torch.float32, device)
    call(impl, other, c)
    assert_exact(out1, kept, what="the first output after a second call")


@pytest.mark.technique("mla_decode")
@pytest.mark.claim("KV-12")
def test_kv12_strided_inputs(impl, device):
    """Any strides: q_nope and q_rope as column slices of one (B, Hq, D + R) projection, a cache of
    every other block of a wider pool and a column slice of a wider block table."""
    c = case((21, 6), 4, 8, 12, 4, 3)
    inp = make_inputs(c, 9, torch.float32, device)
    q = torch.cat([inp.q_nope, inp.q_rope], -1)
    wide_cache = torch.stack([inp.cache, torch.full_like(inp.cache, float("nan"))], 1).flatten(0, 1)
    strided = type(inp)(q[..., :8], q[..., 8:], inp.w_uk.transpose(1, 2).contiguous().transpose(1, 2),
                        wide_cache[::2], torch.cat([inp.block_table, -inp.block_table], 1)[:, : inp.block_table.shape[1]],
                        inp.seq_lens)
    assert not strided.q_nope.is_contiguous() and not strided.w_uk.is_contiguous()
    assert not strided.cache.is_contiguous() and not strided.block_table.is_contiguous()
    check_against_materialised(call(impl, strided, c), inp, c, what="MLA decode of strided inputs")


def test_an_implementation_refusing_everything_is_unsupported_not_passed(device):
    import types

    from inference_conformance.conformance.registry import Implementation

    def refuses(*args, **kw):
        raise NotImplementedError("nothing supported")

    impl = Implementation("mla_decode", "refuses", "tests:refuses", "outside", types.SimpleNamespace(mla_decode=refuses),
                          ("mla_decode",))
    with pytest.raises(Unsupported, match="unsupported"):
        KV12.with_examples(KV12.examples[:1])(impl, device, torch.float64)


def test_triton_invariant_mode_refuses_num_splits(device):
    """The batch-invariant mode fixes its split size: a ``num_splits`` with ``batch_invariant=True``
    is a ValueError naming it (never silently another split plan)."""
    from inference_conformance.conformance.contracts.mla_decode import _inputs
    from inference_conformance.optimized.mla_decode import split_kv

    args = [a if a is None else a.to(device) for a in _inputs(torch.Generator().manual_seed(0), (5, 3), 4, 8, 12, 4, 4)]
    with pytest.raises(ValueError, match="num_splits must be None with batch_invariant=True"):
        split_kv.mla_decode(*args, scale=0.5, rope_theta=10000.0, num_splits=2, batch_invariant=True)
