"""The ``quantization`` contract: weight quantization of a Linear layer and its matrix product.

An implementation is an object (or module) providing

    quantize(w, *, bits: int, granularity) -> QW
    dequantize(qw) -> Tensor
    matmul(x, qw) -> Tensor

and, optionally, an attribute ``symmetric: bool`` (default True) that names its scheme (or
``scheme``: a name of :data:`SCHEMES`, for an outside scheme whose step is not one of the two
below, with ``stored(qw) -> (q, scale)``, codes minus zero point (N, K) integer and scales (N, K)
float; verified, not trusted: see ``quantization/bounds.py``), and a
keyword ``quantize(..., g_idx=None)`` for GPTQ's act-order (below).

``w`` is a Linear weight (N, K), float64 / float32 / float16 / bfloat16, finite. ``bits`` is an
int in 2..8. ``granularity`` is ``"tensor"`` (one scale for all of w), ``"channel"`` (one scale
per output row n) or an int group size g >= 1 that divides K (one scale per g consecutive
weights of a row along K; groups of one row never span two rows). ``QW`` is the
implementation's own opaque packed form (codes, scales, zero points, layout): the suite never
reads inside it, it only hands it back to ``dequantize`` and ``matmul``.

``dequantize(qw)`` returns (N, K) in w's dtype on w's device. ``matmul(x, qw)`` takes x (M, K)
in w's dtype on w's device (M >= 1) and returns (M, N) in that dtype, equal to
``x @ dequantize(qw).T`` up to accumulation rounding (QT-9; judged by the tolerance rule
``quant-matmul``, a multiple of the naive dequantize-then-multiply error in that dtype plus a
floor, never a bare atol). In 16-bit dtypes the weight is the one ``dequantize`` returns, rounded
to the dtype (to nearest): a kernel that multiplies by the unrounded float32 (u - z) * s differs by
that rounding, which a product with heavy cancellation shows.

The step of a group (what "within half a step" means, :func:`step`):

- symmetric (absmax, the default): s = max|w_group| / (2^(b-1) - 1), q = round(w / s) in
  [-(2^(b-1) - 1), 2^(b-1) - 1];
- asymmetric (zero point, ``symmetric = False``): s = (max(max w_group, 0) - min(min w_group, 0))
  / (2^b - 1), with 0 kept exactly representable (as min/max observers do).

Every reconstructed element lies within s/2 of w (QT-1), up to the stored scale's own rounding
(2^-12 of s/2) and the output dtype's rounding (half an ulp at |w| + s/2, and half the dtype's
subnormal spacing). An all-zero group has
s = 0 and must come back as zeros.

Act-order (optional keyword ``g_idx``, as GPTQ checkpoints store it): with an int group size g,
``g_idx`` is a (K,) integer tensor giving the group of every input column; each group
0..K/g - 1 holds exactly g columns, not necessarily consecutive ones. GPTQ with act-order
processes the columns in decreasing order of the Hessian's diagonal and forms the groups in that
order: ``g_idx[order[i]] = i // g`` (:func:`act_order_g_idx`). The codes stay in column order;
column k is dequantized with the scale and zero point of group ``g_idx[k]``. The step of a
column is its g_idx group's (``step(..., g_idx=)``), and QT-1, QT-9 hold as without it. An
implementation that accepts the keyword gets the act-order laws; ``g_idx=None`` means
``k // g``.

Unsupported inputs: an implementation may raise ``NotImplementedError`` for a (bits,
granularity, dtype) it does not support (the suite reports "unsupported", never a pass); at least
one combination must be supported. Invalid arguments raise ``TypeError`` (not a tensor, a dtype
outside the contract, bits or granularity of the wrong type, a ``qw`` that is not the
implementation's own) or ``ValueError`` (bits outside 2..8, a group size < 1 or not dividing K,
a granularity string other than "tensor"/"channel", w not 2-D or empty or not finite, x of the
wrong shape, K, dtype or device) naming the argument, before any kernel launch
(:func:`validate_quantize`, :func:`validate_matmul`). A NotImplementedError is never raised for an
invalid argument.

FP8 schemes (optional attribute ``number_format``: ``"int"``, the default, or one of
:data:`FP8_FORMATS`, ``"fp8_e4m3fn"`` / ``"fp8_e5m2"``): w_hat = fp8(w / s) * s with one scale per
group as above, s = max|w_group| / F (F = 448 for E4M3fn, 57344 for E5M2: :func:`fp8_step`) and
fp8() the cast to the format's grid, rounding to nearest even and saturating (E4M3fn has no inf:
its largest finite value 448 is also where anything larger goes; E5M2 saturates at 57344 rather
than overflowing to inf). Such a scheme takes ``bits=8`` only (other bits raise
NotImplementedError after validation). Every reconstructed element in the format's normal range
lies within half a unit in the last place, a relative 2^-(m+1) of |w| (m mantissa bits: 2^-4 for
E4M3, 2^-3 for E5M2), and below it within s times half the subnormal step
(:func:`fp8_bound`; QT-11), up to the same stored-scale and output-dtype slack as QT-1.

FP4 block schemes (``number_format`` "mxfp4" / "nvfp4"; QT-13, stated in ``quantization/fp4.py``):
E2M1 values times a scale per block of the granularity (MXFP4 a power of two, NVFP4 an E4M3 scale
times a float32 tensor scale), rounded to nearest even, saturating at ±6; ``bits=4`` only.

KV-cache quantization (QT-12; not a contract function: the formats the model's quantized cache
and the paged kernels read, :data:`KV_FORMATS`, :func:`kv_bound`): keys and values (B, Hkv, T,
D) stored as int8 with one absmax scale per token and head (over D), as int4 KIVI-style (keys
with one scale per channel over each group of G tokens, values one per token, the most recent
tokens kept in full precision: the first ``kv_quantized_tokens(T, fmt)`` = floor((T - R) / G) * G
tokens are quantized, at least the R most recent are not), or as FP8 (E4M3fn / E5M2) with one
scale per token and head.

Where each piece lives (``conformance/contracts/quantization/``): this contract in ``contract.py``, the
FP8 formats and their bounds in ``fp8.py``, the FP4 formats in ``fp4.py``, the KV-cache formats in
``kv.py``, QT-1's bound and the declared schemes in ``bounds.py``.

Claims checked against this contract: QT-1 (half-step bound), QT-2 (idempotence; the
reference's packing round trips), QT-9 (fused dequantize-matmul equals dequantize-then-multiply),
QT-11 (FP8: the saturating cast and its half-ulp bound), QT-12 (KV-cache formats), QT-13 (FP4 blocks).
Sources: lecture 001 §5.1–5.2 (quantization: absmax, zero point, granularity, packing) and §5.4
(FP8, KV-cache quantization), Dettmers et al. 2022 (LLM.int8()), Frantar et al. 2023 (GPTQ), Lin
et al. 2024 (AWQ), Micikevicius et al. 2022 (FP8 formats), Liu et al. 2024 (KIVI), OCP MX v1.0.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from inference_conformance.conformance import tolerance
from inference_conformance.conformance.coverage import CoverageClass
from inference_conformance.conformance.registry import Contract, InvalidCall

#: Dtypes of w (and x) in the contract.
DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
#: Bit widths of the contract.
MIN_BITS, MAX_BITS = 2, 8
#: The named granularities (an int group size is the third kind).
NAMED_GRANULARITIES = ("tensor", "channel")
#: Relative slack on s/2 for the stored scale's rounding (implementations may store the scale
#: with 16 significant bits, so that code x scale is exact in float32).
SCALE_SLACK = 2.0 ** -12


@dataclass(frozen=True)
class QuantShape:
    """One quantize call: the weight's N (rows) and K (columns), the bits, the granularity as
    given, and the group size along K it means (K for "channel"; K for "tensor" too, where all
    rows share one scale)."""

    N: int
    K: int
    bits: int
    granularity: object
    group_size: int

    @property
    def groups_per_row(self) -> int:
        """K // group_size."""
        return self.K // self.group_size


def validate_bits(bits) -> int:
    """bits must be an int (not a bool) in 2..8: TypeError / ValueError naming ``bits``."""
    if isinstance(bits, bool) or not isinstance(bits, numbers.Integral):
        raise TypeError(f"bits must be an int in {MIN_BITS}..{MAX_BITS}, got {type(bits).__name__} {bits!r}")
    if not MIN_BITS <= int(bits) <= MAX_BITS:
        raise ValueError(f"bits must be in {MIN_BITS}..{MAX_BITS}, got {bits}")
    return int(bits)


def validate_granularity(granularity, K: int) -> int:
    """"tensor", "channel" or an int group size dividing K; returns the group size along K.
    TypeError / ValueError naming ``granularity``."""
    if isinstance(granularity, str):
        if granularity not in NAMED_GRANULARITIES:
            raise ValueError(f"granularity must be 'tensor', 'channel' or an int group size, got {granularity!r}")
        return K
    if isinstance(granularity, bool) or not isinstance(granularity, numbers.Integral):
        raise TypeError(f"granularity must be 'tensor', 'channel' or an int group size, "
                        f"got {type(granularity).__name__} {granularity!r}")
    g = int(granularity)
    if g < 1:
        raise ValueError(f"granularity (group size) must be >= 1, got {g}")
    if K % g:
        raise ValueError(f"granularity (group size) {g} must divide K = {K} (the weight's columns)")
    return g


def validate_quantize(w, bits, granularity) -> QuantShape:
    """Check a quantize call; return its sizes. Raises TypeError (w not a tensor or of a dtype
    outside the contract, bits / granularity of the wrong type) or ValueError (w not 2-D (N, K),
    empty, not finite or on an unsupported device; bits outside 2..8; group size < 1 or not
    dividing K; an unknown granularity name), each naming the argument."""
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"w must be a torch.Tensor (N, K), got {type(w).__name__}")
    if w.dtype not in DTYPES:
        raise TypeError(f"w has dtype {w.dtype}; the quantization contract takes "
                        f"{[str(d).replace('torch.', '') for d in DTYPES]}")
    if w.dim() != 2:
        raise ValueError(f"w must have 2 dimensions (N, K), got shape {tuple(w.shape)}")
    if w.shape[0] < 1 or w.shape[1] < 1:
        raise ValueError(f"w must not be empty, got shape {tuple(w.shape)}")
    if w.device.type not in ("cpu", "cuda"):
        raise ValueError(f"w must be on a cpu or cuda device, got {w.device}")
    if not bool(torch.isfinite(w).all()):
        raise ValueError("w must be finite (no NaN or inf)")
    b = validate_bits(bits)
    N, K = (int(s) for s in w.shape)
    g = validate_granularity(granularity, K)
    return QuantShape(N, K, b, granularity, g)


def validate_g_idx(g_idx, K: int, granularity) -> torch.Tensor:
    """Check an act-order ``g_idx`` for a weight of K columns; return it as int64 on its device.
    Raises TypeError (not a tensor, not an integer dtype) or ValueError (a named granularity:
    g_idx needs an int group size; not of shape (K,); a group index outside 0..K/g - 1; a group
    that does not hold exactly g columns), naming ``g_idx``."""
    if not isinstance(g_idx, torch.Tensor):
        raise TypeError(f"g_idx must be a torch.Tensor (K,) of group indices, got {type(g_idx).__name__}")
    if g_idx.dtype.is_floating_point or g_idx.dtype.is_complex or g_idx.dtype == torch.bool:
        raise TypeError(f"g_idx must have an integer dtype, got {g_idx.dtype}")
    if isinstance(granularity, str):
        raise ValueError(f"g_idx needs an int group size as granularity, got {granularity!r}")
    g = validate_granularity(granularity, K)
    if tuple(g_idx.shape) != (K,):
        raise ValueError(f"g_idx must have shape (K,) = ({K},), got {tuple(g_idx.shape)}")
    idx = g_idx.to(torch.int64)
    groups = K // g
    if int(idx.min()) < 0 or int(idx.max()) >= groups:
        raise ValueError(f"g_idx values must lie in 0..{groups - 1} (K // group size), "
                         f"got {int(idx.min())}..{int(idx.max())}")
    counts = torch.bincount(idx.cpu(), minlength=groups)
    if not bool((counts == g).all()):
        raise ValueError(f"every group must hold exactly {g} columns in g_idx, got counts {counts.tolist()}")
    return idx


def act_order_g_idx(order: torch.Tensor, group_size: int) -> torch.Tensor:
    """GPTQ's act-order group index: ``order`` (K,) is the permutation in which the columns are
    processed (decreasing Hessian diagonal); the i-th processed column joins group i // g, so
    ``g_idx[order[i]] = i // group_size``. Returns (K,) int64 on order's device."""
    order = order.to(torch.int64)
    g_idx = torch.empty_like(order)
    g_idx[order] = torch.arange(order.numel(), device=order.device) // group_size
    return g_idx


def validate_matmul(x, *, K: int, dtype: torch.dtype, device: torch.device) -> int:
    """Check matmul's x against the quantized weight's K, dtype and device; return M. Raises
    TypeError (x not a tensor, x's dtype not the weight's) or ValueError (x not 2-D (M, K), M = 0,
    K differs, another device), naming ``x``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor (M, K), got {type(x).__name__}")
    if x.dtype != dtype:
        raise TypeError(f"x has dtype {x.dtype}; the quantized weight dequantizes to {dtype} and x must match it")
    if x.dim() != 2:
        raise ValueError(f"x must have 2 dimensions (M, K), got shape {tuple(x.shape)}")
    if x.shape[0] < 1:
        raise ValueError(f"x must have at least one row, got shape {tuple(x.shape)}")
    if x.shape[1] != K:
        raise ValueError(f"x has K = {x.shape[1]} columns; the quantized weight has K = {K}")
    if torch.device(x.device) != torch.device(device):
        raise ValueError(f"x is on {x.device}, the quantized weight on {device}")
    return int(x.shape[0])


def levels(bits: int, symmetric: bool) -> int:
    """Steps between the extreme codes: 2^(b-1) - 1 (symmetric, one side) or 2^b - 1 (asymmetric,
    the whole range)."""
    return 2 ** (bits - 1) - 1 if symmetric else 2 ** bits - 1


def step(w: torch.Tensor, bits: int, granularity, symmetric: bool = True, g_idx=None) -> torch.Tensor:
    """The contract's step s of each element's group, (N, K) float64 (see the module docstring):
    symmetric s = max|w_group| / (2^(b-1) - 1); asymmetric s = (max(max w_group, 0) -
    min(min w_group, 0)) / (2^b - 1); with ``g_idx`` the groups are its (act-order). Raises as
    :func:`validate_quantize` and :func:`validate_g_idx`."""
    shape = validate_quantize(w, bits, granularity)
    if g_idx is not None:
        order = torch.argsort(validate_g_idx(g_idx, shape.K, granularity).cpu(), stable=True).to(w.device)
        s = torch.empty(shape.N, shape.K, dtype=torch.float64, device=w.device)
        s[:, order] = step(w[:, order], bits, granularity, symmetric)      # groups made consecutive
        return s
    w64 = w.detach().to(torch.float64)
    if granularity == "tensor":
        groups = w64.reshape(1, 1, -1)
    else:
        groups = w64.reshape(shape.N, shape.groups_per_row, shape.group_size)
    if symmetric:
        span = groups.abs().amax(dim=-1)
    else:
        span = groups.amax(dim=-1).clamp(min=0) - groups.amin(dim=-1).clamp(max=0)
    s = span / levels(shape.bits, symmetric)                      # (N, groups per row), or (1, 1)
    if granularity == "tensor":
        return s.reshape(1, 1).expand(shape.N, shape.K)
    return s.repeat_interleave(shape.group_size, dim=-1)          # (N, K)


#: QT-9's tolerance rule: the fused product against the float64 x @ dequantize(qw).T, bounded
#: by a multiple of the naive dequantize-then-multiply error in x's dtype plus a floor.
QUANT_MATMUL_RULE = tolerance.NaiveMultipleRule(
    "quant-matmul", factor=4.0, floor_ulps=8.0, cap_fraction=1.0 / 16,
    sees="a fused dequantize-matmul that differs from dequantize-then-multiply by more than 4x the naive "
         "product's own rounding + 8 ulp of the output's scale (of the products' magnitude max(|x| @ |w|.T) "
         "where the law passes it): wrong codes, scales, zero points, nibble order or groups anywhere in a "
         "row; weights rounded to a narrower dtype than the call's (bfloat16 in float32); all-zero or constant outputs",
    blind_to="errors below the naive product's rounding (a few ulps of the output's maximum, of the "
             "products' magnitude in a row that cancels: any summation order is correct there); "
             "quantization error itself (QT-1 judges dequantize)")


def cases(seed: int, device: str) -> list[tuple[tuple, dict]]:
    """Small valid quantize calls for the checks every contract gets (w not mutated, every
    output element finite, identical repeats): 4 bits in groups of 8 (float32), int8 per channel
    with odd K (bfloat16), 3 bits in groups of 16 (float16), 2 bits per tensor (float64), weights
    of real magnitude (std 0.05, one outlier of 1.0)."""
    out = []
    for i, (N, K, bits, gran, dt) in enumerate([(8, 32, 4, 8, torch.float32), (5, 33, 8, "channel", torch.bfloat16),
                                                (4, 64, 3, 16, torch.float16), (6, 7, 2, "tensor", torch.float64)]):
        g = torch.Generator().manual_seed(1000 * seed + i)
        w = 0.05 * torch.randn(N, K, generator=g, dtype=torch.float64)
        w[0, K // 2] = 1.0
        out.append(((w.to(device=device, dtype=dt),), {"bits": bits, "granularity": gran}))
    return out


# ----------------------------------------------------------------------------------------------
# coverage table: the boundary classes QT-1's law must hand every implementation in every profile
# ----------------------------------------------------------------------------------------------
#: QT-1's law (properties/quantization/test_quantization.py).
_QT1 = ("law_half_step",)
#: The contents of a group that break quantizers (properties/quantization/cases.py draws them).
GROUP_KINDS = ("normal", "zero", "pos", "neg", "outlier", "subnormal")


def _group_size(c) -> int:
    return c.granularity if isinstance(c.granularity, int) else c.K


def _granularity_kind(c) -> str:
    return c.granularity if isinstance(c.granularity, str) else "group"


def _quant_coverage() -> tuple:
    out = [CoverageClass(f"kind:{k}", _QT1, lambda c, k=k: k in c.kinds) for k in GROUP_KINDS]
    out += [CoverageClass(f"granularity:{g}", _QT1, lambda c, g=g: _granularity_kind(c) == g)
            for g in ("tensor", "channel", "group")]
    out += [
        CoverageClass("several groups per row", _QT1,
                      lambda c: isinstance(c.granularity, int) and c.K // c.granularity >= 2 and c.N >= 2),
        CoverageClass("group of one", _QT1, lambda c: c.granularity == 1),
        CoverageClass("a group of subnormals only", _QT1, lambda c: "subnormal" in c.kinds and _group_size(c) <= 2),
        CoverageClass("odd K", _QT1, lambda c: c.K % 2 == 1),
        CoverageClass("N = 1", _QT1, lambda c: c.N == 1),
        CoverageClass("M = 1", _QT1, lambda c: c.M == 1),
        CoverageClass("M > 16", _QT1, lambda c: c.M > 16),
    ]
    out += [CoverageClass(f"bits:{b}", _QT1, lambda c, b=b: c.bits == b) for b in range(2, 9)]
    return tuple(out)


#: The quantization contract's coverage table. Observations are the quantize calls' cases:
#: objects with ``N``, ``K``, ``bits``, ``granularity``, ``kinds`` (the GROUP_KINDS its cells
#: cycle through) and ``M`` (the rows of x in the product laws), as
#: inference_conformance.properties.quantization.cases.QCase.
COVERAGE = _quant_coverage()


def _valid_qw(impl, w):
    """The implementation's own quantized weight of ``w``: 4 bits in groups of 4, else 8 bits
    per channel (NotImplementedError where it refuses both)."""
    for bits, gran in ((4, 4), (8, "channel")):
        try:
            return impl.quantize(w, bits=bits, granularity=gran)
        except NotImplementedError:
            continue
    raise NotImplementedError(f"{impl!r} refuses 4 bits in groups of 4 and 8 bits per channel")


def invalid(device: str) -> list[InvalidCall]:
    """The calls this contract documents as invalid, with the argument each message must name:
    w (4, 8) and x (3, 8) in float32; matmul calls get the implementation's own valid qw."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 8, generator=g).to(device)
    x = torch.randn(3, 8, generator=g).to(device)
    quantize = [  # (what, w, bits, granularity, raises, argument)
        ("bits-1", w, 1, "channel", ValueError, "bits"),
        ("bits-9", w, 9, "channel", ValueError, "bits"),
        ("bits-a-string", w, "4", "channel", TypeError, "bits"),
        ("bits-a-float", w, 4.0, "channel", TypeError, "bits"),
        ("bits-true", w, True, "channel", TypeError, "bits"),
        ("group-size-not-dividing-k", w, 4, 3, ValueError, "granularity"),
        ("group-size-0", w, 4, 0, ValueError, "granularity"),
        ("unknown-granularity", w, 4, "row", ValueError, "granularity"),
        ("float-granularity", w, 4, 4.0, TypeError, "granularity"),
        ("bool-granularity", w, 4, True, TypeError, "granularity"),
        ("w-1-d", w[0], 4, "channel", ValueError, "w"),
        ("w-empty", w[:, :0], 4, "channel", ValueError, "w"),
        ("w-integer", w.int(), 4, "channel", TypeError, "w"),
        ("w-not-a-tensor", w.tolist(), 4, "channel", TypeError, "w"),
        ("w-with-nan", torch.where(w > 0, w, float("nan")), 4, "channel", ValueError, "w"),
    ]
    out = [InvalidCall(what, (ww,), {"bits": bits, "granularity": gran}, (exc,), argument)
           for what, ww, bits, gran, exc, argument in quantize]
    matmul = [  # (what, x, raises, argument); x's dtype: the text says ValueError, validate_matmul TypeError
        ("x-with-the-wrong-k", x[:, :-1], (ValueError,), "x"),
        ("x-of-another-dtype", x.double(), (TypeError, ValueError), "x"),
        ("x-1-d", x[0], (ValueError,), "x"),
        ("x-not-a-tensor", x.tolist(), (TypeError,), "x"),
    ]
    out += [InvalidCall(what, lambda impl, xx=xx: (xx, _valid_qw(impl, w)), raises=exc, argument=argument,
                        function="matmul") for what, xx, exc, argument in matmul]
    out += [InvalidCall("dequantize-a-raw-weight", (w,), raises=(TypeError,), argument="qw", function="dequantize"),
            InvalidCall("matmul-of-a-raw-weight", (x, w), raises=(TypeError,), argument="qw", function="matmul")]
    return out


CONTRACT = Contract(
    technique="quantization",
    functions=("quantize", "dequantize", "matmul"),
    doc=__doc__,
    cases=cases,
    invalid=invalid,
    rules={"quant-matmul": QUANT_MATMUL_RULE},
    returns={"dequantize": torch.Tensor, "matmul": torch.Tensor},
)
