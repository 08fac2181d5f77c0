"""Outside implementations with one classic bug each, written apart from the bug zoo, for the
diagnosis tests (``tests/test_diagnosis.py``: ``--impl attention=tests.one_bug_impls:...``):

- :func:`top_left_attention`: the causal mask aligned top-left (query i sees keys j <= i, as
  torch's ``is_causal``), wrong whenever Tq < Tk;
- :func:`default_scale_attention`: the caller's ``scale`` dropped for the textbook 1/sqrt(D);
- :data:`floor_quantization`: absmax quantization rounding down (floor) instead of to nearest.

Each is otherwise a plain, correct implementation of its contract: the diagnosis must name the
known bug from the output alone.
"""
from __future__ import annotations

import math

import torch

from inference_conformance.conformance.contracts.attention import validate
from inference_conformance.conformance.contracts.quantization import validate_matmul, validate_quantize


def _softmax_attention(q, k, v, *, causal: bool, scale: float, diagonal: int):
    """softmax(scale · q kᵀ) v over repeated KV heads; with ``causal``, query i sees keys
    j <= i + ``diagonal``. q (B, Hq, Tq, D), k and v (B, Hkv, Tk, D) -> q's shape and dtype."""
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    group = q.shape[1] // k.shape[1]
    keys = k.to(work).repeat_interleave(group, dim=1)
    values = v.to(work).repeat_interleave(group, dim=1)
    logits = torch.matmul(q.to(work), keys.transpose(-1, -2)) * scale
    if causal:
        Tq, Tk = q.shape[2], k.shape[2]
        hidden = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).triu(diagonal + 1)
        logits = logits.masked_fill(hidden, -math.inf)
    return torch.matmul(torch.softmax(logits, dim=-1), values).to(q.dtype)


def top_left_attention(q, k, v, *, causal, scale):
    """Attention whose causal mask is aligned top-left: query i sees keys j <= i."""
    validate(q, k, v, causal, scale)
    return _softmax_attention(q, k, v, causal=causal, scale=scale, diagonal=0)


def default_scale_attention(q, k, v, *, causal, scale):
    """Attention that drops the caller's ``scale`` for 1/sqrt(D) (masks bottom-right aligned)."""
    validate(q, k, v, causal, scale)
    return _softmax_attention(q, k, v, causal=causal, scale=1.0 / math.sqrt(q.shape[-1]),
                              diagonal=k.shape[2] - q.shape[2])


class FloorQuantization:
    """Symmetric absmax quantization, one int8 code per weight, codes = floor(w / s) (the bug:
    round to nearest is the contract's); s = max|w_group| / (2^(b-1) - 1), kept in float64."""

    symmetric = True

    def quantize(self, w, *, bits, granularity):
        shape = validate_quantize(w, bits, granularity)
        top = 2 ** (shape.bits - 1) - 1
        groups = w.double().reshape(1, -1) if granularity == "tensor" else w.double().reshape(-1, shape.group_size)
        s = groups.abs().amax(dim=1, keepdim=True) / top
        codes = torch.floor(groups / torch.where(s > 0, s, 1.0)).clamp(-top, top).to(torch.int8)
        return (codes, s, (shape.N, shape.K), w.dtype)

    def dequantize(self, qw):
        if not (isinstance(qw, tuple) and len(qw) == 4):
            raise TypeError("qw must be what FloorQuantization.quantize returned")
        codes, s, size, dtype = qw
        return (codes.double() * s).reshape(size).to(dtype)

    def matmul(self, x, qw):
        w = self.dequantize(qw)
        validate_matmul(x, K=w.shape[1], dtype=w.dtype, device=w.device)
        return torch.matmul(x, w.T)


floor_quantization = FloorQuantization()
