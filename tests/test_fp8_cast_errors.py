"""What only the suite's own FP8 cast built-ins promise about bad input, in their exact wording (the
contract's documented bad calls run on every implementation in
``properties/test_contract_generic.py``), and the reproduction of the two findings on PyTorch's
cast listed in ``expectations/fp8_cast-torch.toml``, asserted as measured (torch 2.13 on the CPU),
so that a release that changes them shows up."""
from __future__ import annotations

import math

import pytest
import torch

from inference_conformance.optimized.fp8_cast import torch_cast
from inference_conformance.reference.fp8_cast import fp8_cast as ref_cast

BUILTINS = [pytest.param(ref_cast, id="reference"), pytest.param(torch_cast, id="torch")]


@pytest.mark.parametrize("fn", BUILTINS)
def test_builtins_name_the_argument_in_the_contracts_words(fn):
    x = torch.tensor([1.0, -2.0])
    with pytest.raises(ValueError, match=r"format must be one of \['e4m3fn', 'e5m2'\], got 'fp8_e4m3fn'"):
        fn(x, format="fp8_e4m3fn", saturate=True)
    with pytest.raises(TypeError, match="saturate must be a bool, got int"):
        fn(x, format="e5m2", saturate=0)
    with pytest.raises(TypeError, match="x must be float64, float32, float16 or bfloat16 for fp8_cast, got torch.int64"):
        fn(x.long(), format="e5m2", saturate=True)


def test_reference_cast_worked_values():
    """The contract's rules on hand-checked values: ties to even (1.0625 -> 1.0, 1.1875 -> 1.25),
    a subnormal tie (2^-10 -> 0, 3 * 2^-10 -> 2^-8), -0.0 kept, E4M3fn's 464 -> 448 and 465 ->
    NaN unsaturated, E5M2's 61440 -> inf unsaturated, inf -> ±F saturated."""
    def cast(v, fmt, sat):
        return ref_cast(torch.tensor(v, dtype=torch.float64), format=fmt, saturate=sat).double().tolist()

    assert cast([1.0625, 1.1875, 2.0 ** -10, 3 * 2.0 ** -10], "e4m3fn", True) == [1.0, 1.25, 0.0, 2.0 ** -8]
    assert math.copysign(1.0, cast([-0.0, -2.0 ** -11], "e4m3fn", False)[1]) == -1.0
    got = cast([464.0, 465.0, -math.inf], "e4m3fn", False)
    assert got[0] == 448.0 and math.isnan(got[1]) and math.isnan(got[2])
    assert cast([61440.0, -math.inf, 57344.0 + 4095], "e5m2", False) == [math.inf, -math.inf, 57344.0]
    assert cast([math.inf, -1e30], "e5m2", True) == [57344.0, -57344.0]


def test_torch_cast_findings():
    """PyTorch's cast (torch 2.13, CPU): a float64 tensor goes through float32 (1.0625 + 2^-40
    becomes 1.0 in E4M3fn, not 1.125; the float32 value 1.0625 is a tie); the E4M3fn conversion
    saturates unasked (465 and inf become 448, OFP8 says NaN); float32 inputs round exactly and
    E5M2 overflows to inf as OFP8 says."""
    x = torch.tensor([1.0625 + 2.0 ** -40], dtype=torch.float64)
    assert x.to(torch.float8_e4m3fn).double().item() == 1.0
    assert ref_cast(x, format="e4m3fn", saturate=True).double().item() == 1.125
    assert x.float().to(torch.float8_e4m3fn).double().item() == 1.0                 # the float32 tie, to even: right
    big = torch.tensor([465.0, math.inf])
    assert big.to(torch.float8_e4m3fn).float().tolist() == [448.0, 448.0]
    assert torch.isnan(ref_cast(big, format="e4m3fn", saturate=False).float()).all()
    assert torch.tensor([61440.0]).to(torch.float8_e5m2).float().item() == math.inf
