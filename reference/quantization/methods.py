"""Reference quantization methods built on the absmax / zero-point schemes of
``reference/quantization/__init__.py`` (lecture 001 §5.2–5.3; claims QT-3..QT-8): SmoothQuant's migration
(QT-7), the function-preserving outlier construction (QT-5), weight-only quantized models (QT-3,
QT-8), dynamic activation quantization, W8A8 (integer or FP8, QT-11) and LLM.int8()'s decomposition
(QT-6), GPTQ with optional act-order and AWQ (QT-8). Naive and readable, float64 where it matters.
"""
from __future__ import annotations

import math

import torch

from inference_conformance.conformance.contracts.quantization import act_order_g_idx, levels, validate_quantize
from inference_conformance.reference.quantization import QuantizedWeight, dequantize64, pack, round_scale


# ------------------------------------------------------------------ SmoothQuant (QT-7, §5.3)
def smoothquant_scales(x: torch.Tensor, w: torch.Tensor, alpha: float) -> torch.Tensor:
    """SmoothQuant's per-input-channel migration scales (Xiao et al. 2023; lecture 001 §5.3):
    s_j = max_m |x[m, j]|^alpha / max_n |w[n, j]|^(1 - alpha), (K,) float64, for activations
    x (M, K) and a Linear weight w (N, K). A channel that is zero in x or in w gets s_j = 1.
    Raises ValueError for alpha outside [0, 1] or shapes whose K differ."""
    if not 0.0 <= float(alpha) <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"x (M, K) and w (N, K) must share K, got x {tuple(x.shape)} and w {tuple(w.shape)}")
    ax = x.detach().to(torch.float64).abs().amax(dim=0)
    aw = w.detach().to(torch.float64).abs().amax(dim=0)
    s = ax ** alpha / aw ** (1 - alpha)
    return torch.where((ax > 0) & (aw > 0) & torch.isfinite(s), s, torch.ones_like(s))


def smoothquant_migrate(x: torch.Tensor, w: torch.Tensor, alpha: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x diag(s)^-1, w diag(s), s) in float64: the activations' channel j divided by s_j, the
    weight's input column j multiplied by it, so (x / s) @ (w * s).T = x @ w.T (QT-7)."""
    s = smoothquant_scales(x, w, alpha)
    return x.to(torch.float64) / s, w.to(torch.float64) * s, s


# ------------------------------------------------------ the outlier construction (QT-5, §5.3)
def make_outlier_channel(model, channel: int = 5, factor: float = 100.0):
    """A copy of a reference Transformer with one activation channel made an outlier without
    changing the function (lecture 001 §5.3, after Dettmers et al. 2022): in every block, the
    RMSNorm weights of ``channel`` (attention and MLP norms) are multiplied by ``factor`` and
    the matching input column of the Linear layers they feed (wq, wk, wv; w_gate, w_up) divided
    by it. The final norm is left alone (with tied embeddings its Linear is the embedding).
    Raises ValueError for a channel outside the model's width or a factor that is not > 0."""
    import copy

    d = model.cfg.d_model
    if not 0 <= channel < d:
        raise ValueError(f"channel must lie in 0..{d - 1}, got {channel}")
    if not factor > 0:
        raise ValueError(f"factor must be > 0, got {factor}")
    out = copy.deepcopy(model)
    with torch.no_grad():
        for block in out.blocks:
            block.attn_norm.weight[channel] *= factor
            for lin in (block.attn.wq, block.attn.wk, block.attn.wv):
                lin.weight[:, channel] /= factor
            block.mlp_norm.weight[channel] *= factor
            for lin in (block.mlp.w_gate, block.mlp.w_up):
                lin.weight[:, channel] /= factor
    return out


# ------------------------------------------------------- weight-only quantized model (QT-3, §5.2)
def named_block_linears(model) -> list:
    """((block index, name), Linear) for every block Linear layer of a reference Transformer (wq,
    wk, wv, wo, w_gate, w_up, w_down), in order."""
    return [((i, name), lin) for i, b in enumerate(model.blocks)
            for name, lin in (("wq", b.attn.wq), ("wk", b.attn.wk), ("wv", b.attn.wv), ("wo", b.attn.wo),
                              ("w_gate", b.mlp.w_gate), ("w_up", b.mlp.w_up), ("w_down", b.mlp.w_down))]


def linear_inputs(model, tokens: torch.Tensor) -> dict:
    """The inputs of every block Linear layer on ``tokens`` (B, T): (block index, name) -> (B*T,
    K) in the model's dtype (the calibration set of GPTQ and AWQ)."""
    seen, hooks = {}, []
    for key, lin in named_block_linears(model):
        hooks.append(lin.register_forward_pre_hook(
            lambda m, a, key=key: seen.__setitem__(key, a[0].detach().reshape(-1, a[0].shape[-1]))))
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        for h in hooks:
            h.remove()
    return seen


def quantize_model_layers(model, quantize_weight):
    """A copy of a reference Transformer whose block Linear weights w (N, K) are replaced by
    ``quantize_weight(key, w)`` (key = (block index, name); the result is cast to the weight's
    dtype). Embeddings, norms and the tied head stay as they are."""
    import copy

    out = copy.deepcopy(model)
    with torch.no_grad():
        for key, lin in named_block_linears(out):
            lin.weight.copy_(quantize_weight(key, lin.weight.detach()).to(lin.weight.dtype))
    return out


def quantize_model_weights(model, quantize_dequantize, *, bits: int, granularity):
    """A copy of a reference Transformer whose block Linear weights are replaced by
    ``quantize_dequantize(w, bits, granularity)`` (weight-only quantization; embeddings, norms
    and the tied head stay as they are). A group size that does not divide a weight's K is
    applied to the weight padded with zero columns (zeros change no group's absmax), then the
    padding is cropped."""
    def one(key, w):
        K = w.shape[1]
        pad = (-K) % granularity if isinstance(granularity, int) else 0
        return quantize_dequantize(torch.nn.functional.pad(w, (0, pad)), bits, granularity)[:, :K]

    return quantize_model_layers(model, one)


def bits_per_value(bits: int, granularity, N: int, K: int, scale_bits: int = 16) -> float:
    """Storage per weight including one ``scale_bits`` scale per group: b + 16/g (groups of g),
    b + 16/K (per channel), b + 16/(N·K) (per tensor). A group of 32 costs 0.5 extra bits."""
    per = N * K if granularity == "tensor" else K if granularity == "channel" else int(granularity)
    return bits + scale_bits / per


# ------------------------------------------- activation quantization, W8A8, LLM.int8() (QT-6, §5.3)
def fake_quantize_activations(x: torch.Tensor, bits: int, granularity: str) -> torch.Tensor:
    """Dynamic symmetric absmax quantization of activations x (..., K), returned dequantized in
    x's dtype: one scale for the whole tensor (``"tensor"``) or one per token, i.e. per row of
    the last dimension (``"token"``). Raises ValueError for another granularity."""
    if granularity not in ("tensor", "token"):
        raise ValueError(f"granularity must be 'tensor' or 'token', got {granularity!r}")
    qmax = levels(bits, True)
    x64 = x.to(torch.float64)
    amax = x64.abs().amax() if granularity == "tensor" else x64.abs().amax(dim=-1, keepdim=True)
    s = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
    return (torch.round(x64 / s).clamp(-qmax, qmax) * s).to(x.dtype)


def fake_quantize_fp8(x: torch.Tensor, fmt: str, granularity: str) -> torch.Tensor:
    """Dynamic FP8 quantization of x (..., K) (QT-11), returned dequantized in x's dtype: s =
    max|x| / F for the whole tensor (``"tensor"``) or per row of the last dimension
    (``"token"``, per output channel for a weight), values ``inference_conformance.reference.quantization.fp8.fp8_cast(x /
    s)`` (round to nearest even, saturating). Raises ValueError for another granularity or format."""
    from inference_conformance.conformance.contracts.quantization.fp8 import fp8_format
    from inference_conformance.reference.quantization.fp8 import fp8_cast

    if granularity not in ("tensor", "token"):
        raise ValueError(f"granularity must be 'tensor' or 'token', got {granularity!r}")
    top = fp8_format(fmt).max
    x64 = x.to(torch.float64)
    amax = x64.abs().amax() if granularity == "tensor" else x64.abs().amax(dim=-1, keepdim=True)
    s = torch.where(amax > 0, amax / top, torch.ones_like(amax))
    return (fp8_cast(x64 / s, fmt) * s).to(x.dtype)


def fake_quantize_weight(w: torch.Tensor, bits: int) -> torch.Tensor:
    """Per-output-channel symmetric absmax of a weight (N, K) (s = max|w_n| / (2^(b-1) - 1), the
    scale not rounded), dequantized in w's dtype."""
    return fake_quantize_activations(w, bits, "token")


def llm_int8_linear(x: torch.Tensor, w: torch.Tensor, threshold: float = 6.0, bits: int = 8) -> torch.Tensor:
    """LLM.int8()'s mixed-precision decomposition (Dettmers et al. 2022): the input columns whose
    max |x| exceeds ``threshold`` (outlier features) are multiplied in x's precision, the rest
    with per-token activations and per-channel weights quantized to ``bits``; the two products
    are summed. x (..., K), w (N, K) -> (..., N)."""
    outlier = x.detach().reshape(-1, x.shape[-1]).abs().amax(dim=0) > threshold          # (K,)
    regular = ~outlier
    out = fake_quantize_activations(x[..., regular], bits, "token") @ fake_quantize_weight(w[:, regular], bits).T
    if bool(outlier.any()):
        out = out + x[..., outlier] @ w[:, outlier].T
    return out


def block_linears(model):
    """Every block's Linear layers of a reference Transformer, in order."""
    return [lin for _, lin in named_block_linears(model)]


def w8a8_model(model, *, act_bits: int = 8, act_granularity: str = "token", weight_bits: int = 8,
               int8_decomposition: bool = False, threshold: float = 6.0, number_format: str = "int"):
    """A copy of a reference Transformer whose block Linear layers run quantized: weights per
    output channel at ``weight_bits``, input activations quantized dynamically per tensor or per
    token at ``act_bits`` (W8A8 when both are 8); with ``int8_decomposition`` the LLM.int8()
    decomposition instead (outlier columns above ``threshold`` kept in full precision). With an
    FP8 ``number_format`` ("fp8_e4m3fn", "fp8_e5m2") weights per channel and activations per
    ``act_granularity`` are FP8 instead (:func:`fake_quantize_fp8`; the bits are ignored)."""
    import copy

    out = copy.deepcopy(model)
    for lin in block_linears(out):
        w = lin.weight.detach().clone()
        if number_format != "int":
            wq = fake_quantize_fp8(w, number_format, "token")
            lin.forward = (lambda x, wq=wq: fake_quantize_fp8(x, number_format, act_granularity) @ wq.T)
        elif int8_decomposition:
            lin.forward = (lambda x, w=w: llm_int8_linear(x, w, threshold, act_bits))
        else:
            wq = fake_quantize_weight(w, weight_bits)
            lin.forward = (lambda x, wq=wq: fake_quantize_activations(x, act_bits, act_granularity) @ wq.T)
    return out


def smoothquant_model(model, calibration_tokens: torch.Tensor, alpha: float = 0.5):
    """A copy of a reference Transformer smoothed by SmoothQuant (Xiao et al. 2023; QT-7): for
    every norm that feeds Linear layers (attention norm -> wq, wk, wv; MLP norm -> w_gate, w_up),
    s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) over the norm's output on ``calibration_tokens``
    (B, T) and the concatenated weights, folded into the norm (weight / s) and the Linear layers
    (columns * s): the function is unchanged up to rounding; the activations lose their
    outlier channels."""
    import copy

    out = copy.deepcopy(model)
    seen = {}
    hooks = []
    for i, b in enumerate(out.blocks):
        for name in ("attn_norm", "mlp_norm"):
            norm = getattr(b, name)
            hooks.append(norm.register_forward_hook(
                lambda m, a, o, key=(i, name): seen.__setitem__(key, torch.maximum(
                    seen.get(key, torch.zeros(o.shape[-1], dtype=o.dtype)), o.detach().abs().reshape(-1, o.shape[-1]).amax(0)))))
    with torch.no_grad():
        out(calibration_tokens)
    for h in hooks:
        h.remove()
    with torch.no_grad():
        for i, b in enumerate(out.blocks):
            for name, lins in (("attn_norm", (b.attn.wq, b.attn.wk, b.attn.wv)), ("mlp_norm", (b.mlp.w_gate, b.mlp.w_up))):
                ax = seen[(i, name)].to(torch.float64)
                aw = torch.cat([lin.weight for lin in lins]).detach().abs().amax(dim=0).to(torch.float64)
                s = torch.where((ax > 0) & (aw > 0), ax ** alpha / aw ** (1 - alpha), torch.ones_like(ax))
                getattr(b, name).weight.div_(s.to(ax.dtype if False else getattr(b, name).weight.dtype))
                for lin in lins:
                    lin.weight.mul_(s.to(lin.weight.dtype))
    return out


# ------------------------------------------------------------------------ GPTQ and AWQ (QT-8)
def rtn_absmax(w: torch.Tensor, bits: int, group_size: int) -> torch.Tensor:
    """Round-to-nearest symmetric absmax of w (N, K) with one scale per row and group of
    ``group_size`` columns (K for per channel), dequantized, float64 (scales not rounded)."""
    N, K = w.shape
    g = w.to(torch.float64).reshape(N, K // group_size, group_size)
    qmax = levels(bits, True)
    amax = g.abs().amax(dim=-1, keepdim=True)
    s = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
    return (torch.round(g / s).clamp(-qmax, qmax) * s).reshape(N, K)


def gptq_quantize(w: torch.Tensor, x: torch.Tensor, *, bits: int, group_size: int, act_order: bool = False,
                  damp: float = 0.01) -> QuantizedWeight:
    """GPTQ (Frantar et al. 2023), naive, symmetric absmax: quantize w (N, K) one column at a
    time, each column's rounding error spread over the columns not yet quantized through the
    inverse Hessian H = X^T X (+ damp x mean diag) of the calibration inputs x (n, K). The scale
    of a group (one per row, rounded up as :func:`round_scale`) is taken from the already updated
    weights when the group starts. With ``act_order`` the columns are processed in decreasing
    order of diag(H) and the groups formed in that order (the result's ``g_idx``, see
    ``act_order_g_idx``); else in column order (``g_idx`` None). Returns a
    :class:`QuantizedWeight` (granularity ``group_size``, float64 dtype). Raises ValueError for
    a group size that does not divide K or an x whose last dimension is not K."""
    shape = validate_quantize(w, bits, group_size)
    N, K, g = shape.N, shape.K, shape.group_size
    if x.shape[-1] != K:
        raise ValueError(f"x must have K = {K} columns (the calibration inputs of w), got shape {tuple(x.shape)}")
    W = w.detach().to("cpu", torch.float64).clone()
    X = x.detach().to("cpu", torch.float64).reshape(-1, K)
    H = X.T @ X
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    order = torch.argsort(torch.diag(H), descending=True, stable=True) if act_order else torch.arange(K)
    W, H = W[:, order], H[order][:, order]                  # processing order from here on
    H += damp * torch.diag(H).mean() * torch.eye(K, dtype=torch.float64)
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    qmax, z = levels(bits, True), 2 ** (bits - 1)
    u = torch.zeros(N, K, dtype=torch.int64)
    scales = torch.zeros(N, K // g, dtype=torch.float64)
    for i in range(K):
        if i % g == 0:
            amax = W[:, i:i + g].abs().amax(dim=1) / qmax
            scales[:, i // g] = torch.tensor([round_scale(float(a)) for a in amax], dtype=torch.float64)
            s = torch.where(scales[:, i // g] > 0, scales[:, i // g], 1.0)
        q = torch.round(W[:, i] / s).clamp(-qmax, qmax)
        u[:, order[i]] = q.to(torch.int64) + z
        err = (W[:, i] - q * scales[:, i // g]) / Hinv[i, i]
        W[:, i + 1:] -= err[:, None] * Hinv[i, i + 1:][None, :]
    g_idx = act_order_g_idx(order, g) if act_order else None
    zeros = torch.full((N, K // g), z, dtype=torch.int64)
    return QuantizedWeight(pack(u, bits).to(w.device), scales.to(w.device), pack(zeros, bits).to(w.device), bits, g,
                           group_size, N, K, torch.float64, True, None if g_idx is None else g_idx.to(w.device))


def gptq(w: torch.Tensor, x: torch.Tensor, bits: int, group_size: int, damp: float = 0.01,
         act_order: bool = False) -> torch.Tensor:
    """:func:`gptq_quantize`, dequantized: (N, K) float64."""
    return dequantize64(gptq_quantize(w, x, bits=bits, group_size=group_size, act_order=act_order, damp=damp))


def awq(w: torch.Tensor, x: torch.Tensor, bits: int, group_size: int, grid: int = 20, *,
        identity: bool = True, magnitudes: torch.Tensor | None = None) -> torch.Tensor:
    """AWQ (Lin et al. 2024), naive: per-input-channel scales s_j = mean|x_j|^alpha, searched over
    alpha in {0, 1/grid, ..., 1}; w diag(s) is rounded to nearest and divided back by s; the
    alpha whose output X w_hat^T is closest to X w^T on the calibration inputs x (n, K) wins.
    alpha = 0 is plain round-to-nearest, so with ``identity`` AWQ is never worse than it on x
    (by construction: judge it on other inputs); ``identity=False`` searches alpha >= 1/grid
    only. ``magnitudes`` (K,) replaces mean|x_j| (a known-bad AWQ passes scales unrelated to the
    activations). Returns the dequantized weight (N, K) float64."""
    W = w.detach().to(torch.float64)
    X = x.detach().to(torch.float64).reshape(-1, W.shape[1])
    mag = (X.abs().mean(dim=0) if magnitudes is None else magnitudes.to(torch.float64)).clamp(min=1e-12)
    ref_out = X @ W.T
    best, best_err = None, math.inf
    for a in range(0 if identity else 1, grid + 1):
        s = mag ** (a / grid)
        s = s / (s.max() * s.min()).sqrt()
        Wq = rtn_absmax(W * s, bits, group_size) / s
        err = float(((X @ Wq.T - ref_out) ** 2).sum())
        if err < best_err:
            best, best_err = Wq, err
    return best
