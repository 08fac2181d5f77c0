"""Outside implementations with one classic bug each, written apart from the bug zoo, for the
diagnosis tests (``tests/test_diagnosis.py``: ``--impl attention=tests.one_bug_impls:...``):

- :func:`top_left_attention`: the causal mask aligned top-left (query i sees keys j <= i, as
  torch's ``is_causal``), wrong whenever Tq < Tk;
- :func:`default_scale_attention`: the caller's ``scale`` dropped for the textbook 1/sqrt(D);
- :func:`three_bug_attention`: both of those and the ``sinks`` ignored, at once;
- :data:`floor_quantization`: absmax quantization rounding down (floor) instead of to nearest
  (``examples/my_quantization.py``'s quantizer with floor for its rounding);
- :data:`q4_0_any_bits`: llama.cpp's Q4_0 blocks (4-bit codes) whatever ``bits`` it is asked,
  declaring ``scheme = "gguf-q4_0"`` (a declaration the suite accepts at 4 bits in blocks of 32
  only; :data:`q4_0` is the same quantizer refusing other widths, a correct one);
- :data:`q4_0_bf16_codes`: Q4_0 whose codes are rounded from w / s computed in bfloat16, not
  round-to-nearest of its own stored scale (the own-scale law's rounding defect);
- :data:`fp8_kv` (a correct lossy KV cache, FP8 per token and head, 2^-4 declared) and its bugs:
  :data:`fp8_kv_layer0` (every layer's attention reads layer 0's keys and values),
  :data:`fp8_kv_codes` (attention reads the codes without their scale) and
  :data:`fp8_kv_undeclared` (no per-value error declared), :data:`fp8_kv_in_model_dtype`
  (2^-4 declared on values its footprint says are held in the model's dtype).

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


def three_bug_attention(q, k, v, *, causal, scale, window=None, softcap=None, sinks=None):
    """Attention with three known bugs at once: the causal (and window) mask aligned top-left
    (query i sees keys i - W < j <= i), the caller's ``scale`` dropped for 1/sqrt(D), and the
    ``sinks`` ignored; the soft-cap is right."""
    validate(q, k, v, causal, scale, window, softcap, sinks)
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    group = q.shape[1] // k.shape[1]
    keys = k.to(work).repeat_interleave(group, dim=1)
    values = v.to(work).repeat_interleave(group, dim=1)
    logits = torch.matmul(q.to(work), keys.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    if causal:
        i = torch.arange(q.shape[2], device=q.device)[:, None]
        j = torch.arange(k.shape[2], device=q.device)[None, :]
        hidden = (j > i) | ((j <= i - window) if window is not None else False)
        logits = logits.masked_fill(hidden, -math.inf)
    return torch.matmul(torch.softmax(logits, dim=-1), values).to(q.dtype)


def _worked_example(name: str):
    """The module ``examples/<name>.py`` (the worked outside implementations; not a package)."""
    spec = importlib.util.spec_from_file_location(f"one_bug_{name}", Path(__file__).resolve().parents[1] / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: The worked quantization example (absmax, one int8 code per weight, float64 scales) with its
#: codes rounded down, floor(w / s), where the contract rounds to nearest.
floor_quantization = _worked_example("my_quantization").AbsMax(rounding=torch.floor)


class Q4_0:
    """llama.cpp's Q4_0 in torch: blocks of 32 along K, d = m / -8 for the block's signed extreme
    m (float32), codes floor(w / d + 8.5) clipped to 0..15 (8 is zero), d stored in float16;
    ``stored(qw)`` hands back (code - 8, the stored d) per element. ``any_bits``: quantizes at
    whatever ``bits`` (the bug); ``code_dtype``: the dtype w / d is formed in."""

    scheme = "gguf-q4_0"

    def __init__(self, any_bits: bool = False, code_dtype=torch.float32):
        self.any_bits, self.code_dtype = any_bits, code_dtype

    def quantize(self, w, *, bits, granularity):
        from inference_conformance.conformance.contracts.quantization import validate_quantize

        shape = validate_quantize(w, bits, granularity)
        if granularity != 32 or not (self.any_bits or shape.bits == 4):
            raise NotImplementedError(f"Q4_0 is 4 bits in blocks of 32, not {bits} bits, granularity {granularity!r}")
        blocks = w.detach().to(torch.float32).reshape(shape.N, shape.K // 32, 32)
        m = torch.gather(blocks, -1, blocks.abs().argmax(dim=-1, keepdim=True))
        d = m / -8
        if bool((d.abs() > 65504).any()):
            raise NotImplementedError("a block's scale overflows float16")
        inv = torch.where(d != 0, 1 / torch.where(d != 0, d, 1.0), 0.0)
        x = (blocks.to(self.code_dtype) * inv.to(self.code_dtype)).float()
        codes = torch.floor(x + 8.5).clamp(0, 15).to(torch.uint8)
        return {"codes": codes, "d": d.to(torch.float16), "shape": (shape.N, shape.K), "dtype": w.dtype}

    def stored(self, qw):
        q = (qw["codes"].to(torch.int64) - 8).reshape(qw["shape"])
        return q, qw["d"].to(torch.float64).expand(*qw["codes"].shape).reshape(qw["shape"])

    def dequantize(self, qw):
        if not isinstance(qw, dict) or "codes" not in qw:
            raise TypeError("qw must be what quantize returned")
        return ((qw["codes"].float() - 8) * qw["d"].float()).reshape(qw["shape"]).to(qw["dtype"])

    def matmul(self, x, qw):
        w = self.dequantize(qw)
        return x @ w.T


q4_0 = Q4_0()
q4_0_any_bits = Q4_0(any_bits=True)
q4_0_bf16_codes = Q4_0(code_dtype=torch.bfloat16)


# ------------------------------------------------------------------------- lossy KV caches
def _fp8_codes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (B, Hkv, T, D) as float8_e4m3fn codes with one float32 absmax scale per token and head
    (s = max|x| / 448): (codes, s (B, Hkv, T, 1)); codes × s is within 2^-4 |x| (and 2^-10
    max|x| near zero)."""
    x32 = x.float()
    s = x32.abs().amax(dim=-1, keepdim=True) / 448
    s = torch.where(s > 0, s, torch.ones_like(s))
    return (x32 / s).to(torch.float8_e4m3fn), s


class _Fp8Storage:
    """A KV storage (``new_cache`` form) holding float8_e4m3fn codes and their float32 scales
    (:func:`_fp8_codes`), concatenated along T per layer. ``read``: what attention is handed:
    "right" (the codes times their scales, in the model's dtype), "layer0" (every layer reads
    layer 0's keys and values: the bug) or "codes" (the codes, the scale never applied on the
    way back: the bug)."""

    def __init__(self, cfg, batch, max_seq_len, dtype, device, read: str = "right"):
        self.codes, self.scales, self.read, self.dtype = [None] * cfg.n_layers, [None] * cfg.n_layers, read, dtype

    def _append(self, layer, k, v):
        new = [_fp8_codes(k), _fp8_codes(v)]
        if self.codes[layer] is None:
            self.codes[layer], self.scales[layer] = [c for c, _ in new], [s for _, s in new]
        else:
            self.codes[layer] = [torch.cat([old, c], dim=2) for old, (c, _) in zip(self.codes[layer], new)]
            self.scales[layer] = [torch.cat([old, s], dim=2) for old, (_, s) in zip(self.scales[layer], new)]

    def held(self, layer):
        return tuple((c.float() * s).to(self.dtype) for c, s in zip(self.codes[layer], self.scales[layer]))

    def update(self, k, v, layer):
        self._append(layer, k, v)
        if self.read == "layer0":
            return self.held(0)
        if self.read == "codes":
            return tuple(c.to(self.dtype) for c in self.codes[layer])
        return self.held(layer)


def _fp8_kv(read: str, declared: bool = True, in_model_dtype: bool = False):
    from inference_conformance.conformance.contracts.kv_cache import Footprint
    from inference_conformance.optimized.kv_cache.storage import storage_engine

    fp = Footprint("padded", value_rel_error=2.0 ** -4 if declared else None, bytes_per_value=None if in_model_dtype else 1,
                   bytes_bound=not in_model_dtype, why="FP8 e4m3 values, one float32 absmax scale per token and head")
    return storage_engine(lambda cfg, batch, max_seq_len, dtype, device: _Fp8Storage(cfg, batch, max_seq_len, dtype,
                                                                                      device, read), fp)


#: A correct lossy cache: FP8-rounded keys and values, per-value error 2^-4 declared.
fp8_kv = _fp8_kv("right")
#: The same, whose attention at every layer reads layer 0's keys and values.
fp8_kv_layer0 = _fp8_kv("layer0")
#: The same, whose attention reads the FP8 codes back without their scale.
fp8_kv_codes = _fp8_kv("codes")
#: The correct FP8 cache declaring no per-value error.
fp8_kv_undeclared = _fp8_kv("right", declared=False)
#: The correct FP8 cache declaring its values held in the model's dtype (no bytes per value):
#: 2^-4 is no rounding of those bytes.
fp8_kv_in_model_dtype = _fp8_kv("right", in_model_dtype=True)
