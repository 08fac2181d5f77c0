"""The ``attention`` contract: exact scaled-dot-product attention (FlashAttention and friends).

    attention(q, k, v, *, causal: bool, scale: float,
              window: int | None = None, softcap: float | None = None, sinks: Tensor | None = None) -> Tensor

Shapes: ``q`` (B, Hq, Tq, D); ``k``, ``v`` (B, Hkv, Tk, D) with Hq a multiple of Hkv; query head
``h`` attends KV head ``h // (Hq // Hkv)`` (grouped-query attention; Hkv = Hq is multi-head,
Hkv = 1 multi-query). Returns (B, Hq, Tq, D) in ``q``'s dtype and on ``q``'s device:

    out[b, h, i] = sum_j softmax_j(scale * q[b, h, i] . k[b, g(h), j]) * v[b, g(h), j]

``causal=True`` requires Tq <= Tk and aligns the mask bottom-right: query ``i`` may attend key
``j`` iff ``j <= i + (Tk - Tq)`` (the last query sees every key; a decode step with Tq = 1 sees the
whole cache). ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)`` aligns the mask
top-left when Tq != Tk, so an adapter must build the mask itself (:func:`causal_mask`).

Supported inputs: D from 1 to 256, any Tq, Tk >= 1, dtypes float64 / float32 / float16 /
bfloat16 (q, k, v of one dtype, on one device; any strides). An implementation may raise
``NotImplementedError`` for a (dtype, D) it does not support: the suite reports that as
"unsupported", never as a pass. Invalid arguments raise ``TypeError`` (wrong type or dtype) or
``ValueError`` (wrong shape, device or value) naming the argument (:func:`validate`).

Scale: any finite real number, negative and zero included, whose magnitude the scores' dtype
can hold (float64 for float64 inputs, float32 for the others: |scale| <= 3.4e38; larger ones,
such as 1e40 with float32 inputs, raise ValueError naming ``scale``). Implementations must apply
it in that precision: a float64 call whose scale is rounded to float32 (what compiled Triton does
with a Python float kernel argument) is wrong by ~1e-8 and fails. When finite scores
(scale · q·k) exceed the float32 range for non-float64 inputs, the result is unspecified.

NaN: a NaN in the inputs is NaN in exactly the output rows that see it, and nowhere else. A NaN
anywhere in ``q[b, h, i]`` makes all of ``out[b, h, i]`` NaN; a NaN in ``k[b, g, j]`` makes NaN
all of the rows ``out[b, h, i]`` of the heads reading KV head ``g`` whose query may attend key
``j`` (all of them without ``causal``; ``j <= i + (Tk - Tq)`` with it); a NaN in
``v[b, g, j, d]`` makes component ``d`` of those rows NaN. Every other element is what it would
be without the NaN: a key the mask hides must not leak. (Only component ``d`` of the rows that
cannot see a NaN value is unspecified: a kernel may multiply its zero weight by it.) Returning
zeros for a NaN row, or NaN for a row that cannot see a NaN key, breaks the contract
(``properties/attention/laws.py``).

Options (claim FA-8; each keyword optional, ``None`` = off, the default):

- ``window`` (int W >= 1): a left sliding window, with ``causal=True`` only (ValueError naming
  ``window`` otherwise). Query ``i``, at the bottom-right aligned position i' = i + (Tk - Tq),
  sees the keys ``j`` with ``i' - W < j <= i'``: the W latest keys up to its own
  (:func:`window_mask`); W >= Tk is plain causal attention.
- ``softcap`` (a positive finite real c): the scores s = scale · q·k become ``c · tanh(s / c)``
  before the mask and the softmax (Gemma 2, Grok): every logit lies in (-c, c).
- ``sinks`` (a (Hq,) floating tensor on q's device, finite): one logit per query head (used as
  given: neither scaled nor capped) that joins every row's softmax denominator and attends to no
  value: ``out[b, h, i] = sum_j exp(s_j) v_j / (exp(sinks[h]) + sum_j exp(s_j))`` over the
  visible keys (gpt-oss, StreamingLLM's attention sink as a learned logit).

An implementation whose ``attention`` lacks the keyword (:func:`accepts_options`), or raises
``NotImplementedError`` for a value, is reported "unsupported" for the option, never a pass.
Wrong values raise ``TypeError`` or ``ValueError`` naming the option (:func:`validate_options`).

Names (B, Hq, Hkv, G, Tq, Tk, D) as in :mod:`inference_conformance.conformance.contracts.glossary`.

Claims checked against this contract: FA-3 (tiled = standard attention for every block size),
FA-6 (memory linear in T), FA-7 (split-KV decoding = unsplit), FA-8 (the options equal the float64
reference, in every kernel). Source: Dao et al. 2022
(FlashAttention), Dao 2023 (FlashAttention-2), lecture 001 §3; Beltagy et al. 2020 and Jiang et
al. 2023 (sliding window), Gemma Team 2024 (soft-capping), Xiao et al. 2023 and OpenAI 2025
(gpt-oss: sinks).
"""
from __future__ import annotations

import inspect
import math
import numbers
from dataclasses import dataclass

import torch

from inference_conformance.conformance.contracts.checks import check_kv, check_scale, check_tensor
from inference_conformance.conformance.coverage import CoverageClass
from inference_conformance.conformance.registry import Contract, InvalidCall

#: Dtypes of the contract (an implementation may still refuse one with NotImplementedError).
DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
#: Largest head dimension of the contract.
MAX_HEAD_DIM = 256


@dataclass(frozen=True)
class AttentionShape:
    """The sizes of one call: batch, query heads, KV heads, query length, key length, head dim."""

    B: int
    Hq: int
    Hkv: int
    Tq: int
    Tk: int
    D: int

    @property
    def group(self) -> int:
        """Query heads per KV head (Hq // Hkv)."""
        return self.Hq // self.Hkv


def validate(q, k, v, causal, scale, window=None, softcap=None, sinks=None) -> AttentionShape:
    """Check one call against the contract; return its sizes.

    Raises TypeError (not a tensor, unsupported or mixed dtypes, ``causal`` not a bool, ``scale``
    not a real number) or ValueError (wrong rank or sizes, mixed devices, D outside 1..256, empty
    lengths, causal with Tq > Tk, non-finite scale), each naming the argument; and for the
    options as :func:`validate_options` does.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, 4, "(B, H, T, D)", DTYPES, "attention")
    check_kv(q, k, v)
    B, Hq, Tq, D = q.shape
    Bk, Hkv, Tk, Dk = k.shape
    if Bk != B:
        raise ValueError(f"k/v batch size {Bk} differs from q batch size {B}")
    if Dk != D:
        raise ValueError(f"k/v head dim {Dk} differs from q head dim {D}")
    if B < 1 or Hq < 1 or Hkv < 1:
        raise ValueError(f"batch and head counts must be >= 1, got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if Hq % Hkv:
        raise ValueError(f"q heads ({Hq}) must be a multiple of k/v heads ({Hkv})")
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"head dim D must be in 1..{MAX_HEAD_DIM}, got {D}")
    if Tq < 1:
        raise ValueError(f"q length Tq must be >= 1, got {Tq}")
    if Tk < 1:
        raise ValueError(f"k/v length Tk must be >= 1, got {Tk}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a Python bool, got {type(causal).__module__}.{type(causal).__name__}")
    check_scale(scale, q.dtype)
    if causal and Tq > Tk:
        raise ValueError(f"causal attention needs Tq <= Tk (bottom-right mask), got Tq={Tq}, Tk={Tk}")
    validate_options(q, causal, window, softcap, sinks)
    return AttentionShape(B, Hq, Hkv, Tq, Tk, D)


#: The optional keywords of the attention contract (claim FA-8).
OPTIONS = ("window", "softcap", "sinks")


def validate_options(q, causal, window=None, softcap=None, sinks=None) -> None:
    """Check the options of a call as the module's docstring says (None is always valid; a
    softcap must also fit the scores' dtype); TypeError / ValueError naming the option."""
    if window is not None:
        if isinstance(window, bool) or not isinstance(window, numbers.Integral):
            raise TypeError(f"window must be an int >= 1 or None, got {type(window).__name__}")
        if window < 1:
            raise ValueError(f"window must be >= 1 (or None for no window), got {window}")
        if not causal:
            raise ValueError("window (a left sliding window) needs causal=True")
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
            raise TypeError(f"softcap must be a positive real number or None, got {type(softcap).__name__}")
        acc = torch.float64 if q.dtype == torch.float64 else torch.float32
        if not (math.isfinite(float(softcap)) and 0 < float(softcap) <= torch.finfo(acc).max):
            raise ValueError(f"softcap must be positive and finite (in {str(acc).replace('torch.', '')}), got {softcap}")
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor):
            raise TypeError(f"sinks must be a torch.Tensor of shape (Hq,) or None, got {type(sinks).__name__}")
        if sinks.dtype not in DTYPES:
            raise TypeError(f"sinks has dtype {sinks.dtype}; it must be a floating tensor {[str(d) for d in DTYPES]}")
        if tuple(sinks.shape) != (q.shape[1],):
            raise ValueError(f"sinks must have shape (Hq,) = ({q.shape[1]},), got {tuple(sinks.shape)}")
        if sinks.device != q.device:
            raise ValueError(f"sinks must be on q's device {q.device}, got {sinks.device}")
        if not bool(torch.isfinite(sinks).all()):
            raise ValueError("sinks must be finite")


def accepts_options(fn) -> frozenset:
    """The options (:data:`OPTIONS`) an implementation's ``attention`` takes as keywords (all,
    with ``**kwargs``); the suite reports the others "unsupported" for it."""
    fn = getattr(fn, "attention", fn)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return frozenset()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return frozenset(OPTIONS)
    return frozenset(o for o in OPTIONS if o in params)


def window_mask(Tq: int, Tk: int, window: int | None, device=None) -> torch.Tensor:
    """(Tq, Tk) bool, True where query i may attend key j under a left window W: ``i' - W < j
    <= i'``, i' = i + (Tk - Tq); W = None is :func:`causal_mask`."""
    i = torch.arange(Tq, device=device)[:, None] + (Tk - Tq)
    j = torch.arange(Tk, device=device)[None, :]
    return (j <= i) & (j > i - (window if window is not None else Tk))   # (Tq, Tk)


def causal_mask(Tq: int, Tk: int, device=None) -> torch.Tensor:
    """The contract's causal mask, (Tq, Tk) bool, True where query i may attend key j:
    ``j <= i + (Tk - Tq)`` (bottom-right aligned)."""
    i = torch.arange(Tq, device=device)[:, None]  # (Tq, 1)
    j = torch.arange(Tk, device=device)[None, :]  # (1, Tk)
    return j <= i + (Tk - Tq)                     # (Tq, Tk)


def kv_head_of(h: int, Hq: int, Hkv: int) -> int:
    """The KV head that query head ``h`` reads: ``h // (Hq // Hkv)``."""
    return h // (Hq // Hkv)


def flops(B: int, Hq: int, Tq: int, Tk: int, D: int, causal: bool) -> float:
    """Matmul FLOPs of one call: 4·B·Hq·Tq·Tk·D (QKᵀ and PV), halved when causal (the
    convention of the FlashAttention papers' benchmarks)."""
    f = 4.0 * B * Hq * Tq * Tk * D
    return f / 2 if causal else f


def cases(seed: int, device: str) -> list[tuple[tuple, dict]]:
    """Small valid calls for the checks every contract gets (no input mutation, every output
    element written, identical repeats): GQA with Tq < Tk bottom-right and an odd D, MQA
    decode, MHA prefill, logits of about 1e5 after scaling, float64, and a call spanning several
    key tiles (a nondeterministic split or reduction order shows there)."""
    out = []
    for i, (B, Hq, Hkv, Tq, Tk, D, dt, causal, amp) in enumerate([
            (1, 4, 2, 3, 17, 59, torch.float32, True, 1.0),
            (2, 3, 1, 1, 33, 64, torch.float16, False, 1.0),
            (1, 2, 2, 16, 16, 16, torch.bfloat16, True, 1.0),
            (1, 2, 1, 5, 9, 8, torch.float32, True, 170.0),
            (1, 1, 1, 4, 4, 3, torch.float64, False, 1.0),
            (2, 8, 2, 2, 300, 128, torch.float32, True, 1.0)]):  # several key tiles, group of 4
        g = torch.Generator().manual_seed(1000 * seed + i)
        q = (amp * torch.randn(B, Hq, Tq, D, generator=g, dtype=torch.float64)).to(device=device, dtype=dt)
        k = (amp * torch.randn(B, Hkv, Tk, D, generator=g, dtype=torch.float64)).to(device=device, dtype=dt)
        v = torch.randn(B, Hkv, Tk, D, generator=g, dtype=torch.float64).to(device=device, dtype=dt)
        out.append(((q, k, v), {"causal": causal, "scale": D ** -0.5}))
    return out


def _qkv(device, B=1, Hq=4, Hkv=2, Tq=3, Tk=5, D=8):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(B, h, t, D, generator=g).to(device) for h, t in ((Hq, Tq), (Hkv, Tk), (Hkv, Tk)))


def invalid(device: str) -> list[InvalidCall]:
    """The calls this contract documents as invalid (tiny float32 tensors; causal=False and
    scale=0.3 unless the call is about them), with the argument each message must name."""
    q, k, v = _qkv(device)
    meta = torch.device("meta")
    calls = [  # (what, (q, k, v), kwargs, raises, argument)
        ("q-not-a-tensor", (q.tolist(), k, v), {}, TypeError, "q"),
        ("k-with-3-dims", (q, k[0], v), {}, ValueError, "k"),
        ("integer-dtype", (q.long(), k.long(), v.long()), {}, TypeError, "q"),
        ("mixed-dtypes", (q, k.double(), v), {}, TypeError, "k"),
        ("k-v-shapes-differ", (q, k, v[:, :, :4]), {}, ValueError, "v"),
        ("batch-differs", (q, torch.cat([k, k]), torch.cat([v, v])), {}, ValueError, ("k", "batch")),
        ("head-dim-differs", (q, k[..., :4], v[..., :4]), {}, ValueError, ("k", "head dim")),
        ("hq-not-a-multiple-of-hkv", (q[:, :3], k, v), {}, ValueError, ("q", "k", "Hq", "Hkv", "heads")),
        ("head-dim-257", _qkv(device, D=257), {}, ValueError, ("q", "D", "head dim")),
        ("tq-0", _qkv(device, Tq=0), {}, ValueError, ("q", "Tq")),
        ("tk-0", _qkv(device, Tk=0), {}, ValueError, ("k", "Tk")),
        ("causal-not-a-bool", (q, k, v), {"causal": 1}, TypeError, "causal"),
        ("scale-a-string", (q, k, v), {"scale": "0.3"}, TypeError, "scale"),
        ("scale-a-bool", (q, k, v), {"scale": True}, TypeError, "scale"),
        ("scale-nan", (q, k, v), {"scale": math.nan}, ValueError, "scale"),
        ("scale-1e40-float32", (q, k, v), {"scale": 1e40}, ValueError, "scale"),
        ("causal-with-tq-above-tk", _qkv(device, Tq=6, Tk=5), {"causal": True}, ValueError, ("causal", "Tq", "Tk")),
        ("k-on-another-device", (q, k.to(meta), v), {}, ValueError, "k"),
        ("window-a-float", (q, k, v), {"causal": True, "window": 2.0}, TypeError, "window"),
        ("window-0", (q, k, v), {"causal": True, "window": 0}, ValueError, "window"),
        ("window-without-causal", (q, k, v), {"window": 2}, ValueError, ("window", "causal")),
        ("softcap-a-string", (q, k, v), {"softcap": "30"}, TypeError, "softcap"),
        ("softcap-0", (q, k, v), {"softcap": 0.0}, ValueError, "softcap"),
        ("softcap-inf", (q, k, v), {"softcap": math.inf}, ValueError, "softcap"),
        ("sinks-a-list", (q, k, v), {"sinks": [0.0] * 4}, TypeError, "sinks"),
        ("sinks-integer", (q, k, v), {"sinks": torch.zeros(4, dtype=torch.long, device=device)}, TypeError, "sinks"),
        ("sinks-per-kv-head", (q, k, v), {"sinks": torch.zeros(2, device=device)}, ValueError, "sinks"),
        ("sinks-nan", (q, k, v), {"sinks": torch.full((4,), math.nan, device=device)}, ValueError, "sinks"),
    ]
    return [InvalidCall(what, args, {"causal": False, "scale": 0.3, **kw}, (exc,), argument,
                        on=_taking(set(kw) & set(OPTIONS)))
            for what, args, kw, exc, argument in calls]


def _taking(options: set):
    """``on`` of an invalid call: NotImplementedError (unsupported) where ``options`` are lacking."""
    def receiver(impl):
        lacking = sorted(options - accepts_options(impl))
        if lacking:
            raise NotImplementedError(f"{getattr(impl, 'name', impl)} takes no {', '.join(lacking)} option")
        return impl
    return receiver


CONTRACT = Contract(
    technique="attention",
    functions=("attention",),
    doc=__doc__,
    cases=cases,
    returns={"attention": torch.Tensor},
    invalid=invalid,
)


# ----------------------------------------------------------------------------------------------
# coverage table: the boundary classes the laws must hand every implementation under `ci`
# ----------------------------------------------------------------------------------------------
# Each class is a inference_conformance.conformance.coverage.CoverageClass whose observations are calls: dicts with B, Hq,
# Hkv, Tq, Tk, D, causal, scale, dtype, num_splits and the logits' max_logit, rise64, rise128
# (inference_conformance.properties.attention.cases.call_profile). The law runner records, per implementation, which
# classes each run reached; properties/attention/test_attention_coverage.py fails on a class that FA-3's and
# FA-7's laws and the production shapes leave unreached on the float64 reference under ``ci``.

#: The laws that judge one call's values (FA-3's law and its production shapes).
_FA3 = ("law_matches_reference", "production")
_FA7 = ("law_split_equals_unsplit",)   # FA-7's split-KV law
_FA8 = ("law_options_match_reference",)   # FA-8's laws (the options against the float64 reference)
#: Tile sizes in use (BLOCK_M / BLOCK_N of every configuration, the interpreter's 16 x 32).
TILE_SIZES = (16, 32, 64, 128)
#: Head dims of real models (Llama, Mistral: 128; GPT-2: 64; Phi: 80, 96; Gemma: 256; ...).
MODEL_HEAD_DIMS = (64, 72, 80, 96, 128, 160, 192, 256)


def _coverage() -> tuple:
    out = []
    for t in TILE_SIZES:
        for r, what in ((0, "a multiple of"), (1, "one past a multiple of"), (t - 1, "one short of a multiple of")):
            out.append(CoverageClass(f"Tk {what} {t}", _FA3,
                                     lambda c, t=t, r=r: c["Tk"] >= t - 1 and c["Tk"] % t == r))
    for t in (16, 64):
        for r, what in ((0, "a multiple of"), (1, "one past a multiple of"), (t - 1, "one short of a multiple of")):
            out.append(CoverageClass(f"Tq {what} {t} (query tiles)", _FA3,
                                     lambda c, t=t, r=r: c["Tq"] >= t - 1 and c["Tq"] % t == r))
    out += [
        CoverageClass("causal, Tq = Tk a multiple of 64 (whole diagonal tile)", _FA3,
                      lambda c: c["causal"] and c["Tq"] == c["Tk"] and c["Tk"] % 64 == 0),
        CoverageClass("more than one query tile of 128 (Tq > 128)", _FA3, lambda c: c["Tq"] > 128),
        CoverageClass("more than one program along B·Hq with B > 1", _FA3, lambda c: c["B"] > 1 and c["Hq"] > 1),
        CoverageClass("batch row 4 and beyond (B >= 5)", _FA3, lambda c: c["B"] >= 5),
        CoverageClass("causal chunk after a prefix in a batch of 5 or more (B >= 5, 1 < Tq < Tk)", _FA3,
                      lambda c: c["B"] >= 5 and c["causal"] and 1 < c["Tq"] < c["Tk"]),
        CoverageClass("decode past 2048 keys (Tq <= 16, Tk > 2048)", _FA3,
                      lambda c: c["Tq"] <= 16 and c["Tk"] > 2048),
        CoverageClass("decode path: B > 1, Tq <= 16, Tk >= 1024", _FA3,
                      lambda c: c["B"] > 1 and c["Tq"] <= 16 and c["Tk"] >= 1024),
        CoverageClass("split-KV: B > 1 with more than one split", _FA7,
                      lambda c: c["B"] > 1 and (c["num_splits"] or 1) > 1),
        CoverageClass("split-KV: Tk >= 1024 with more than one split", _FA7,
                      lambda c: c["Tk"] >= 1024 and (c["num_splits"] or 1) > 1),
        # a running max frozen after the first key tile overflows exp (float64: past 709)
        CoverageClass("large logits whose max arrives after the first 64 keys (by > 709)", _FA3,
                      lambda c: c.get("rise64", -math.inf) > 709),
        CoverageClass("large logits whose max arrives after the first 128 keys (by > 709)", _FA3,
                      lambda c: c.get("rise128", -math.inf) > 709),
        # a scale folded into q in 16 bits moves logits of ~1e2 by ~2^-9 |q||k|
        CoverageClass("16-bit, large logits (> 50), scale not a power of two", _FA3,
                      lambda c: c["dtype"] in (torch.float16, torch.bfloat16) and c.get("max_logit", 0) > 50
                      and c["scale"] != 0 and math.frexp(abs(c["scale"]))[0] != 0.5),
        CoverageClass("16-bit with max(Tq, Tk) >= 1024 (autotuned configurations)", _FA3,
                      lambda c: c["dtype"] in (torch.float16, torch.bfloat16) and max(c["Tq"], c["Tk"]) >= 1024),
        # decode (Tq = 1) alone reaches "causal, Tq < Tk": a diagonal off by one only for a chunk
        # after a cached prefix, or an offset clamped to one key tile, passes it
        CoverageClass("causal chunk after a cached prefix (1 < Tq < Tk)", _FA3,
                      lambda c: c["causal"] and 1 < c["Tq"] < c["Tk"]),
        CoverageClass("causal chunk after a prefix longer than a key tile (Tq > 1, Tk - Tq > 128)", _FA3,
                      lambda c: c["causal"] and c["Tq"] > 1 and c["Tk"] - c["Tq"] > 128),
    ]
    for name, pred in (  # FA-8: observations add window, softcap, sinks and the row's logit span
            ("window shorter than a key tile (W < 16)", lambda c: 0 < (c.get("window") or 0) < 16),
            ("window crossing key-tile edges (W > 32, W % 32 != 0, W < Tk)",
             lambda c: 32 < (c.get("window") or 0) < c["Tk"] and c["window"] % 32 != 0),
            ("window longer than Tk", lambda c: (c.get("window") or 0) > c["Tk"]),
            ("window skipping whole key tiles (Tk - W >= 64, Tq < Tk)",
             lambda c: c.get("window") and c["Tk"] - c["window"] >= 64 and c["Tq"] < c["Tk"]),
            ("softcap below the largest logit (changes the scores' order of magnitude)",
             lambda c: c.get("softcap") and c["softcap"] < c.get("max_logit", 0)),
            ("softcap with a window", lambda c: c.get("softcap") and c.get("window")),
            ("sinks above every row's largest logit (the sink dominates)", lambda c: c.get("sink_margin", -1) > 0)):
        out.append(CoverageClass(f"FA-8: {name}", _FA8, pred))
    for g, what in ((1, "1 (multi-head)"), (3, "3 (not a power of two)"), (8, "8"), (9, "9 (odd, > 8)"), (16, "16"),
                    (20, "20 (> 16, not a multiple of 16)"), (24, "24 (> 16, not a multiple of 16)"), (64, "64")):
        out.append(CoverageClass(f"group size {what}", _FA3, lambda c, g=g: c["Hq"] // c["Hkv"] == g))
    for g in (20, 24):    # the split kernel's GQA map past 16 query heads per KV head
        out.append(CoverageClass(f"split-KV, group size {g}", _FA7,
                                 lambda c, g=g: c["Hq"] // c["Hkv"] == g and (c["num_splits"] or 1) > 1))
    for d in MODEL_HEAD_DIMS:
        out.append(CoverageClass(f"head dim {d}", _FA3, lambda c, d=d: c["D"] == d))
    for mask, pred in (("no mask", lambda c: not c["causal"]),
                       ("causal, Tq = Tk", lambda c: c["causal"] and c["Tq"] == c["Tk"] and c["Tq"] > 1),
                       ("causal, Tq < Tk", lambda c: c["causal"] and c["Tq"] < c["Tk"])):
        for sc, spred in (("negative", lambda s: s < 0), ("zero", lambda s: s == 0),
                          ("tiny (0 < scale < 1e-3)", lambda s: 0 < s < 1e-3), ("huge (>= 8)", lambda s: s >= 8)):
            out.append(CoverageClass(f"{sc} scale x {mask}", _FA3,
                                     lambda c, pred=pred, spred=spred: pred(c) and spred(c["scale"])))
    return tuple(out)


#: The attention contract's coverage table (see :class:`CoverageClass`).
COVERAGE = _coverage()
