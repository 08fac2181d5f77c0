"""KV-cache reduction by architecture: sliding-window ring buffer, cross-layer sharing, MLA.

Each variant comes as a pair: the full computation (no cache, everything materialised) and the
cached decode that stores less, so the suite can check they compute the same function (claims
KV-7, KV-8, KV-9) and measure what they store. Plus the receptive field of stacked sliding-window
layers (KV-11). Float64-capable, plain PyTorch, written to be read.

Sources: CS336 lecture 10 part 3 ("reducing the KV cache": GQA, MLA, CLA, local attention);
DeepSeek-V2 (2024) §2.1 for MLA and its decoupled RoPE; Brandon et al. (2024) for CLA;
Beltagy et al. (2020, Longformer) and Mistral 7B for sliding windows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from inference_conformance.reference.attention import masked_attention
from inference_conformance.reference.transformer import apply_rope, rope_tables


def _randn(g: torch.Generator, *shape, dtype=torch.float64, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=g, dtype=torch.float64).mul_(scale).to(dtype)


def window_mask(T: int, window: int, device="cpu") -> torch.Tensor:
    """(T, T) bool: query i may attend key j iff i - window < j <= i."""
    i = torch.arange(T, device=device)[:, None]
    j = torch.arange(T, device=device)[None, :]
    return (j <= i) & (j > i - window)


def windowed_attention(q, k, v, window: int) -> torch.Tensor:
    """Full attention with a sliding-window causal mask. q, k, v: (heads, T, H) -> (heads, T, H)."""
    T = q.shape[-2]
    return masked_attention(q, k, v, scale=q.shape[-1] ** -0.5, mask=window_mask(T, window, q.device))


class RingBufferCache:
    """A sliding-window KV cache of exactly ``window`` slots per head (KV-8).

    Token t is written to slot t mod W, overwriting token t - W, which the window no longer
    sees. Keys are cached after RoPE, so slot order does not matter to attention. Its size
    (``nbytes``) is fixed at construction and does not grow with sequence length.
    """

    def __init__(self, heads: int, head_dim: int, window: int, dtype=torch.float64, device="cpu"):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self.k = torch.full((heads, window, head_dim), float("nan"), dtype=dtype, device=device)
        self.v = torch.full_like(self.k, float("nan"))
        self.length = 0

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def append(self, k_t: torch.Tensor, v_t: torch.Tensor) -> None:
        """k_t, v_t: (heads, H), the new token's key and value."""
        slot = self.length % self.window
        self.k[:, slot] = k_t
        self.v[:, slot] = v_t
        self.length += 1

    def attend(self, q_t: torch.Tensor) -> torch.Tensor:
        """q_t: (heads, H) -> (heads, H), attention over the min(length, W) live slots."""
        n = min(self.length, self.window)
        k, v = self.k[:, :n], self.v[:, :n]  # (heads, n, H)
        return masked_attention(q_t[:, None], k, v, scale=q_t.shape[-1] ** -0.5)[:, 0]


def ring_buffer_decode(q, k, v, window: int) -> tuple[torch.Tensor, int]:
    """Token-by-token decode through a :class:`RingBufferCache`. Returns (out (heads, T, H), bytes)."""
    heads, T, H = q.shape
    cache = RingBufferCache(heads, H, window, q.dtype, q.device)
    outs = []
    for t in range(T):
        cache.append(k[:, t], v[:, t])
        outs.append(cache.attend(q[:, t]))
    return torch.stack(outs, 1), cache.nbytes


@dataclass(frozen=True)
class StackConfig:
    """A stack of attention-only residual layers (for KV-9 and KV-11).

    d_model: D; heads: N; layers: L; window: sliding window (None: full causal); share: CLA
    sharing factor (layers l with l % share != 0 reuse the K/V of layer share * (l // share)).
    """

    d_model: int = 16
    heads: int = 2
    layers: int = 4
    window: int | None = None
    share: int = 1

    @property
    def hd(self) -> int:
        return self.d_model // self.heads


def stack_weights(cfg: StackConfig, seed: int, dtype=torch.float64) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    s = 1 / math.sqrt(cfg.d_model)
    return [{n: _randn(g, cfg.d_model, cfg.d_model, dtype=dtype, scale=s) for n in ("wq", "wk", "wv", "wo")}
            for _ in range(cfg.layers)]


def _heads(x: torch.Tensor, cfg: StackConfig) -> torch.Tensor:
    return x.view(x.shape[0], cfg.heads, cfg.hd).transpose(0, 1)  # (T, D) -> (N, T, H)


def stack_forward(x: torch.Tensor, weights: list[dict], cfg: StackConfig) -> torch.Tensor:
    """Full forward (no cache) of the residual stack. x: (T, D) -> (T, D).

    With ``share`` > 1, layer l uses the K/V computed (from its own input) by the first layer of its
    sharing group: the cross-layer attention (CLA) of Brandon et al.
    """
    T = x.shape[0]
    kv = None
    for l, w in enumerate(weights):
        q = _heads(x @ w["wq"], cfg)
        if l % cfg.share == 0:
            kv = (_heads(x @ w["wk"], cfg), _heads(x @ w["wv"], cfg))
        k, v = kv
        a = windowed_attention(q, k, v, cfg.window if cfg.window else T)  # (N, T, H)
        x = x + a.transpose(0, 1).reshape(T, -1) @ w["wo"]
    return x


def stack_decode_cla(x: torch.Tensor, weights: list[dict], cfg: StackConfig) -> tuple[torch.Tensor, int]:
    """Token-by-token decode of a full-attention CLA stack, caching K/V only for the first layer
    of each sharing group (KV-9). Returns (out (T, D), cache values stored)."""
    T = x.shape[0]
    n_cached = -(-cfg.layers // cfg.share)
    ks = [[] for _ in range(n_cached)]
    vs = [[] for _ in range(n_cached)]
    outs = []
    for t in range(T):
        h = x[t:t + 1]  # (1, D)
        for l, w in enumerate(weights):
            q = _heads(h @ w["wq"], cfg)  # (N, 1, H)
            slot = l // cfg.share
            if l % cfg.share == 0:
                ks[slot].append(_heads(h @ w["wk"], cfg))
                vs[slot].append(_heads(h @ w["wv"], cfg))
            k, v = torch.cat(ks[slot], 1), torch.cat(vs[slot], 1)  # (N, t+1, H)
            a = masked_attention(q, k, v, scale=cfg.hd ** -0.5)  # (N, 1, H)
            h = h + a.transpose(0, 1).reshape(1, -1) @ w["wo"]
        outs.append(h)
    stored = sum(2 * len(kk) * cfg.d_model for kk in ks)
    return torch.cat(outs, 0), stored


def receptive_field(x: torch.Tensor, weights: list[dict], cfg: StackConfig) -> torch.Tensor:
    """Which input positions the last position's output depends on (KV-11).

    Returns a (T,) bool mask from the exact Jacobian d out[-1] / d x (nonzero rows).
    """
    jac = torch.autograd.functional.jacobian(lambda inp: stack_forward(inp, weights, cfg)[-1], x)  # (D, T, D)
    return jac.abs().amax(dim=(0, 2)) > 0


@dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention (DeepSeek-V2 §2.1).

    d_model: D; heads: N; head_dim: H (the no-RoPE part of q/k and v); latent: C (the cached
    compressed KV); rope_dim: R (the decoupled RoPE key, shared by all heads, also cached).
    """

    d_model: int = 32
    heads: int = 4
    head_dim: int = 8
    latent: int = 6
    rope_dim: int = 4
    rope_theta: float = 10000.0

    def cached_per_token(self) -> int:
        """Values cached per token per layer: C + R (DeepSeek-V2: 512 + 64 = 576)."""
        return self.latent + self.rope_dim

    def mha_per_token(self) -> int:
        """Values an MHA of the same heads caches per token per layer: 2 N H (keys and values)."""
        return 2 * self.heads * self.head_dim


def mla_weights(cfg: MLAConfig, seed: int, dtype=torch.float64) -> dict:
    g = torch.Generator().manual_seed(seed)
    D, N, H, C, R = cfg.d_model, cfg.heads, cfg.head_dim, cfg.latent, cfg.rope_dim
    s = 1 / math.sqrt(D)
    return {"w_dkv": _randn(g, D, C, dtype=dtype, scale=s),          # x -> latent c
            "w_uk": _randn(g, N, C, H, dtype=dtype, scale=1 / math.sqrt(C)),  # c -> k (per head)
            "w_uv": _randn(g, N, C, H, dtype=dtype, scale=1 / math.sqrt(C)),  # c -> v (per head)
            "w_q": _randn(g, N, D, H, dtype=dtype, scale=s),         # x -> q (no-RoPE part)
            "w_qr": _randn(g, N, D, R, dtype=dtype, scale=s),        # x -> q (RoPE part)
            "w_kr": _randn(g, D, R, dtype=dtype, scale=s),           # x -> k_rope (shared)
            "w_o": _randn(g, N, H, D, dtype=dtype, scale=1 / math.sqrt(N * H))}


def _mla_rope(cfg: MLAConfig, T: int, dtype, device):
    return rope_tables(cfg.rope_dim, torch.arange(T, device=device), cfg.rope_theta, dtype)


def mla_materialized(x: torch.Tensor, w: dict, cfg: MLAConfig) -> torch.Tensor:
    """Causal MLA that materialises every head's K and V from the latent. x: (T, D) -> (T, D)."""
    T = x.shape[0]
    c = x @ w["w_dkv"]                                        # (T, C)
    k = torch.einsum("tc,nch->nth", c, w["w_uk"])             # (N, T, H)
    v = torch.einsum("tc,nch->nth", c, w["w_uv"])             # (N, T, H)
    q = torch.einsum("td,ndh->nth", x, w["w_q"])              # (N, T, H)
    cos, sin = _mla_rope(cfg, T, x.dtype, x.device)
    qr = apply_rope(torch.einsum("td,ndr->ntr", x, w["w_qr"])[None], cos, sin)[0]  # (N, T, R)
    kr = apply_rope((x @ w["w_kr"])[None, None], cos, sin)[0, 0]                    # (T, R)
    # q·k + q_rope·k_rope is one dot product over the concatenated (H + R) features
    q_cat = torch.cat([q, qr], -1)                            # (N, T, H + R)
    k_cat = torch.cat([k, kr.expand(cfg.heads, T, cfg.rope_dim)], -1)  # (N, T, H + R)
    o = masked_attention(q_cat, k_cat, v, scale=(cfg.head_dim + cfg.rope_dim) ** -0.5,
                         mask=window_mask(T, T, x.device))   # (N, T, H)
    return torch.einsum("nth,nhd->td", o, w["w_o"])


def mla_absorbed_decode(x: torch.Tensor, w: dict, cfg: MLAConfig) -> tuple[torch.Tensor, int]:
    """Token-by-token MLA decode caching only the latent c and the RoPE key (C + R per token),
    with W_uk absorbed into the query and W_uv into the output projection: K and V are never
    materialised. Returns (out (T, D), values held in the cache per token, counted from it)."""
    T = x.shape[0]
    cos, sin = _mla_rope(cfg, T, x.dtype, x.device)
    w_q_abs = torch.einsum("ndh,nch->ndc", w["w_q"], w["w_uk"])   # (N, D, C): q·k = (x W_q W_uk^T)·c
    w_o_abs = torch.einsum("nch,nhd->ncd", w["w_uv"], w["w_o"])   # (N, C, D): o W_o = (p·c) W_uv W_o
    c_cache, kr_cache, outs = [], [], []
    for t in range(T):
        xt = x[t]                                                  # (D,)
        c_cache.append(xt @ w["w_dkv"])                            # (C,)
        kr_t = apply_rope((xt @ w["w_kr"])[None, None, None], cos[t:t + 1], sin[t:t + 1])[0, 0, 0]
        kr_cache.append(kr_t)                                      # (R,)
        c, kr = torch.stack(c_cache), torch.stack(kr_cache)        # (t+1, C), (t+1, R)
        q_lat = torch.einsum("d,ndc->nc", xt, w_q_abs)             # (N, C)
        qr = apply_rope(torch.einsum("d,ndr->nr", xt, w["w_qr"])[None, :, None], cos[t:t + 1], sin[t:t + 1])[0, :, 0]
        # attention over the latent is multi-query: every head reads the one cached (c, k_rope)
        q_cat = torch.cat([q_lat, qr], -1)[:, None]                # (N, 1, C + R)
        k_cat = torch.cat([c, kr], -1)[None]                       # (1, t+1, C + R)
        o = masked_attention(q_cat, k_cat, c[None], scale=(cfg.head_dim + cfg.rope_dim) ** -0.5)  # (N, 1, C)
        outs.append(torch.einsum("nc,ncd->d", o[:, 0], w_o_abs))
    cached = sum(t.numel() for t in c_cache) + sum(t.numel() for t in kr_cache)
    return torch.stack(outs), cached // T
