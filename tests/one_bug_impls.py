"""Outside implementations with one classic bug each, written apart from the bug zoo, for the
diagnosis tests (``tests/test_diagnosis.py``: ``--impl attention=tests.one_bug_impls:...``):

- :func:`top_left_attention`: the causal mask aligned top-left (query i sees keys j <= i, as
  torch's ``is_causal``), wrong whenever Tq < Tk;
- :func:`default_scale_attention`: the caller's ``scale`` dropped for the textbook 1/sqrt(D);
- :data:`floor_quantization`: absmax quantization rounding down (floor) instead of to nearest
  (``examples/my_quantization.py``'s quantizer with floor for its rounding).

Each is otherwise a correct implementation of its contract: the diagnosis must name the
known bug from the output alone.
"""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import torch

from inference_conformance.conformance.contracts.attention import validate


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


def _worked_example(name: str):
    """The module ``examples/<name>.py`` (the worked outside implementations; not a package)."""
    spec = importlib.util.spec_from_file_location(f"one_bug_{name}", Path(__file__).resolve().parents[1] / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: The worked quantization example (absmax, one int8 code per weight, float64 scales) with its
#: codes rounded down, floor(w / s), where the contract rounds to nearest.
floor_quantization = _worked_example("my_quantization").AbsMax(rounding=torch.floor)
