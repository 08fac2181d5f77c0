"""The laws of the W8A8 product (claim QT-9; ``optimized/quantization/w8a8_matmul.py``; lecture
001 §5.2–5.3): int8 activations quantized per token, int8 weights per channel, an int32
accumulator, a float32 epilogue.

- :data:`W8A8_ACCUMULATOR`: the int32 accumulator equals the exact integer product (int64 on the
  host) element for element, including K = 4096 at codes of ±127, where sums reach
  K·127² = 66,064,384: beyond int16 (32,767), float16 (65,504; integers above 2048 round) and
  float32's exact integers (2^24).
- :data:`W8A8_REFERENCE`: the scaled output equals the reference W8A8
  (``inference_conformance.reference.quantization.methods``: both operands dequantized, multiplied
  in float64) by the tolerance policy's dtype rule.

No W8A8 contract exists yet, so the laws declare no test of their own: the tests of
``properties/quantization/test_quant_kernels.py`` run them on the suite's two products (Triton,
PyTorch) and show the known-bad ones (``properties/quantization/zoo.py`` ``W8A8_ZOO``) rejected.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from inference_conformance.conformance.laws import Law
from inference_conformance.conformance.tolerance import assert_exact, check_close
from inference_conformance.properties import strategies

TECH = "quantization"


@dataclass(frozen=True)
class W8Case:
    """One W8A8 product: x (M, K), w (N, K) and how the inputs are drawn (``kind``). Codes:
    ``uniform`` int8 in [-128, 127]; ``extreme`` ±127 with row 0 of x and of w all +127 and
    row 1 of w all -127 (the largest sums of both signs). Floats: ``normal`` N(0, 1);
    ``outlier`` one activation channel x100 (QT-5's construction); ``zero_row`` token 0 all zero."""

    M: int
    N: int
    K: int
    kind: str


CODE_KINDS = ("uniform", "extreme")
FLOAT_KINDS = ("normal", "outlier", "zero_row")


def w8a8_cases(kinds):
    """Drawn :class:`W8Case` of a kind in ``kinds``: M in 1..20, N in 1..70, K in 1..200."""
    return st.builds(W8Case, st.integers(1, 20), st.integers(1, 70), st.integers(1, 200), st.sampled_from(kinds))


def make_codes(case: W8Case, seed: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The int8 codes of a ``uniform`` or ``extreme`` case: x_q (M, K), w_q (N, K) on ``device``."""
    g = torch.Generator().manual_seed(seed)
    if case.kind == "uniform":
        x_q = torch.randint(-128, 128, (case.M, case.K), generator=g, dtype=torch.int8)
        w_q = torch.randint(-128, 128, (case.N, case.K), generator=g, dtype=torch.int8)
    else:
        x_q = (torch.randint(0, 2, (case.M, case.K), generator=g, dtype=torch.int8) * 2 - 1) * 127
        w_q = (torch.randint(0, 2, (case.N, case.K), generator=g, dtype=torch.int8) * 2 - 1) * 127
        x_q[0], w_q[0] = 127, 127
        if case.N > 1:
            w_q[1] = -127
    return x_q.to(device), w_q.to(device)


def make_floats(case: W8Case, seed: int, dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The float inputs of a ``normal``, ``outlier`` or ``zero_row`` case: x (M, K) and w (N, K)
    (N(0, 0.05²)), drawn in float64 from ``seed`` and cast to ``dtype`` on ``device``."""
    x = strategies.randn((case.M, case.K), seed, dtype=torch.float64)
    w = strategies.randn((case.N, case.K), seed + 1, dtype=torch.float64) * 0.05
    if case.kind == "outlier":
        x[:, seed % case.K] *= 100.0
    if case.kind == "zero_row":
        x[0] = 0.0
    return x.to(dtype).to(device), w.to(dtype).to(device)


def law_w8a8_accumulator(run, device, case, seed):
    """The int32 accumulator (``out_dtype=torch.int32``) equals the int64 product on the host;
    each example observes its largest |sum|."""
    x_q, w_q = make_codes(case, seed, device)
    scales = (torch.ones(case.M, device=device), torch.ones(case.N, device=device))
    acc = run.impl.w8a8_matmul(x_q, scales[0], w_q, scales[1], out_dtype=torch.int32)
    assert acc.dtype == torch.int32, f"the accumulator came back as {acc.dtype}"
    exact = x_q.cpu().long() @ w_q.cpu().long().T
    run.observe(int(exact.abs().max()))
    assert_exact(acc.cpu().long(), exact, what=f"int32 accumulator vs int64 product ({case})")


def law_w8a8_reference(run, device, dtype, case, seed):
    """x quantized per token, w per channel, the kernel's scaled output in ``dtype`` equals the
    reference W8A8 (float64) by the dtype's rule."""
    from inference_conformance.reference.quantization.methods import fake_quantize_activations, fake_quantize_weight

    impl = run.impl
    x, w = make_floats(case, seed, dtype, device)
    x_q, x_s = impl.quantize_activations(x)
    w_q, w_s = impl.quantize_weight(w)
    out = impl.w8a8_matmul(x_q, x_s, w_q, w_s, out_dtype=dtype)
    assert tuple(out.shape) == (case.M, case.N) and out.dtype == dtype, f"got {tuple(out.shape)} {out.dtype}"
    out_ref = fake_quantize_activations(x.double(), 8, "token") @ fake_quantize_weight(w.double(), 8).T
    check_close(out, out_ref, what=f"W8A8 output ({case})").check()


#: The W8A8 laws, run on the suite's two products (not registered implementations: no W8A8 contract
#: yet; ``test_quant_kernels.py`` picks them by name and runs these laws on them, and the zoo
#: tests there reject the known-bad products). A Triton kernel under the interpreter gets half the
#: drawn examples.
W8A8_ACCUMULATOR = Law(
    claim="QT-9", technique=TECH, body=law_w8a8_accumulator, params=("device",),
    given={"case": w8a8_cases(CODE_KINDS), "seed": strategies.seeds},
    examples=(dict(case=W8Case(2, 3, 4096, "extreme"), seed=1),       # sums of ±66,064,384
              dict(case=W8Case(17, 65, 130, "uniform"), seed=2),      # two tiles on both axes, a K remainder
              dict(case=W8Case(1, 1, 1, "extreme"), seed=3)),
    interpreted_examples=lambda n: max(4, n // 2))
W8A8_REFERENCE = Law(
    claim="QT-9", technique=TECH, body=law_w8a8_reference, given={"case": w8a8_cases(FLOAT_KINDS), "seed": strategies.seeds},
    examples=(dict(case=W8Case(4, 9, 96, "outlier"), seed=1), dict(case=W8Case(17, 65, 130, "zero_row"), seed=2),
              dict(case=W8Case(2, 3, 4096, "normal"), seed=3)),
    interpreted_examples=lambda n: max(4, n // 2))
