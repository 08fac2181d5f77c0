"""Reference weight quantization: symmetric absmax and asymmetric zero point, 2..8 bits, per
tensor, per channel or per group along K; the packed storage and its probes. Naive and readable:
one group at a time, float64 throughout. The oracle of the ``quantization`` contract
(``conformance/contracts/quantization.py``; claims QT-1, QT-2, QT-9; lecture 001 §5.1–5.2).

Storage (:class:`QuantizedWeight`), one convention for both schemes:

    w_hat = (u - z) * s

with ``u`` the stored unsigned code in 0..2^b - 1, ``z`` the stored zero point and ``s`` the
group's scale.

- Symmetric (absmax): s = max|w_group| / (2^(b-1) - 1), q = round(w / s) in
  [-(2^(b-1) - 1), 2^(b-1) - 1], stored as u = q + z with z = 2^(b-1) (so code 0 is unused:
  the range is symmetric). A 4-bit group's zero point is 8 and code 8 is exactly 0.
- Asymmetric (zero point): s = (max(max w, 0) - min(min w, 0)) / (2^b - 1), z = round(-min(min w,
  0) / s) in 0..2^b - 1, u = clamp(round(w / s) + z, 0, 2^b - 1): zero is exactly
  representable (code z).
- The zero point convention: the stored value IS z (not z - 1, as some checkpoint formats store
  it, e.g. GPTQ's original int32 zeros); :func:`probe_zero_point` checks it.
- The scale is rounded up to 16 significant bits (:func:`round_scale`), so that every code x
  scale (at most 8 + 16 bits) is exact in float32 and quantize(dequantize(.)) is idempotent
  (QT-2); rounding up keeps every |w / s| within the code range, and costs at most 2^-16 of
  the step.
- An all-zero group has s = 0: every code is z and it dequantizes to zeros.

Packing (:func:`pack` / :func:`unpack`), along K, for codes and for zero points alike: with 4
bits two codes per byte, with 2 bits four; element j of a row goes to byte j // (8 // b) at bit
offset (j % (8 // b)) * b: the FIRST element sits in the LOW bits ("low nibble first": codes
0, 1 pack to 0x10). Rows are padded with zero codes to whole bytes. Other bit widths store one
code per byte. :func:`probe_packing` checks the order with a known pattern (pack 0..7, compare
the bytes, unpack, compare).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from conformance.contracts.quantization import levels, validate_matmul, validate_quantize

#: Significant bits kept in a stored scale (see the module docstring).
SCALE_BITS = 16


def codes_per_byte(bits: int) -> int:
    """Codes stored in one byte: 2 for 4 bits, 4 for 2 bits, else 1."""
    return 8 // bits if bits in (2, 4) else 1


def pack(u: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack codes (R, L) (integers in 0..2^bits - 1) along the last dimension into (R,
    ceil(L / per)) uint8, per = :func:`codes_per_byte`; element j -> byte j // per, bits
    [(j % per) * bits, (j % per + 1) * bits) (first element in the low bits). Raises ValueError
    for a code out of range."""
    u = u.to(torch.int64)
    if u.numel() and (int(u.min()) < 0 or int(u.max()) >= 2 ** bits):
        raise ValueError(f"codes must lie in 0..{2 ** bits - 1} for {bits} bits, got {int(u.min())}..{int(u.max())}")
    per = codes_per_byte(bits)
    R, L = u.shape
    padded = torch.zeros(R, -(-L // per) * per, dtype=torch.int64, device=u.device)
    padded[:, :L] = u
    packed = torch.zeros(R, padded.shape[1] // per, dtype=torch.int64, device=u.device)
    for j in range(per):                                 # element j of each byte's run
        packed |= padded[:, j::per] << (j * bits)
    return packed.to(torch.uint8)


def unpack(packed: torch.Tensor, bits: int, L: int) -> torch.Tensor:
    """Inverse of :func:`pack`: (R, ceil(L / per)) uint8 -> (R, L) int64 codes."""
    per = codes_per_byte(bits)
    p = packed.to(torch.int64)
    R = p.shape[0]
    u = torch.zeros(R, p.shape[1] * per, dtype=torch.int64, device=p.device)
    for j in range(per):
        u[:, j::per] = (p >> (j * bits)) & (2 ** bits - 1)
    return u[:, :L]


def round_scale(s: float) -> float:
    """s rounded UP to :data:`SCALE_BITS` significant bits (0 stays 0)."""
    if s == 0:
        return 0.0
    m, e = math.frexp(s)                                  # s = m * 2^e, m in [0.5, 1)
    return math.ldexp(math.ceil(m * 2 ** SCALE_BITS) / 2 ** SCALE_BITS, e)


@dataclass(frozen=True)
class QuantizedWeight:
    """The reference's packed weight.

    ``codes`` (N, ceil(K / per)) uint8, packed along K; ``scales`` (N, groups per row) float64
    (or (1, 1) for granularity "tensor"); ``zeros`` the zero points, the same rows, packed along
    the groups like the codes; ``bits``, ``group_size`` (K for "channel" and "tensor"),
    ``granularity`` as given, ``N``, ``K``, ``dtype`` (w's), ``symmetric``.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    bits: int
    group_size: int
    granularity: object
    N: int
    K: int
    dtype: torch.dtype
    symmetric: bool

    @property
    def groups(self) -> int:
        """Scale columns: 1 for "tensor", else K // group_size."""
        return self.scales.shape[1]


def quantize_group(v: torch.Tensor, bits: int, symmetric: bool) -> tuple[torch.Tensor, float, int]:
    """Quantize one group (a float64 vector): returns (codes u (int64), scale s, zero point z)."""
    if symmetric:
        z = 2 ** (bits - 1)
        s = round_scale(float(v.abs().max()) / levels(bits, True))
        lo, hi = z - levels(bits, True), z + levels(bits, True)
    else:
        lo_w, hi_w = min(float(v.min()), 0.0), max(float(v.max()), 0.0)
        s = round_scale((hi_w - lo_w) / levels(bits, False))
        z = min(max(round(-lo_w / s), 0), 2 ** bits - 1) if s > 0 else 0
        lo, hi = 0, 2 ** bits - 1
    if s == 0:                                            # an all-zero group
        return torch.full(v.shape, z, dtype=torch.int64), 0.0, z
    u = (torch.round(v / s) + z).clamp(lo, hi).to(torch.int64)
    return u, s, z


def quantize(w: torch.Tensor, *, bits: int, granularity, symmetric: bool = True) -> QuantizedWeight:
    """Quantize a Linear weight w (N, K) (see the module docstring). Raises TypeError/ValueError
    as the contract's ``validate_quantize``."""
    shape = validate_quantize(w, bits, granularity)
    w64 = w.detach().to("cpu", torch.float64)
    N, K, g = shape.N, shape.K, shape.group_size
    u = torch.zeros(N, K, dtype=torch.int64)
    if granularity == "tensor":
        codes, s, z = quantize_group(w64.reshape(-1), shape.bits, symmetric)
        u = codes.reshape(N, K)
        scales = torch.tensor([[s]], dtype=torch.float64)
        zeros = torch.tensor([[z]], dtype=torch.int64)
    else:
        scales = torch.zeros(N, K // g, dtype=torch.float64)
        zeros = torch.zeros(N, K // g, dtype=torch.int64)
        for n in range(N):
            for j in range(K // g):
                codes, s, z = quantize_group(w64[n, j * g:(j + 1) * g], shape.bits, symmetric)
                u[n, j * g:(j + 1) * g] = codes
                scales[n, j], zeros[n, j] = s, z
    return QuantizedWeight(pack(u, shape.bits).to(w.device), scales.to(w.device), pack(zeros, shape.bits).to(w.device),
                           shape.bits, g, granularity, N, K, w.dtype, symmetric)


def _check_qw(qw) -> QuantizedWeight:
    if not isinstance(qw, QuantizedWeight):
        raise TypeError(f"qw must be a reference.quantization.QuantizedWeight (what quantize returned), "
                        f"got {type(qw).__name__}")
    return qw


def dequantize64(qw: QuantizedWeight) -> torch.Tensor:
    """(u - z) * s of every element, (N, K) float64."""
    qw = _check_qw(qw)
    u = unpack(qw.codes, qw.bits, qw.K).to(torch.float64)                        # (N, K)
    z = unpack(qw.zeros, qw.bits, qw.groups).to(torch.float64)                   # (N or 1, groups)
    if qw.granularity == "tensor":
        return (u - z[0, 0]) * qw.scales[0, 0]
    per_element = qw.group_size
    return (u - z.repeat_interleave(per_element, dim=1)) * qw.scales.repeat_interleave(per_element, dim=1)


def dequantize(qw: QuantizedWeight) -> torch.Tensor:
    """(N, K) in w's dtype: (u - z) * s computed in float64, rounded once to the dtype."""
    return dequantize64(qw).to(qw.dtype)


def matmul(x: torch.Tensor, qw: QuantizedWeight) -> torch.Tensor:
    """x (M, K) @ dequantize(qw).T -> (M, N) in x's dtype, computed in float64 and rounded once.
    The weight is dequantize(qw), i.e. rounded to w's dtype first: in 16-bit dtypes the float64
    (u - z) * s differs from it by that rounding, which a product with heavy cancellation shows.
    Raises TypeError/ValueError for an x of the wrong K, dtype or device (``validate_matmul``)."""
    qw = _check_qw(qw)
    validate_matmul(x, K=qw.K, dtype=qw.dtype, device=qw.codes.device)
    d = dequantize(qw).to(torch.float64)
    return (x.to(torch.float64) @ d.to(x.device).T).to(x.dtype)


class Scheme:
    """One scheme of the contract (``symmetric`` True: absmax; False: zero point): quantize,
    dequantize, matmul."""

    def __init__(self, symmetric: bool):
        self.symmetric = symmetric

    def quantize(self, w, *, bits, granularity):
        return quantize(w, bits=bits, granularity=granularity, symmetric=self.symmetric)

    def dequantize(self, qw):
        return dequantize(qw)

    def matmul(self, x, qw):
        return matmul(x, qw)

    def __repr__(self) -> str:
        return f"reference.quantization.Scheme(symmetric={self.symmetric})"


SYMMETRIC = Scheme(True)
ASYMMETRIC = Scheme(False)


# ------------------------------------------------------------------------------------ probes
#: The documented bytes of the known patterns (low bits first).
PACKED_0_TO_7_4BIT = (0x10, 0x32, 0x54, 0x76)
PACKED_0123_2BIT = (0xE4, 0xE4)                          # 0 | 1 << 2 | 2 << 4 | 3 << 6, twice


def probe_packing() -> dict:
    """Pack the known patterns (4 bits: 0..7; 2 bits: 0, 1, 2, 3, 0, 1, 2, 3), compare the bytes
    with the documented order and unpack again. Returns {"4": (bytes, round trip ok), "2": ...}."""
    out = {}
    for bits, pattern, expected in ((4, list(range(8)), PACKED_0_TO_7_4BIT),
                                    (2, [0, 1, 2, 3] * 2, PACKED_0123_2BIT)):
        u = torch.tensor([pattern])
        p = pack(u, bits)
        out[str(bits)] = (tuple(int(b) for b in p[0]), bool(torch.equal(unpack(p, bits, len(pattern)), u)),
                          tuple(int(b) for b in p[0]) == expected)
    return out


def probe_zero_point() -> float:
    """The zero-point convention: a symmetric 4-bit group whose stored zero is 8 and code 8
    dequantizes to exactly 0 (the stored value is z itself). Returns that value."""
    qw = QuantizedWeight(codes=pack(torch.tensor([[8, 8]]), 4), scales=torch.tensor([[0.37]], dtype=torch.float64),
                         zeros=pack(torch.tensor([[8]]), 4), bits=4, group_size=2, granularity=2, N=1, K=2,
                         dtype=torch.float64, symmetric=True)
    return float(dequantize(qw)[0, 0])


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
def quantize_model_weights(model, quantize_dequantize, *, bits: int, granularity):
    """A copy of a reference Transformer whose block Linear weights (wq, wk, wv, wo, w_gate,
    w_up, w_down) are replaced by ``quantize_dequantize(w, bits, granularity)`` (weight-only
    quantization; embeddings, norms and the tied head stay as they are). A group size that does
    not divide a weight's K is applied to the weight padded with zero columns (zeros change no
    group's absmax), then the padding is cropped."""
    import copy

    out = copy.deepcopy(model)
    with torch.no_grad():
        for block in out.blocks:
            for lin in (block.attn.wq, block.attn.wk, block.attn.wv, block.attn.wo,
                        block.mlp.w_gate, block.mlp.w_up, block.mlp.w_down):
                w = lin.weight
                K = w.shape[1]
                pad = (-K) % granularity if isinstance(granularity, int) else 0
                wp = torch.nn.functional.pad(w, (0, pad))
                lin.weight.copy_(quantize_dequantize(wp, bits, granularity)[:, :K])
    return out


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
    return [lin for b in model.blocks for lin in (b.attn.wq, b.attn.wk, b.attn.wv, b.attn.wo,
                                                    b.mlp.w_gate, b.mlp.w_up, b.mlp.w_down)]


def w8a8_model(model, *, act_bits: int = 8, act_granularity: str = "token", weight_bits: int = 8,
               int8_decomposition: bool = False, threshold: float = 6.0):
    """A copy of a reference Transformer whose block Linear layers run quantized: weights per
    output channel at ``weight_bits``, input activations quantized dynamically per tensor or per
    token at ``act_bits`` (W8A8 when both are 8); with ``int8_decomposition`` the LLM.int8()
    decomposition instead (outlier columns above ``threshold`` kept in full precision)."""
    import copy

    out = copy.deepcopy(model)
    for lin in block_linears(out):
        w = lin.weight.detach().clone()
        if int8_decomposition:
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


def gptq(w: torch.Tensor, x: torch.Tensor, bits: int, group_size: int, damp: float = 0.01) -> torch.Tensor:
    """GPTQ (Frantar et al. 2023), naive: quantize w (N, K) column by column in order, each
    column's rounding error spread over the columns not yet quantized through the inverse
    Hessian H = X^T X (+ damp x mean diag) of the calibration inputs x (n, K); the scale of a
    group is taken from the (already updated) weights when the group starts. Returns the
    dequantized weight (N, K) float64."""
    W = w.detach().to(torch.float64).clone()
    X = x.detach().to(torch.float64).reshape(-1, W.shape[1])
    N, K = W.shape
    H = X.T @ X
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    H += damp * torch.diag(H).mean() * torch.eye(K, dtype=torch.float64)
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    qmax = levels(bits, True)
    Q = torch.zeros_like(W)
    s = None
    for i in range(K):
        if i % group_size == 0:
            amax = W[:, i:i + group_size].abs().amax(dim=1)
            s = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
        Q[:, i] = torch.round(W[:, i] / s).clamp(-qmax, qmax) * s
        err = (W[:, i] - Q[:, i]) / Hinv[i, i]
        W[:, i + 1:] -= err[:, None] * Hinv[i, i + 1:][None, :]
    return Q


def awq(w: torch.Tensor, x: torch.Tensor, bits: int, group_size: int, grid: int = 20) -> torch.Tensor:
    """AWQ (Lin et al. 2024), naive: per-input-channel scales s_j = mean|x_j|^alpha, searched over
    alpha in {0, 1/grid, ..., 1}; w diag(s) is rounded to nearest and divided back by s; the
    alpha whose output X w_hat^T is closest to X w^T on the calibration inputs x (n, K) wins.
    alpha = 0 is plain round-to-nearest, so AWQ is never worse than it on x. Returns the
    dequantized weight (N, K) float64."""
    W = w.detach().to(torch.float64)
    X = x.detach().to(torch.float64).reshape(-1, W.shape[1])
    mag = X.abs().mean(dim=0).clamp(min=1e-12)
    ref_out = X @ W.T
    best, best_err = None, math.inf
    for a in range(grid + 1):
        s = mag ** (a / grid)
        s = s / (s.max() * s.min()).sqrt()
        Wq = rtn_absmax(W * s, bits, group_size) / s
        err = float(((X @ Wq.T - ref_out) ** 2).sum())
        if err < best_err:
            best, best_err = Wq, err
    return best
