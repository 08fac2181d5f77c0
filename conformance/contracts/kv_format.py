"""The ``kv_format`` contract: a KV cache held in a quantized format (claim QT-12; lecture 001 §5.4;
Liu et al. 2024, KIVI; Micikevicius et al. 2022 for FP8).

    quantize_kv(k, v, *, format: KVFormat) -> stored
    dequantize_kv(stored) -> (k_hat, v_hat)

- ``k``, ``v``: the keys and values of a cache, (B, Hkv, T, D) each (B sequences, Hkv KV heads,
  T tokens, head dim D; sizes as in :mod:`inference_conformance.conformance.contracts.glossary`),
  one dtype of float64, float32, float16, bfloat16, on one device (cpu or cuda), any strides.
- ``format``: a :class:`inference_conformance.conformance.contracts.quantization.kv.KVFormat`, a
  frozen dataclass made by ``kv_format(kind, residual=0, group=1)`` (ValueError naming the field
  otherwise); ``KV_FORMATS`` maps ``name`` to the usual ones ("int8", "int4_kivi_r8_g8",
  "fp8_e4m3fn", "fp8_e5m2"). Its fields:

  - ``kind``: str, the number format: "int8", "int4_kivi", "fp8_e4m3fn" (F = 448) or
    "fp8_e5m2" (F = 57344);
  - ``residual``: int >= 0, in tokens: R, the most recent tokens held in full precision
    (int4_kivi only; 0 for every other kind);
  - ``group``: int >= 1, in tokens: G, the tokens sharing one key scale per channel and head
    (int4_kivi only; 1 for every other kind);
  - ``name`` (read-only): str, the kind, or "int4_kivi_r{R}_g{G}";
  - ``code_bits`` (read-only): int, bits per stored code: 8 (int8, FP8) or 4 (int4_kivi).

  What each kind computes: ``kind`` "int8": every token's keys and values quantized per token
  and head, absmax over D (step s = max_d |x_t,h| / 127, codes round(x / s) in -127..127); an
  FP8 kind: per token and head, scale s = max_d |x_t,h| / F, codes the FP8 cast of x / s (round
  to nearest even, see the ``fp8_cast`` contract); "int4_kivi" (KIVI): keys per channel over
  groups of ``group`` tokens (step max over the group's tokens of |x[t, d]| / 7, one per channel
  d and head), values per token and head (max_d |x| / 7), codes in -7..7; the most recent
  ``residual`` tokens, and the tokens of an incomplete group, held in full precision: of T
  tokens the first floor(max(T - residual, 0) / group) · group are quantized
  (``kv_quantized_tokens``).
- ``stored``: any object the implementation chooses (tensors, tuples, lists, dicts, dataclasses
  of them): what the cache holds. The suite measures the bytes held from the tensors reachable in
  it (numel x element size; nothing declared is read) and ``dequantize_kv`` must accept it.
- ``dequantize_kv(stored)``: (k_hat, v_hat), (B, Hkv, T, D) each, k's dtype and device: every value
  rebuilt from its code and scale, the full-precision tokens exactly as given.

What an implementation must meet (each a law over every registered implementation):

- every element within QT-12's per-value bound (``quantization.kv.kv_bound``): half a step of its
  own token and head (int8, int4 values), of its channel's group (int4 keys) or half an FP8 ulp at
  x / s times s, with 2^-12 of slack for a stored scale and the output dtype's rounding; tokens in
  full precision exact. So the scale's granularity is part of the format: a scale shared by the
  heads of a token, or by the tokens of a group where the format has one per channel, or no scale
  for FP8, fails on inputs whose heads, channels or magnitudes differ.
- attention over the cache (each query sees token t as a decode engine holds it then: quantized
  once t's group is complete) within QT-12's attention bound (``quantization.kv.attention_bound``).
- the bytes held at most the format's size (:func:`format_bytes`): ceil(bits / 8) per code pair
  packed (8 bits per int8 / FP8 code, 4 per int4 code, two per byte), at most 8 bytes per scale
  at the format's granularity, the full-precision tokens at their dtype's size.

Invalid arguments raise, before anything is computed (:func:`validate`), ``TypeError`` (k or v
not a tensor or of another dtype, k and v of different dtypes, format not a KVFormat) or
``ValueError`` (k not 4-D, v of another shape, another device, or a device other than cpu or
cuda), naming the argument. An implementation may raise ``NotImplementedError`` for a format, a
dtype or a device it does not support: "unsupported", never a pass.

Oracle: the float64 reference (``inference_conformance.reference.kv_format``); the bounds are the
contract's own functions, from the input alone.

Claims checked against this contract: QT-12. Sources: Liu et al. 2024 (KIVI: keys per channel,
values per token, a full-precision residual); lecture 001 §5.4; KV-5 for the bytes.
"""
from __future__ import annotations

import torch

from inference_conformance.conformance.contracts.quantization.kv import (  # noqa: F401 - re-exported
    KV_FORMATS,
    KVFormat,
    kv_format,
    kv_quantized_tokens,
)
from inference_conformance.conformance.coverage import CoverageClass
from inference_conformance.conformance.registry import Contract, InvalidCall

#: Input dtypes of the contract.
DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
#: The most bytes one stored scale may take (a float64 scale).
MAX_SCALE_BYTES = 8


def validate(k, v, format) -> tuple[int, int, int, int]:
    """Check one quantize_kv call; return (B, H, T, D). Raises TypeError (k or v not a tensor or
    not one of :data:`DTYPES`, different dtypes, format not a KVFormat) or ValueError (k not 4-D,
    v of another shape or device, a device other than cpu or cuda), naming the argument."""
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor (B, H, T, D), got {type(t).__name__}")
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} must be float64, float32, float16 or bfloat16, got {t.dtype}")
    if v.dtype != k.dtype:
        raise TypeError(f"v has dtype {v.dtype}, k {k.dtype}: k and v must share one dtype")
    if k.device.type not in ("cpu", "cuda"):
        raise ValueError(f"k must be on a cpu or cuda device, got {k.device}")
    if v.device != k.device:
        raise ValueError(f"v is on {v.device}, k on {k.device}: k and v must be on one device")
    if k.dim() != 4:
        raise ValueError(f"k must have 4 dims (B, H, T, D), got shape {tuple(k.shape)}")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    if not isinstance(format, KVFormat):
        raise TypeError(f"format must be a KVFormat (conformance.contracts.quantization.kv.kv_format(...)), "
                        f"got {type(format).__name__}")
    return tuple(k.shape)


def format_bytes(B: int, H: int, T: int, D: int, fmt: KVFormat, dtype: torch.dtype) -> int:
    """The most bytes a cache of k and v (B, H, T, D) in ``fmt`` may hold: the quantized tokens'
    codes packed (a row of D codes takes ceil(D · bits / 8) bytes), their scales at
    :data:`MAX_SCALE_BYTES` each (int8, FP8: one per token and head for keys and for values;
    KIVI: one per group, channel and head for keys, one per token and head for values), the
    others at ``dtype``'s size."""
    Tq = kv_quantized_tokens(T, fmt)
    codes = 2 * B * H * Tq * -(-D * fmt.code_bits // 8)
    key_scales = B * H * (Tq // fmt.group) * D if fmt.kind == "int4_kivi" else B * H * Tq
    scales = (key_scales + B * H * Tq) * MAX_SCALE_BYTES
    return codes + scales + 2 * B * H * (T - Tq) * D * dtype.itemsize


def _kv(g, shape, device, dtype):
    return tuple(torch.randn(shape, generator=g, dtype=torch.float64).to(device=device, dtype=dtype) for _ in "kv")


def cases(seed: int, device: str) -> list[tuple[tuple, dict]]:
    """Small valid quantize_kv calls for the generic checks: each usual format, float32 and a
    float64 KIVI cache with a residual."""
    g = torch.Generator().manual_seed(seed)
    return [(_kv(g, shape, device, dt), {"format": KV_FORMATS[name]})
            for shape, dt, name in (((2, 2, 9, 8), torch.float32, "int8"),
                                    ((1, 3, 21, 6), torch.float64, "int4_kivi_r8_g8"),
                                    ((1, 2, 5, 16), torch.float32, "fp8_e4m3fn"),
                                    ((2, 1, 4, 3), torch.float32, "fp8_e5m2"))]


def invalid(device: str) -> list[InvalidCall]:
    """The calls this contract documents as invalid (float32 k, v (1, 2, 4, 8), int8 unless the
    call is about the format), with the argument each message must name."""
    k, v = _kv(torch.Generator().manual_seed(0), (1, 2, 4, 8), device, torch.float32)
    ok = {"format": KV_FORMATS["int8"]}
    calls = [  # (what, args, kwargs, raises, argument)
        ("k-a-list", (k.tolist(), v), {}, TypeError, "k"),
        ("v-int32", (k, v.int()), {}, TypeError, "v"),
        ("dtypes-differ", (k, v.double()), {}, TypeError, "v"),
        ("k-3-dims", (k[0], v[0]), {}, ValueError, "k"),
        ("v-shape-differs", (k, v[:, :1]), {}, ValueError, "v"),
        ("v-on-meta", (k, v.to("meta")), {}, ValueError, "v"),
        ("format-a-string", (k, v), {"format": "int8"}, TypeError, "format"),
    ]
    return [InvalidCall(what, args, {**ok, **kw}, (exc,), argument) for what, args, kw, exc, argument in calls]


CONTRACT = Contract(
    technique="kv_format",
    functions=("quantize_kv", "dequantize_kv"),
    doc=__doc__,
    cases=cases,
    invalid=invalid,
)


# ----------------------------------------------------------------------------------------------
# coverage table: observations are the laws' cases (properties/kv_format/cases.py KVFCase: B, H,
# T, D, fmt (a KV_FORMATS name or "kivi:R:G"), kind, group (GQA))
# ----------------------------------------------------------------------------------------------

_VALUE = ("law_every_value_within_its_step",)
_ATTN = ("law_attention_within_its_bound",)
_BYTES = ("law_bytes_held_within_the_format",)


def _coverage() -> tuple:
    out = []
    for name in KV_FORMATS:
        out.append(CoverageClass(f"format {name}", _VALUE + _ATTN + _BYTES, lambda c, n=name: c.fmt == n))
    for kind, what in (("outlier_head", "one head 100x the others (a scale shared by the heads fails)"),
                       ("outlier_channel", "one channel 30x the others (a key scale per token fails for KIVI)"),
                       ("huge", "values ~1e3, past E4M3's 448 (FP8 with no scale saturates)"),
                       ("tiny", "values ~1e-4, E4M3's subnormals (FP8 with no scale flushes them)")):
        out.append(CoverageClass(f"{what}", _VALUE, lambda c, k=kind: c.kind == k))
    out += [
        CoverageClass("KIVI with fewer tokens than its residual (nothing quantized)", _VALUE + _BYTES,
                      lambda c: c.fmt.startswith(("int4_kivi", "kivi")) and c.T <= c.residual),
        CoverageClass("KIVI with an incomplete group past the residual", _VALUE + _BYTES,
                      lambda c: c.fmt.startswith("kivi") and (c.T - c.residual) % c.group_size != 0
                      and c.T > c.residual),
        CoverageClass("odd head dim D (an int4 row ends in half a byte)", _VALUE + _BYTES,
                      lambda c: c.D % 2 == 1),
        CoverageClass("GQA: more query heads than KV heads", _ATTN, lambda c: c.group > 1),
    ]
    return tuple(out)


#: The kv_format contract's coverage table (see :class:`CoverageClass`).
COVERAGE = _coverage()
