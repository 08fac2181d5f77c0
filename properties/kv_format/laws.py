"""Laws of the KV-cache formats (claim QT-12; lecture 001 §5.4, KIVI), over every registered
implementation of the ``kv_format`` contract (``conformance/contracts/kv_format.py``):

- every value of dequantize_kv(quantize_kv(k, v)) within its step (the contract's kv_bound: per
  token and head, per channel over a group for KIVI keys, half an ulp for FP8), on contents that
  break a wrong granularity (a loud head, channel or token, FP8 magnitudes past 448 and below its
  normals), in float64 and float32;
- attention over the cache, each query seeing it as decode holds it, within attention_bound;
- the bytes held, measured from the stored tensors, within the format's size (float32, bfloat16).

Their zoo tests reject every known-bad KV-cache format (``zoo.py``) by the law's own comparison:
a scale shared by a token's heads, KIVI keys per token, KIVI's residual window dropped, int4
nibbles read in the other order, FP8 with no scale and KIVI's group scales read per token by the
value law (float64); the shared scale and the swapped nibbles by the attention law too; codes held
in float32 by the bytes law. The cases, the contents and the calls are in ``cases.py``.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import note

from inference_conformance.conformance.contracts.kv_format import COVERAGE, format_bytes
from inference_conformance.conformance.contracts.quantization.kv import attention_bound, kv_bound
from inference_conformance.conformance.laws import Kills, Law
from inference_conformance.conformance.tolerance import check_within
from inference_conformance.properties import strategies
from inference_conformance.properties.kv_format.cases import EXAMPLES, ContractOps, held_bytes, kv_cases, make_kv

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def law_every_value_within_its_step(run, device, dtype, case, seed):
    """QT-12: every element of dequantize_kv(quantize_kv(k, v)) within the contract's kv_bound
    (half a step of its token and head, or of its channel's group for KIVI keys; FP8: half an ulp
    at x / s times s); tokens in full precision exact; k's shape, dtype and device."""
    note(str(case))
    run.observe(case)
    _, k, v = make_kv(case, seed, dtype, device)
    fmt = case.format()
    ops = ContractOps(run.impl, run)
    k_hat, v_hat = ops.dequantize_kv(ops.quantize_kv(k, v, fmt))
    for name, got, x in (("k", k_hat, k), ("v", v_hat, v)):
        assert isinstance(got, torch.Tensor) and got.shape == x.shape and got.dtype == x.dtype, \
            f"dequantize_kv's {name}_hat: {type(got).__name__} {getattr(got, 'shape', '')} {getattr(got, 'dtype', '')}, " \
            f"want {tuple(x.shape)} {x.dtype}"
        assert got.device == x.device, f"{name}_hat on {got.device}, {name} on {x.device}"
        check_within(got, x, kv_bound(x, fmt, name), what=f"{fmt.name} {name} ({case.kind}, {dtype})",
                     rule="QT-12 half step").check()


def law_attention_within_its_bound(run, device, case, seed):
    """QT-12: attention over the cache (a prefill through the model's quantized cache: each query
    sees token t as decode holds it then) within the contract's attention_bound of exact attention,
    float64, plus 64 ulp of max|v| for float64 rounding."""
    from inference_conformance.optimized.quantization.kv import QuantizedKVCache
    from inference_conformance.reference.transformer import naive_attention

    note(str(case))
    run.observe(case)
    q, k, v = make_kv(case, seed, torch.float64, device)
    fmt = case.format()
    out = QuantizedKVCache(fmt, ContractOps(run.impl, run)).attend(0, q, k, v)
    mask = torch.ones(case.T, case.T, dtype=torch.bool, device=device).tril()[None, None]
    bound = attention_bound(q, k, v, kv_bound(k, fmt, "k"), kv_bound(v, fmt, "v"), case.D ** -0.5, mask)
    bound = bound + 64 * torch.finfo(torch.float64).eps * float(v.abs().max())
    check_within(out, naive_attention(q, k, v, mask), bound, what=f"attention over {fmt.name} ({case.kind})",
                 rule="QT-12 attention bound").check()


def law_bytes_held_within_the_format(run, device, dtype, case, seed):
    """QT-12's bytes: what quantize_kv holds, measured from the tensors reachable in it, at most
    the contract's format_bytes (codes packed at the format's bits, at most 8 bytes per scale at
    its granularity, full-precision tokens at their dtype's size)."""
    note(str(case))
    run.observe(case)
    _, k, v = make_kv(case, seed, dtype, device)
    fmt = case.format()
    got = held_bytes(ContractOps(run.impl, run).quantize_kv(k, v, fmt))
    most = format_bytes(case.B, case.H, case.T, case.D, fmt, dtype)
    check_within(torch.tensor([float(got)]), torch.zeros(1), torch.tensor([float(most)]),
                 what=f"bytes held / the format's {most} ({fmt.name}, {tuple(k.shape)}, {dtype}): held {got}",
                 rule="QT-12 bytes").check()


#: Known-bad formats (properties/kv_format/zoo.py) the value law rejects in float64.
ZOO_VALUE = ("scale_shared_across_heads", "kivi_keys_per_token", "kivi_residual_dropped",
             "int4_nibbles_swapped_on_read", "fp8_without_scale", "kivi_group_scale_read_per_token")
#: Known-bad formats the bytes law rejects.
ZOO_BYTES = ("codes_held_in_float32",)

QT12_VALUES = Law(
    claim="QT-12", technique="kv_format", body=law_every_value_within_its_step,
    given={"case": kv_cases(), "seed": strategies.seeds}, examples=EXAMPLES, dtypes=(torch.float64, torch.float32),
    kills=(Kills(ZOO_VALUE, (torch.float64,)),), coverage=COVERAGE, max_examples=lambda n: min(n, 30),
    test="test_qt12_every_value_within_its_step", zoo_tests=("test_qt12_value_zoo_rejected",))

QT12_ATTENTION = Law(
    claim="QT-12", technique="kv_format", body=law_attention_within_its_bound, params=("device",),
    given={"case": kv_cases(), "seed": strategies.seeds}, examples=EXAMPLES, coverage=COVERAGE,
    kills=(Kills(("scale_shared_across_heads", "int4_nibbles_swapped_on_read"), ()),),
    max_examples=lambda n: max(4, n // 3),
    test="test_qt12_attention_within_its_bound", zoo_tests=("test_qt12_attention_zoo_rejected",))

QT12_BYTES = Law(
    claim="QT-12", technique="kv_format", body=law_bytes_held_within_the_format,
    given={"case": kv_cases(), "seed": strategies.seeds}, examples=EXAMPLES, dtypes=(torch.float32, torch.bfloat16),
    kills=(Kills(ZOO_BYTES, (torch.float32,)),), coverage=COVERAGE, max_examples=lambda n: min(n, 30),
    test="test_qt12_bytes_held_within_the_format", zoo_tests=("test_qt12_bytes_zoo_rejected",))

