"""QT-1's per-element bound of the ``quantization`` contract (lecture 001 §5.1): s/2 of the
contract's step (``conformance/contracts/quantization.py`` :func:`step`) plus the stored scale's
and the output dtype's rounding (:func:`half_step_bound`), and the schemes an implementation may
declare whose step is not the contract's (:data:`SCHEMES`: full-range absmax, llama.cpp's Q8_0
and Q4_0), each with the bound it promises.
"""
from __future__ import annotations

import torch

from inference_conformance.conformance.contracts.quantization import SCALE_SLACK, step, validate_quantize


#: Schemes an implementation may declare (attribute ``scheme``) whose step is not the contract's;
#: QT-1 then checks the bound the scheme promises (:func:`half_step_bound`), and QT-2 (the absmax
#: claim) reads "differs by design". Name -> what it is.
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
