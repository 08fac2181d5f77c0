"""The checks of the architectural KV-cache reductions KV-7 (MLA), KV-9 (CLA) and KV-11 (the
receptive field of stacked windows), each a function of the implementation it judges:
``properties/kv_cache/test_kv_variants.py`` gives them :mod:`inference_conformance.reference.kv_cache`'s functions,
``properties/kv_cache/test_kv_cache_rejections.py`` known-bad ones. Each raises AssertionError (the
tolerance policy's message, naming what differs)."""
from __future__ import annotations

from typing import Callable

import torch

from inference_conformance.conformance import tolerance
from inference_conformance.properties import strategies as sst
from inference_conformance.reference import kv_cache as kvv


def check_kv7(decode: Callable, seed: int, T: int, heads: int, latent: int, rope_dim: int) -> int:
    """KV-7 on ``decode(x (T, D), weights, cfg) -> (out (T, D), values cached per token)``: the
    outputs equal MLA with K and V materialised (:func:`inference_conformance.reference.kv_cache.mla_materialized`)
    and the cache holds the latent plus the RoPE key, ``latent + rope_dim`` values per token.
    Returns the values per token."""
    cfg = kvv.MLAConfig(d_model=16, heads=heads, head_dim=8, latent=latent, rope_dim=rope_dim)
    w = kvv.mla_weights(cfg, seed)
    x = sst.randn((T, cfg.d_model), seed, scale=2.0)
    out, per_token = decode(x, w, cfg)
    tolerance.assert_close(out, kvv.mla_materialized(x, w, cfg), what="KV-7: MLA absorbed decode vs materialised K/V")
    assert per_token == latent + rope_dim, f"KV-7: {per_token} values cached per token, not C + R = {latent + rope_dim}"
    return per_token


def check_kv9(decode: Callable, seed: int, T: int, layers: int, share: int) -> int:
    """KV-9 on ``decode(x (T, D), weights, cfg) -> (out (T, D), cache values stored)`` for a CLA
    stack sharing K/V across ``share`` layers: the outputs equal the full forward with the shared
    K/V and the cache holds 2 x ceil(layers / share) x T x D values. Returns the values stored."""
    cfg = kvv.StackConfig(d_model=8, heads=2, layers=layers, share=share)
    w = kvv.stack_weights(cfg, seed)
    x = sst.randn((T, cfg.d_model), seed)
    out, stored = decode(x, w, cfg)
    tolerance.assert_close(out, kvv.stack_forward(x, w, cfg), what="KV-9: CLA cached decode vs full forward")
    groups = -(-layers // share)
    tolerance.assert_exact(torch.tensor(stored), torch.tensor(2 * groups * T * cfg.d_model),
                           what="KV-9: CLA cache values (layers / share groups)")
    return stored


def check_kv11(receptive_field: Callable, seed: int, layers: int, window: int) -> int:
    """KV-11 on ``receptive_field(x (T, D), weights, cfg) -> (T,) bool`` (the positions the last
    output depends on) for ``layers`` layers of sliding windows of ``window``: exactly the last
    L·(W−1) positions before it and itself, none further. Returns the distance reached."""
    reach = layers * (window - 1)
    T = reach + 4
    cfg = kvv.StackConfig(d_model=8, heads=2, layers=layers, window=window)
    x = sst.randn((T, cfg.d_model), seed)
    depends = receptive_field(x, kvv.stack_weights(cfg, seed), cfg)
    tolerance.assert_exact(depends, torch.arange(T) >= T - 1 - reach,
                           what=f"KV-11: positions the last output depends on (L={layers}, W={window})")
    return T - 1 - int(torch.nonzero(depends).min())
