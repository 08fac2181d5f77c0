"""QT-1's per-element bound of the ``quantization`` contract (lecture 001 §5.1): s/2 of the
contract's step (``conformance/contracts/quantization/contract.py`` :func:`step`) plus the stored scale's
and the output dtype's rounding (:func:`half_step_bound`), and the schemes an implementation may
declare whose step is not the contract's (:data:`SCHEMES`: full-range absmax, llama.cpp's Q8_0
and Q4_0), each with the bound it promises.
"""
from __future__ import annotations

import torch

from inference_conformance.conformance.contracts.quantization.contract import SCALE_SLACK, step, validate_quantize


#: Schemes an implementation may declare (attribute ``scheme``) whose step is not the contract's.
#: A declaration is verified, never trusted: it is accepted only for the calls the scheme defines
#: (:func:`scheme_defines`; elsewhere the contract's own step judges the result) and only from an
#: implementation that hands back what it stored (``stored(qw)``: codes and scales), whose scale
#: must follow the scheme's formula and whose codes and dequantized values must follow that stored
#: scale (the own-scale law, :func:`own_scale_targets`). Then QT-1 checks the bound the scheme
#: promises (:func:`half_step_bound`) and QT-2 (the absmax claim) does not apply. Name -> what it is.
SCHEMES = {
    "absmax-full-range": "symmetric over the whole code range -2^(b-1)..2^(b-1) - 1: s = max|w| / (2^(b-1) - 1/2) "
                         "(torchao, compressed-tensors); within s/2 of that step",
    "gguf-q8_0": "llama.cpp Q8_0: blocks of 32, s = max|w| / 127, codes from the float32 s, the float16 s stored: "
                 "within s/2 + 127 x the float16 rounding of s",
    "gguf-q4_0": "llama.cpp Q4_0: blocks of 32, s = |m| / 8 for the block's signed extreme m, codes 0..15 around 8: "
                 "within s/2, or |w| - 7 s on the side opposite m (clipped at 7 steps), + 8 x the float16 "
                 "rounding of s",
}


#: float16's relative rounding and half its subnormal spacing (a gguf block's stored scale).
_FP16_ROUNDING = (2.0 ** -11, 2.0 ** -25)


def _scheme_step(w: torch.Tensor, bits: int, granularity, scheme: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, extra) per element for a declared scheme: its step and what it adds to s/2."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {sorted(SCHEMES)}, got {scheme!r}")
    shape = validate_quantize(w, bits, granularity)
    w64 = w.detach().to(torch.float64)
    groups = w64.reshape(1, 1, -1) if granularity == "tensor" else w64.reshape(shape.N, shape.groups_per_row,
                                                                             shape.group_size)
    amax = groups.abs().amax(dim=-1, keepdim=True)
    if scheme == "absmax-full-range":
        s = (amax / (2 ** (shape.bits - 1) - 0.5)).expand_as(groups)
        extra = torch.zeros_like(s)
    else:
        steps = 127 if scheme == "gguf-q8_0" else 8
        s = (amax / steps).expand_as(groups)
        extra = steps * torch.maximum(s * _FP16_ROUNDING[0], torch.full_like(s, _FP16_ROUNDING[1]))
        if scheme == "gguf-q4_0":
            m = torch.gather(groups, -1, groups.abs().argmax(dim=-1, keepdim=True))      # the signed extreme
            opposite = (groups * m) < 0
            extra = extra + torch.where(opposite, (groups.abs() - 7 * s - s / 2).clamp(min=0), 0.0)
        extra = extra + torch.finfo(torch.float32).eps / 2 * (groups.abs() + s)          # float32 dequantize
    return s.reshape(shape.N, shape.K), extra.reshape(shape.N, shape.K)


def half_step_bound(w: torch.Tensor, bits: int, granularity, symmetric: bool = True, g_idx=None,
                    scheme: str | None = None) -> torch.Tensor:
    """QT-1's bound per element, (N, K) float64: s/2 (1 + 2^-12) plus the output dtype's own
    rounding: half an ulp at |w| + s/2, plus half its subnormal spacing (a group made of
    subnormals comes back on the dtype's subnormal grid; a float32 scale of such a group is
    itself subnormal). A declared ``scheme`` (a key of :data:`SCHEMES`) replaces s by its own
    step and adds what it promises beyond s/2; ValueError for an unknown one."""
    if scheme is not None:
        s, extra = _scheme_step(w, bits, granularity, scheme)
    else:
        s, extra = step(w, bits, granularity, symmetric, g_idx), 0.0
    fin = torch.finfo(w.dtype)
    spacing = fin.tiny * fin.eps                 # the dtype's subnormal spacing (its smallest step)
    return (s / 2 * (1 + SCALE_SLACK) + extra + fin.eps / 2 * (w.detach().abs().to(torch.float64) + s / 2 + extra)
            + spacing / 2)


# ------------------------------------------------------------------ declared schemes, verified
#: What each declared scheme defines: the bit widths (None: 2..8), the group sizes (None: every
#: granularity), the scale formula's extreme in steps (s = max|w| / steps, or for Q4_0 the signed
#: extreme m: s = m / -8), the code range, the stored scale's rounding (relative, absolute: beyond
#: w's own dtype, which a scale may be kept in) and by how much the scale the codes were computed
#: with may differ from the stored one (relative: gguf codes with the float32 scale, stores float16).
SCHEME_DEFS = {
    "absmax-full-range": dict(bits=None, groups=None, steps=lambda b: 2 ** (b - 1) - 0.5, signed=False,
                              codes=lambda b: (-2 ** (b - 1), 2 ** (b - 1) - 1), scale_rounding=(0.0, 0.0),
                              coded_with=0.0),
    "gguf-q8_0": dict(bits=(8,), groups=(32,), steps=lambda b: 127.0, signed=False, codes=lambda b: (-128, 127),
                      scale_rounding=(2.0 ** -11 + 2.0 ** -23, 2.0 ** -25), coded_with=2.0 ** -11),
    "gguf-q4_0": dict(bits=(4,), groups=(32,), steps=lambda b: -8.0, signed=True, codes=lambda b: (-8, 7),
                      scale_rounding=(2.0 ** -11 + 2.0 ** -23, 2.0 ** -25), coded_with=2.0 ** -11),
}
#: float32's relative rounding: the arithmetic every scheme's code and product may use.
_FP32 = 2.0 ** -24


def scheme_defines(scheme: str, bits: int, granularity) -> bool:
    """Whether the declared ``scheme`` (a key of :data:`SCHEMES`) defines a quantize call at
    ``bits`` and ``granularity``: a declaration is accepted for those calls only (elsewhere the
    contract's own step judges the result). ValueError for an unknown scheme."""
    if scheme not in SCHEME_DEFS:
        raise ValueError(f"scheme must be one of {sorted(SCHEMES)}, got {scheme!r}")
    d = SCHEME_DEFS[scheme]
    return (d["bits"] is None or bits in d["bits"]) and (d["groups"] is None or granularity in d["groups"])


def scheme_scale(w: torch.Tensor, bits: int, granularity, scheme: str) -> torch.Tensor:
    """The scale the declared ``scheme``'s formula gives each element's group, (N, K) float64
    (signed for gguf-q4_0: the block's signed extreme / -8; 0 for an all-zero group)."""
    shape = validate_quantize(w, bits, granularity)
    d = SCHEME_DEFS[scheme]
    w64 = w.detach().to("cpu", torch.float64)
    groups = w64.reshape(1, 1, -1) if granularity == "tensor" else w64.reshape(shape.N, shape.groups_per_row,
                                                                             shape.group_size)
    if d["signed"]:
        extreme = torch.gather(groups, -1, groups.abs().argmax(dim=-1, keepdim=True))
    else:
        extreme = groups.abs().amax(dim=-1, keepdim=True)
    return (extreme / d["steps"](shape.bits)).expand_as(groups).reshape(shape.N, shape.K)


def own_scale_targets(w: torch.Tensor, bits: int, granularity, scheme: str, scale: torch.Tensor):
    """The own-scale law's targets for a declared scheme, given the implementation's stored
    ``scale`` (N, K) (each element's group's): ``(scale_ref, scale_bound, x, code_bound)``, all
    (N, K) float64. ``scale_ref`` is the formula's scale (:func:`scheme_scale`); ``scale_bound``
    its allowed distance (the scheme's storage rounding plus one ulp of w's dtype: a scale may be
    kept in w's dtype; unbounded for an all-zero group, whose codes must be 0). ``x`` is
    w / stored scale clipped to the scheme's code range (0 where the scale is 0): each code must
    lie within ``code_bound`` of it, 1/2 (round to nearest) plus the difference between the scale
    the scheme codes with and the stored one (``coded_with``) and float32's rounding, in steps."""
    d = SCHEME_DEFS[scheme]
    shape = validate_quantize(w, bits, granularity)
    ref = scheme_scale(w, bits, granularity, scheme)
    fin = torch.finfo(w.dtype)
    rel, absolute = d["scale_rounding"]
    scale_bound = ref.abs() * (rel + fin.eps) + absolute + fin.tiny * fin.eps
    scale_bound = torch.where(ref == 0, torch.full_like(ref, float("inf")), scale_bound)
    s = scale.detach().to("cpu", torch.float64)
    w64 = w.detach().to("cpu", torch.float64)
    lo, hi = d["codes"](shape.bits)
    x = torch.where(s != 0, w64 / torch.where(s != 0, s, 1.0), 0.0).clamp(lo, hi)
    code_bound = 0.5 + x.abs() * (d["coded_with"] + 4 * _FP32)
    if d["coded_with"]:                      # a stored scale below the storage's normal range
        code_bound = code_bound + x.abs() * absolute / torch.where(s != 0, s.abs(), 1.0)
    return ref, scale_bound, x, code_bound


def product_bound(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """How far dequantize may be from code x stored scale, (N, K) float64: half an ulp of the
    output ``dtype`` and of float32 (a product formed in float32, then cast) at |q s|, plus half
    of each one's subnormal spacing."""
    fin, f32 = torch.finfo(dtype), torch.finfo(torch.float32)
    qs = (q.to("cpu", torch.float64) * scale.to("cpu", torch.float64)).abs()
    return qs * (fin.eps + f32.eps) / 2 + (fin.tiny * fin.eps + f32.tiny * f32.eps) / 2
