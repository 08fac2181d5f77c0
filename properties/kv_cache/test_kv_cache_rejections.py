"""The checks of KV-7 (MLA), KV-9 (CLA) and KV-11 (stacked windows' receptive field),
properties/kv_cache/variant_cases.py, reject known-bad implementations: each test feeds the claim's own
check the reference's function (it must pass) and one with a classic mistake (it must fail, by
the comparison the mistake breaks)."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from inference_conformance.properties.falsify import rejects
from inference_conformance.properties.kv_cache.variant_cases import check_kv7, check_kv9, check_kv11
from inference_conformance.reference import kv_cache as kvv


# ------------------------------------------------------------------------ known-bad implementations
def mla_scale_without_rope_dims(x, w, cfg):
    """Absorbed MLA decode whose softmax scale is 1/sqrt(H), not 1/sqrt(H + R): the decoupled
    RoPE dimensions left out of the scale (emulated by scaling the query projections)."""
    f = math.sqrt((cfg.head_dim + cfg.rope_dim) / cfg.head_dim)
    return kvv.mla_absorbed_decode(x, dict(w, w_q=w["w_q"] * f, w_qr=w["w_qr"] * f), cfg)


def mla_without_rope_key(x, w, cfg):
    """Absorbed MLA decode whose scores read only the latent: the decoupled RoPE part of the
    query (and so of every score) dropped."""
    return kvv.mla_absorbed_decode(x, dict(w, w_qr=torch.zeros_like(w["w_qr"])), cfg)


def cla_caches_every_layer(x, w, cfg):
    """CLA decode that ignores the sharing: every layer computes and caches its own K/V."""
    return kvv.stack_decode_cla(x, w, dataclasses.replace(cfg, share=1))


def receptive_field_of_input_kv(x, weights, cfg):
    """The receptive field of a stack whose every layer takes K and V from the stack's input
    (not from the layer below): the context capped at W, the misconception KV-11 corrects."""
    def forward(inp):
        T, h = inp.shape[0], inp
        for w in weights:
            q = kvv._heads(h @ w["wq"], cfg)
            k, v = kvv._heads(inp @ w["wk"], cfg), kvv._heads(inp @ w["wv"], cfg)
            a = kvv.windowed_attention(q, k, v, cfg.window)
            h = h + a.transpose(0, 1).reshape(T, -1) @ w["wo"]
        return h[-1]

    jac = torch.autograd.functional.jacobian(forward, x)  # (D, T, D)
    return jac.abs().amax(dim=(0, 2)) > 0


# ---------------------------------------------------------------------------------- the tests
@pytest.mark.claim("KV-7")
def test_kv7_rejects_scale_without_rope_dims():
    rejects("KV-7", check_kv7, (kvv.mla_absorbed_decode, 0, 6, 2, 4, 4), (mla_scale_without_rope_dims, 0, 6, 2, 4, 4),
            match="KV-7: MLA absorbed decode vs materialised")


@pytest.mark.claim("KV-7")
def test_kv7_rejects_rope_part_dropped():
    rejects("KV-7", check_kv7, (kvv.mla_absorbed_decode, 0, 6, 2, 4, 4), (mla_without_rope_key, 0, 6, 2, 4, 4),
            match="KV-7: MLA absorbed decode vs materialised")


@pytest.mark.claim("KV-9")
def test_kv9_rejects_decode_that_ignores_the_sharing():
    rejects("KV-9", check_kv9, (kvv.stack_decode_cla, 0, 6, 4, 2), (cla_caches_every_layer, 0, 6, 4, 2),
            match="KV-9: CLA cached decode vs full forward")


@pytest.mark.claim("KV-11")
def test_kv11_rejects_context_capped_at_the_window():
    rejects("KV-11", check_kv11, (kvv.receptive_field, 0, 3, 4), (receptive_field_of_input_kv, 0, 3, 4),
            match="KV-11: positions the last output depends on")
