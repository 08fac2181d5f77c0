"""An outside quantization that supports only 8-bit per-channel weights (the reference's
arithmetic) and refuses every other bit width or granularity with NotImplementedError: the laws
must report it "partial", naming what it refused, never a plain pass."""
import sys as _sys

from inference_conformance.reference import quantization as _ref


def quantize(w, *, bits, granularity, g_idx=None):
    if bits != 8 or granularity != "channel" or g_idx is not None:
        raise NotImplementedError(f"only 8-bit per-channel weights (got bits={bits}, granularity={granularity!r})")
    return _ref.quantize(w, bits=bits, granularity=granularity)


def dequantize(qw):
    return _ref.dequantize(qw)


def matmul(x, qw):
    return _ref.matmul(x, qw)

#: The implementation object for ``--impl quantization=tests.partial_quantization:IMPL``.
IMPL = _sys.modules[__name__]
