"""A small decoder-only transformer, written to be read: the suite's reference model.

RMSNorm, rotary position embeddings (RoPE), grouped-query attention (GQA: ``n_kv_heads`` divides
``n_heads``; query head h uses KV head ``h // (n_heads // n_kv_heads)``), SwiGLU MLP, tied or
untied embeddings. Works in float64, float32 and bfloat16 (weights and activations in the
model's dtype). Its decode has no cache: :func:`generate` recomputes the whole prefix every step,
which is the oracle the KV-cache engines are checked against (claims KV-1, KV-2, KV-10).

The forward is written once, :meth:`Transformer.forward` (gpt-fast's shape): every engine calls
it with its own positions and an :class:`AttentionCache`, the one piece that differs between
them: given a layer and that layer's new q, k, v (after RoPE) it stores k, v where its cache
keeps them and returns the attention output. :data:`FULL_RECOMPUTE` (causal attention over the
given tokens, no cache) is the reference's; the static KV cache
(:class:`inference_conformance.optimized.kv_cache.StaticCacheAttention`), the paged cache
(:class:`inference_conformance.optimized.paged_attention.engine_attention.PagedCacheAttention`) and the speculative engine's rollback cache
(the static one, rolled back between forwards) are the engines'.

Source: lecture 001 §1-2 (the model and the KV cache), CS336 lecture 10 part 1 (the transformer
and its shapes); Llama (Touvron et al., 2023) for RMSNorm/RoPE/SwiGLU/GQA.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

from inference_conformance.reference.attention import masked_attention


@dataclass(frozen=True)
class TransformerConfig:
    """Model hyper-parameters.

    Sizes by the suite's glossary (``conformance/contracts/glossary.py``): vocab_size: V tokens;
    d_model; n_layers: L; n_heads: Hq query heads; n_kv_heads: Hkv KV heads (Hkv divides Hq;
    Hkv = Hq is MHA, Hkv = 1 is MQA); hd: D, the head dim; d_ff, the SwiGLU hidden size; max_seq_len: the
    longest sequence RoPE tables are built for; rope_theta: RoPE base; norm_eps: RMSNorm epsilon;
    tie_embeddings: the output head reuses the token embedding.
    """

    vocab_size: int = 256
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    d_ff: int = 172
    max_seq_len: int = 512
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    tie_embeddings: bool = False
    head_dim: int | None = None

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "max_seq_len"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads})")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must divide d_model ({self.d_model}) "
                             "unless head_dim is given")
        if self.head_dim is not None and self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.head_dim is None and (self.d_model // self.n_heads) % 2:
            raise ValueError(f"d_model / n_heads must be even for RoPE, got {self.d_model // self.n_heads}")

    @property
    def hd(self) -> int:
        """Head dimension H."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def group_size(self) -> int:
        """Query heads per KV head, G = Hq / Hkv."""
        return self.n_heads // self.n_kv_heads

    def to_dict(self) -> dict:
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.to(x.dtype) * self.weight


def rope_tables(head_dim: int, positions: torch.Tensor, theta: float, dtype: torch.dtype):
    """cos, sin of shape (*positions.shape, head_dim / 2) for integer ``positions``.

    Computed in float64 and cast, so every engine that calls this sees identical tables.
    """
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim)
    angles = positions.to(torch.float64)[..., None] * inv_freq  # (..., D/2)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., :H/2], x[..., H/2:]) (the "rotate half" layout of Llama/HF).

    x: (B, heads, T, D); cos, sin: (B, T, D/2) or (T, D/2).
    """
    if cos.dim() == 2:
        cos, sin = cos[None], sin[None]
    cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, D/2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def naive_attention(q, k, v, mask=None):
    """softmax(q kᵀ / sqrt(D) + mask) v, GQA by head groups (the reference core
    :func:`inference_conformance.reference.attention.masked_attention`; softmax in float32 for 16-bit inputs).

    q: (B, Hq, Tq, D); k, v: (B, Hkv, Tk, D); mask: bool (B or 1, 1, Tq, Tk), True = may attend.
    Returns (B, Hq, Tq, D) in q's dtype.
    """
    half = q.dtype in (torch.float16, torch.bfloat16)
    return masked_attention(q, k, v, scale=q.shape[-1] ** -0.5, mask=mask,
                            softmax_dtype=torch.float32 if half else None)


class AttentionCache(Protocol):
    """The cache and attention backend of one forward of :class:`Transformer`.

    ``attend(layer, q, k, v)``: q (B, Hq, T, D), k and v (B, Hkv, T, D) are layer ``layer``'s
    queries, keys (both after RoPE) and values of the forward's T new tokens, in the model's
    dtype. It writes k and v where its cache keeps them (nothing, for no cache) and returns the
    attention output (B, Hq, T, D) in q's dtype: each query over the keys its token may see.
    """

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


class CausalAttention:
    """No cache: each of the T new tokens attends causally over the T tokens of the forward (the
    reference's full recompute; positions are those of the forward's tokens)."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        T = q.shape[2]
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()[None, None]
        return naive_attention(q, k, v, causal)               # (B, Hq, T, D)


#: The reference's attention backend: full causal recompute, nothing cached.
FULL_RECOMPUTE = CausalAttention()


class RecordingAttention(CausalAttention):
    """:class:`CausalAttention` that also keeps what a cache must hold: after a forward,
    ``kv[layer]`` is that layer's (k, v), each (B, Hkv, T, D), keys after RoPE (the oracle of
    the engines' cached contents, claims KV-4 and SD-8)."""

    def __init__(self):
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.kv.append((k, v))
        return super().attend(layer, q, k, v)


@torch.no_grad()
def layer_kv(model: Transformer, tokens: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the keys (after RoPE) and values the model computes for ``tokens`` (B, T)
    int64 at positions 0..T-1, from one recomputation over those tokens only:
    [(k (B, Hkv, T, D), v (B, Hkv, T, D))] in the model's dtype (what a KV cache must hold;
    claims KV-4, SD-8). ``tokens`` is not checked (see :meth:`Transformer.forward`)."""
    recorder = RecordingAttention()
    model(tokens, None, recorder)
    return recorder.kv


class Attention(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        H = cfg.hd
        self.wq = nn.Linear(cfg.d_model, cfg.n_heads * H, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.n_kv_heads * H, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.n_kv_heads * H, bias=False)
        self.wo = nn.Linear(cfg.n_heads * H, cfg.d_model, bias=False)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor, rope=None):
        """Project and rotate: x (B, T, d_model), positions (B, T) -> q (B, Hq, T, D), k, v (B, Hkv, T, D).
        ``rope``: optional (cos, sin) of :func:`rope_tables` for these positions (the forward
        computes them once for every layer)."""
        B, T, _ = x.shape
        c = self.cfg
        q = self.wq(x).view(B, T, c.n_heads, c.hd).transpose(1, 2)     # (B, Hq, T, D)
        k = self.wk(x).view(B, T, c.n_kv_heads, c.hd).transpose(1, 2)  # (B, Hkv, T, D)
        v = self.wv(x).view(B, T, c.n_kv_heads, c.hd).transpose(1, 2)  # (B, Hkv, T, D)
        cos, sin = rope if rope is not None else rope_tables(c.hd, positions, c.rope_theta, x.dtype)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: AttentionCache = FULL_RECOMPUTE,
                layer: int = 0, rope=None) -> torch.Tensor:
        """x (B, T, d_model) at ``positions`` (B, T) -> (B, T, d_model); ``cache`` stores this
        layer's k, v and attends (default: causal over x's tokens, no cache)."""
        B, T, _ = x.shape
        q, k, v = self.qkv(x, positions, rope)
        out = cache.attend(layer, q, k, v)                     # (B, Hq, T, D)
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))  # (B, T, d_model)


class SwiGLU(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.w_gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w_up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w_down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: AttentionCache = FULL_RECOMPUTE,
                layer: int = 0, rope=None) -> torch.Tensor:
        """x (B, T, d_model) -> (B, T, d_model); arguments as :meth:`Attention.forward`."""
        x = x + self.attn(self.attn_norm(x), positions, cache, layer, rope)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    """The reference model. ``forward(tokens)`` -> logits, no cache; ``forward(tokens,
    positions, cache)`` is the same forward over an engine's :class:`AttentionCache`."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def output_weight(self) -> torch.Tensor:
        return self.embed.weight if self.head is None else self.head.weight

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None,
                cache: AttentionCache | None = None, *, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The model's one forward: tokens (B, T) int64 -> logits (B, T, V) in the model's dtype.

        positions: (B, T) int64 RoPE positions (default 0..T-1 for every row). ``cache``: the
        :class:`AttentionCache` every layer writes its k, v to and attends through; None is
        :data:`FULL_RECOMPUTE` after checking ``tokens`` (an engine passing its cache has checked
        its own arguments: its token matrix may be longer than max_seq_len). ``rows``: (R,)
        int64 indices into the B·T tokens (row-major); when given, only their logits (R, V).
        Raises (``cache`` None) TypeError for a non-tensor or non-integer ``tokens``, ValueError
        for a non-2D ``tokens``, ids outside [0, V) or T > max_seq_len.
        """
        if cache is None:
            validate_tokens(tokens, self.cfg)
            cache = FULL_RECOMPUTE
        B, T = tokens.shape
        if positions is None:
            positions = torch.arange(T, device=tokens.device).expand(B, T)
        x = self.embed(tokens)                                                    # (B, T, d_model)
        rope = rope_tables(self.cfg.hd, positions, self.cfg.rope_theta, x.dtype)  # once for every layer
        for layer, block in enumerate(self.blocks):
            x = block(x, positions, cache, layer, rope)
        if rows is not None:
            x = x.reshape(B * T, -1)[rows]                                        # (R, d_model)
        return F.linear(self.norm(x), self.output_weight())                       # (B, T, V) or (R, V)


def validate_tokens(tokens, cfg: TransformerConfig, name: str = "tokens") -> None:
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tokens).__name__}")
    if tokens.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must be int64 or int32 token ids, got {tokens.dtype}")
    if tokens.dim() != 2:
        raise ValueError(f"{name} must have shape (B, T), got {tuple(tokens.shape)}")
    if tokens.shape[1] > cfg.max_seq_len:
        raise ValueError(f"{name} has length {tokens.shape[1]} > max_seq_len {cfg.max_seq_len}")
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= cfg.vocab_size):
        raise ValueError(f"{name} holds ids outside [0, {cfg.vocab_size})")


def init_weights(model: Transformer, seed: int, std: float = 0.02) -> Transformer:
    """Deterministic init from ``seed`` (a private torch.Generator, not the global RNG).

    Linear/embedding weights ~ N(0, std^2); RMSNorm gains ~ 1 + N(0, 0.1^2) so that a norm that
    ignores its weight is visible. Returns the model.
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g, dtype=torch.float64))
            else:
                p.copy_(std * torch.randn(p.shape, generator=g, dtype=torch.float64))
    return model


def build(cfg: TransformerConfig, seed: int = 0, dtype: torch.dtype = torch.float64,
          device: str | torch.device = "cpu") -> Transformer:
    """A randomly initialised reference model in ``dtype`` on ``device`` (eval mode)."""
    return init_weights(Transformer(cfg), seed).to(device=device, dtype=dtype).eval()


def sample_next(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """Next tokens from logits (B, V): greedy when temperature == 0, else inverse-CDF sampling
    with one uniform per row drawn from ``generator`` (so two engines given generators with the
    same seed consume the same random numbers). Returns (B,) int64.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.double() / temperature, dim=-1)  # (B, V)
    u = torch.rand(logits.shape[0], 1, generator=generator, dtype=torch.float64, device=logits.device)
    cdf = probs.cumsum(-1)
    idx = torch.searchsorted(cdf, u * cdf[:, -1:]).squeeze(-1)
    return idx.clamp_(max=logits.shape[-1] - 1)


@torch.no_grad()
def generate(model: Transformer, prompt: torch.Tensor, max_new_tokens: int, temperature: float = 0.0,
             generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Generate without a cache: every step recomputes the full prefix (the KV-cache oracle).

    prompt: (B, S) int64. Returns (tokens (B, S + max_new_tokens), step_logits
    (B, max_new_tokens, V)) where step_logits[:, i] are the logits that chose token S + i.
    """
    tokens = prompt
    step_logits = []
    for _ in range(max_new_tokens):
        logits = model(tokens)[:, -1]  # (B, V)
        step_logits.append(logits)
        nxt = sample_next(logits, temperature, generator)
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)
    return tokens, torch.stack(step_logits, dim=1)
