"""Adapters of the weight-quantization libraries that run on a CPU to the ``quantization``
contract (``conformance/contracts/quantization/contract.py``)::

    quantize(w, *, bits, granularity) -> QW;  dequantize(qw) -> (N, K);  matmul(x, qw) -> (M, N)

Each calls the library's own quantize, dequantize and (where it has one) matmul, and only moves
data between layouts (torch <-> numpy, the library's packing). Where the library's scheme is not
the contract's absmax step s = max|w| / (2^(b-1) - 1), the adapter declares it (``symmetric =
False`` for a zero point, or ``scheme``, one of :data:`inference_conformance.conformance.contracts.quantization.bounds.SCHEMES`)
and hands back what it stored (``stored(qw)``: codes and scales), which the suite verifies: the
scale against the scheme's formula, each code against round-to-nearest of w / that stored scale,
dequantize against code x scale (the own-scale law); QT-1 then checks the bound that scheme
promises, and QT-2 (idempotence, the absmax claim) reads "differs by design" inside the scheme. Refused (NotImplementedError, reported
"unsupported"): the bits, granularities and dtypes each library does not take, and ``matmul``
where the library has no product of its own. Claims QT-1, QT-2, QT-9.

- ``bnb_int8``: bitsandbytes' LLM.int8() weight format, ``int8_vectorwise_quant`` (one absmax
  scale per row, codes round(127 w / absmax), the contract's absmax at 8 bits per channel) and
  ``int8_vectorwise_dequant`` (float32, cast to w's dtype). 8 bits per channel only, no float64 (its row
  statistics are float32). No matmul:
  bitsandbytes' int8 product quantizes the activations too (LLM.int8(), QT-7), so it is not
  the weight-only product QT-9 states. Its 4-bit formats (NF4, FP4: ``quantize_4bit``) map codes
  through a 16-entry table of non-uniform levels, which the contract's uniform step cannot
  express: not adapted.
- ``compressed_tensors`` / ``compressed_tensors_asym``: compressed-tensors (the format vLLM loads): ``QuantizationArgs(num_bits,
  type="int", symmetric, strategy="tensor" | "channel" | "group", group_size)``,
  ``calculate_qparams`` over each group's min(min w, 0) and max(max w, 0) (what its observers
  pass), ``quantize`` / ``dequantize`` of ``compressed_tensors.quantization.lifecycle.forward``,
  codes packed to int32 along K by ``pack_to_int32`` (the "pack-quantized" checkpoint format) and
  unpacked by ``unpack_from_int32``. Symmetric: codes -2^(b-1)..2^(b-1) - 1, s = max|w| /
  (2^(b-1) - 1/2), declared ``scheme = "absmax-full-range"``; asymmetric: the contract's zero
  point. No matmul of its own (vLLM's kernels run the format).
- ``quanto_int8`` / ``quanto_intx``: optimum-quanto's ``quantize_weight`` with its own
  optimizers: ``qint8`` per output channel (``AbsmaxOptimizer``: s = max|w| / 127, the
  contract's absmax), ``qint4`` / ``qint2`` affine in groups along K (``MaxOptimizer``: s = (max w
  - min w) / (2^b - 1) with a float shift; 0 need not be representable; declared a zero-point
  scheme: its step is at most the contract's). matmul: ``torch.nn.functional.linear`` on the
  quantized tensor (quanto's own dispatch). Scales are kept in w's dtype.
- ``gguf_q8_0`` / ``gguf_q4_0``: llama.cpp's block formats through ``gguf.quants.quantize`` /
  ``dequantize`` (numpy, float32), blocks of 32 along K, one float16 scale per block: Q8_0 at 8
  bits (s = max|w| / 127, declared ``"gguf-q8_0"``: the codes use the float32 scale, the stored one
  is float16), Q4_0 at 4 bits (s = the block's signed extreme / -8, codes 0..15 around 8,
  declared ``"gguf-q4_0"``: the side opposite the extreme clips at 7 steps). A block whose scale
  overflows float16 (max|w| above 65504 x 127, resp. x 8) is refused; so is float64 (gguf
  quantizes float32). No matmul (ggml's kernels are not in the package).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

from inference_conformance.conformance.contracts.quantization import validate_matmul, validate_quantize


@dataclass(frozen=True)
class OutsideWeight:
    """One library's quantized weight as an adapter keeps it: ``data`` (the library's own
    object or arrays), ``N``, ``K``, ``dtype`` (w's), ``device`` (w's), ``owner`` (the adapter)."""

    data: object
    N: int
    K: int
    dtype: torch.dtype
    device: torch.device
    owner: object


class _Adapter:
    """What every adapter shares: the qw check, matmul refusal, repr."""

    symmetric = True
    name = ""

    def _check(self, qw) -> OutsideWeight:
        if not isinstance(qw, OutsideWeight) or qw.owner is not self:
            raise TypeError(f"qw must be the quantized weight {self.name}'s quantize returned, got {type(qw).__name__}")
        return qw

    def matmul(self, x, qw):
        qw = self._check(qw)
        validate_matmul(x, K=qw.K, dtype=qw.dtype, device=qw.device)
        raise NotImplementedError(f"{self.name} has no weight-only product of its own ({self.no_matmul})")

    no_matmul = ""

    def __repr__(self) -> str:
        return f"inference_conformance.optimized.quantization.outside.{self.name}"


def _refuse(name: str, ok: bool, what: str) -> None:
    if not ok:
        raise NotImplementedError(f"{name} {what}")


# ------------------------------------------------------------------------------ bitsandbytes


class BnbInt8(_Adapter):
    """bitsandbytes' row-wise int8 (``int8_vectorwise_quant`` / ``int8_vectorwise_dequant``)."""

    name = "bnb_int8"
    no_matmul = "its int8 matmul quantizes the activations too: LLM.int8(), QT-7"

    def quantize(self, w, *, bits, granularity):
        shape = validate_quantize(w, bits, granularity)
        _refuse(self.name, shape.bits == 8 and granularity == "channel",
                f"is 8 bits per channel (one absmax per row), not {shape.bits} bits, granularity {granularity!r}")
        _refuse(self.name, w.dtype != torch.float64, "keeps its row statistics in float32: no float64 weights")
        F = importlib.import_module("bitsandbytes.functional")
        codes, stats, _ = F.int8_vectorwise_quant(w.detach().contiguous())    # (N, K) int8, (N,) float32
        return OutsideWeight((codes, stats), shape.N, shape.K, w.dtype, w.device, self)

    def dequantize(self, qw):
        qw = self._check(qw)
        F = importlib.import_module("bitsandbytes.functional")
        codes, stats = qw.data
        return F.int8_vectorwise_dequant(codes, stats).to(qw.dtype)


# ------------------------------------------------------------------------- compressed-tensors


class CompressedTensors(_Adapter):
    """compressed-tensors' int quantization (tensor / channel / group) with int32 packing."""

    no_matmul = "it is a checkpoint format; vLLM's kernels run it"

    def __init__(self, symmetric: bool):
        self.symmetric = symmetric
        self.name = "compressed_tensors" if symmetric else "compressed_tensors_asym"
        if symmetric:
            self.scheme = "absmax-full-range"

    def quantize(self, w, *, bits, granularity):
        shape = validate_quantize(w, bits, granularity)
        from compressed_tensors.compressors import pack_to_int32
        from compressed_tensors.quantization import QuantizationArgs
        from compressed_tensors.quantization.lifecycle.forward import quantize
        from compressed_tensors.quantization.utils import calculate_qparams

        strategy = granularity if isinstance(granularity, str) else "group"
        args = QuantizationArgs(num_bits=shape.bits, type="int", symmetric=self.symmetric, strategy=strategy,
                                group_size=None if strategy != "group" else shape.group_size)
        w = w.detach()
        if strategy == "tensor":
            lo, hi = w.amin().reshape(1), w.amax().reshape(1)                                    # (1,)
        else:
            groups = w.reshape(shape.N, shape.K // shape.group_size, shape.group_size)
            lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)                                    # (N, groups)
        zero = torch.zeros_like(lo)
        scale, zero_point = calculate_qparams(torch.minimum(lo, zero), torch.maximum(hi, zero), args)
        codes = quantize(w, scale, zero_point, args)                                          # (N, K), w's dtype
        packed = pack_to_int32(codes.to(torch.int8), shape.bits)                              # (N, ceil(K/per)) int32
        return OutsideWeight((packed, scale, zero_point, args), shape.N, shape.K, w.dtype, w.device, self)

    def stored(self, qw):
        """(codes minus zero point, scale) per element, (N, K) int64 and float64: what the
        own-scale law of the declared scheme reads back."""
        qw = self._check(qw)
        from compressed_tensors.compressors import unpack_from_int32

        packed, scale, zero_point, args = qw.data
        codes = unpack_from_int32(packed, args.num_bits, torch.Size((qw.N, qw.K))).to(torch.int64)
        per = qw.K // (scale.numel() // qw.N) if scale.numel() > 1 else qw.K
        expand = (lambda t: t.reshape(1, 1).expand(qw.N, qw.K)) if scale.numel() == 1 else (
            lambda t: t.reshape(qw.N, -1).repeat_interleave(per, dim=1))
        return codes - expand(zero_point.to(torch.int64)), expand(scale.to(torch.float64))

    def dequantize(self, qw):
        qw = self._check(qw)
        from compressed_tensors.compressors import unpack_from_int32
        from compressed_tensors.quantization.lifecycle.forward import dequantize

        packed, scale, zero_point, args = qw.data
        codes = unpack_from_int32(packed, args.num_bits, torch.Size((qw.N, qw.K)))
        return dequantize(codes, scale, zero_point, args, dtype=qw.dtype).to(qw.dtype)


# ------------------------------------------------------------------------------ optimum-quanto


class Quanto(_Adapter):
    """optimum-quanto's weight quantization (``quantize_weight`` with its optimizers)."""

    def __init__(self, kind: str):
        self.kind = kind
        self.name = f"quanto_{kind}"
        self.symmetric = kind == "int8"

    def quantize(self, w, *, bits, granularity):
        shape = validate_quantize(w, bits, granularity)
        oq = importlib.import_module("optimum.quanto")
        if self.kind == "int8":
            _refuse(self.name, shape.bits == 8 and granularity == "channel",
                    f"(qint8) is 8 bits per output channel, not {shape.bits} bits, granularity {granularity!r}")
            scale = oq.AbsmaxOptimizer()(w.detach(), oq.qint8, axis=0)                       # (N, 1)
            t = oq.quantize_weight(w.detach(), qtype=oq.qint8, axis=0, scale=scale)
        else:
            _refuse(self.name, shape.bits in (2, 4), f"has qint2 and qint4 below 8 bits, not {shape.bits}")
            _refuse(self.name, granularity != "tensor", "quantizes along K in groups or per channel, not per tensor")
            qtype = oq.qint4 if shape.bits == 4 else oq.qint2
            g = shape.group_size
            scale, shift = oq.MaxOptimizer()(w.detach(), qtype, 0, g)
            t = oq.quantize_weight(w.detach(), qtype=qtype, axis=0, scale=scale, shift=shift, group_size=g)
        return OutsideWeight(t, shape.N, shape.K, w.dtype, w.device, self)

    def dequantize(self, qw):
        return self._check(qw).data.dequantize().to(qw.dtype)

    def matmul(self, x, qw):
        qw = self._check(qw)
        validate_matmul(x, K=qw.K, dtype=qw.dtype, device=qw.device)
        with torch.no_grad():
            return torch.nn.functional.linear(x, qw.data)


# ------------------------------------------------------------------------------------- gguf

#: float16's largest finite value: a gguf block's scale is stored in float16.
_FP16_MAX = 65504.0


class Gguf(_Adapter):
    """llama.cpp's Q8_0 / Q4_0 blocks through gguf-py (numpy)."""

    no_matmul = "gguf-py quantizes and dequantizes; ggml's kernels are not in the package"
    BLOCK = 32

    def __init__(self, kind: str):
        self.kind = kind
        self.name = f"gguf_{kind}"
        self.bits = 8 if kind == "q8_0" else 4
        self.scheme = f"gguf-{kind}"
        self.steps = 127 if kind == "q8_0" else 8        # the extreme in steps

    def quantize(self, w, *, bits, granularity):
        shape = validate_quantize(w, bits, granularity)
        _refuse(self.name, shape.bits == self.bits and granularity == self.BLOCK,
                f"is {self.bits} bits in blocks of {self.BLOCK} along K, not {shape.bits} bits, "
                f"granularity {granularity!r}")
        _refuse(self.name, w.dtype != torch.float64, "quantizes float32 arrays, not float64")
        w32 = w.detach().to("cpu", torch.float32)
        amax = float(w32.abs().max())
        _refuse(self.name, amax / self.steps <= _FP16_MAX,
                f"stores each block's scale in float16: max|w| = {amax:.3g} overflows it (above "
                f"{_FP16_MAX * self.steps:.3g})")
        gguf = importlib.import_module("gguf")
        qtype = getattr(gguf.GGMLQuantizationType, self.kind.upper())
        blocks = gguf.quants.quantize(w32.numpy(), qtype)                                # (N, K / 32 * bytes) uint8
        return OutsideWeight((blocks, qtype), shape.N, shape.K, w.dtype, w.device, self)

    def stored(self, qw):
        """(code, stored float16 scale) per element, (N, K) int64 and float64, read from the
        blocks: 2 bytes of scale, then Q8_0's 32 int8 codes or Q4_0's 16 bytes (element j in the
        low nibble of byte j, element j + 16 in its high nibble; the code is the nibble - 8)."""
        import numpy as np

        qw = self._check(qw)
        blocks, _ = qw.data
        raw = np.ascontiguousarray(blocks).reshape(qw.N, qw.K // self.BLOCK, -1)
        d = np.ascontiguousarray(raw[..., :2]).view(np.float16).astype(np.float64)       # (N, blocks, 1)
        if self.kind == "q8_0":
            q = np.ascontiguousarray(raw[..., 2:]).view(np.int8).astype(np.int64)         # (N, blocks, 32)
        else:
            nib = raw[..., 2:].astype(np.int64)                                           # (N, blocks, 16)
            q = np.concatenate([nib & 15, nib >> 4], axis=-1) - 8
        scale = np.broadcast_to(d, q.shape)
        return (torch.from_numpy(q.reshape(qw.N, qw.K).copy()),
                torch.from_numpy(scale.reshape(qw.N, qw.K).copy()))

    def dequantize(self, qw):
        qw = self._check(qw)
        gguf = importlib.import_module("gguf")
        blocks, qtype = qw.data
        out = gguf.quants.dequantize(blocks, qtype)                                      # (N, K) float32
        return torch.from_numpy(out.copy()).to(device=qw.device, dtype=qw.dtype)


bnb_int8 = BnbInt8()
ct = CompressedTensors(True)
ct_asym = CompressedTensors(False)
quanto_int8 = Quanto("int8")
quanto_intx = Quanto("intx")
gguf_q8_0 = Gguf("q8_0")
gguf_q4_0 = Gguf("q4_0")
