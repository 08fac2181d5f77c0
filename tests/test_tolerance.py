"""The tolerance policy itself: it passes correct outputs and fails the classic wrong ones."""
import math

import pytest
import torch

from inference_conformance.conformance import tolerance


def _ref(seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(64, 33, generator=g, dtype=torch.float64) * scale


@pytest.mark.parametrize("scale", [1e-6, 1e-3, 1.0, 1e5])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_all_zero_output_fails_every_float_rule(dtype, scale):
    out_ref = _ref(scale=scale)
    out_pt = out_ref.to(dtype)
    v = tolerance.check_close(torch.zeros_like(out_ref, dtype=dtype), out_ref, out_pt=out_pt)
    assert not v.ok, v.message()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_input_returned_unchanged_fails(dtype):
    inp = _ref(seed=1)
    out_ref = torch.softmax(inp, dim=-1) @ _ref(seed=2)[:33]
    v = tolerance.check_close(inp[:, :33].to(dtype) if inp.shape[1] >= 33 else inp.to(dtype), out_ref,
                              out_pt=out_ref.to(dtype))
    assert not v.ok, v.message()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_correctly_rounded_output_passes(dtype):
    out_ref = _ref()
    out = out_ref.to(dtype)
    tolerance.assert_close(out, out_ref, out_pt=out_ref.to(dtype))


def test_half_rule_has_floor_when_naive_error_is_zero():
    out_ref = torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64)  # exactly representable
    out_pt = out_ref.to(torch.float16)
    out = (out_ref * (1 + torch.finfo(torch.float16).eps)).to(torch.float16)   # 1 ulp off
    v = tolerance.check_close(out, out_ref, out_pt=out_pt)
    assert v.ok and v.bound > 0, v.message()
    out = (out_ref * (1 + 2 * torch.finfo(torch.float16).eps)).to(torch.float16)  # 2 ulps at the max
    assert not tolerance.check_close(out, out_ref, out_pt=out_pt).ok


def _attention_like(seed=0, rows=64, keys=300, d=64):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(rows, keys, generator=g, dtype=torch.float64)
    return torch.softmax(s, dim=-1) @ torch.randn(keys, d, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_rule_rejects_a_two_percent_scaling(dtype):
    """The 16-bit kernel rule judges each element in its own ulps: 2% is 2.6-5 bfloat16 ulps."""
    out_ref = _attention_like()
    v = tolerance.check_close((out_ref * 1.02).to(dtype), out_ref)
    assert not v.ok and "ulps of the element" in v.detail, v.message()
    assert v.ratio > 1.5, v.message()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_rule_accepts_one_ulp_everywhere_and_small_elements_by_the_scale(dtype):
    out_ref = _attention_like(seed=3)
    mix = out_ref.to(dtype)
    assert tolerance.check_close(mix, out_ref).ok
    # 1 ulp off in every element (a float32 accumulation rounding the other way)
    out = torch.where(mix > 0, mix.to(torch.float64) + tolerance.spacing(mix, dtype),
                      mix.to(torch.float64) - tolerance.spacing(mix, dtype)).to(dtype)
    v = tolerance.check_close(out, out_ref)
    assert v.ok and v.ratio <= 2 / 3 + 1e-9, v.message()
    # an element near zero may be off by its inputs' rounding (1 ulp of the scale), not its own
    tiny = out_ref.clone()
    tiny[0, 0] = 1e-6
    out = tiny.to(dtype).clone()
    ulp_scale = float(tolerance.spacing(tiny.abs().max(), dtype))
    out[0, 0] = float(out[0, 0]) + 0.4 * ulp_scale
    assert tolerance.check_close(out, tiny).ok
    out[0, 0] = float(out[0, 0]) + 2 * ulp_scale
    assert not tolerance.check_close(out, tiny).ok


def test_half_rule_needs_no_naive_output_and_ignores_an_overflowing_one():
    out_ref = _attention_like(seed=4)
    out_pt = torch.full_like(out_ref, float("inf"), dtype=torch.float16)   # naive fp16 overflowed
    assert not tolerance.check_close((out_ref * 1.05).to(torch.float16), out_ref, out_pt=out_pt).ok
    assert tolerance.check_close(out_ref.to(torch.float16), out_ref).ok


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_model_rule_follows_the_reference_model_and_falls_back_to_the_floor(dtype):
    out_ref = _attention_like(seed=5)
    key = tolerance.model_rule(dtype)
    out_pt = (out_ref + 0.05 * out_ref.abs().max()).to(dtype)         # the 16-bit reference model's error
    assert tolerance.check_close((out_ref + 0.08 * out_ref.abs().max()).to(dtype), out_ref,
                                 out_pt=out_pt, rule=key).ok
    assert not tolerance.check_close((out_ref + 0.2 * out_ref.abs().max()).to(dtype), out_ref,
                                     out_pt=out_pt, rule=key).ok
    overflowed = torch.full_like(out_pt, float("inf"))
    v = tolerance.check_close((out_ref * 1.05).to(dtype), out_ref, out_pt=overflowed, rule=key)
    assert not v.ok and "overflowed" in v.detail, v.message()
    assert tolerance.model_rule(torch.float32) is None


def test_nan_in_output_fails_and_message_states_error_bound_rule():
    out_ref = _ref()
    out = out_ref.clone()
    out[3, 4] = float("nan")
    v = tolerance.check_close(out, out_ref)
    assert not v.ok
    with pytest.raises(AssertionError) as info:
        v.check()
    msg = str(info.value)
    assert "measured error inf" in msg and "bound" in msg and "rule float64" in msg


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("each", [2.0 ** -12, 1.0, 4096.0])
def test_a_non_finite_output_in_a_per_element_check_is_an_error_of_inf(bad, each):
    """check_within: NaN, or an infinity where the reference is finite, measures an error of
    +inf, in the same words (never float64's max over the bound: 4.4e304 at a bound of 4096);
    a finite miss keeps its finite ratio, and an infinite bound still admits an infinity."""
    out_ref = torch.linspace(-1.0, 1.0, 12, dtype=torch.float64).reshape(3, 4)
    bound = torch.full_like(out_ref, each)
    out = out_ref.clone()
    out[0, 1] += 2 * each                                  # a finite miss: 2 bounds
    assert tolerance.check_within(out, out_ref, bound).error == pytest.approx(2.0)
    out[2, 3] = bad
    v = tolerance.check_within(out, out_ref, bound, what="w")
    assert not v.ok and v.error == math.inf, v.message()
    with pytest.raises(AssertionError) as info:
        v.check()
    assert str(info.value).startswith("w: measured error inf EXCEEDS bound"), str(info.value)
    assert f"worst element (2, 3): out {bad:.6g}" in str(info.value)
    if not math.isnan(bad):
        assert tolerance.check_within(out, out_ref, torch.full_like(out_ref, math.inf)).ok


def test_float64_rule_is_relative_to_scale():
    out_ref = _ref(scale=1e8)
    tolerance.assert_close(out_ref * (1 + 1e-14), out_ref)
    assert not tolerance.check_close(out_ref * (1 + 1e-9), out_ref).ok


def test_model_rule_requires_naive_baseline():
    with pytest.raises(ValueError, match="out_pt"):
        tolerance.check_close(torch.zeros(3, dtype=torch.float16), torch.zeros(3, dtype=torch.float64),
                              rule="float16-model")


def test_exact_rule_counts_differences_and_names_first():
    v = tolerance.check_exact(torch.tensor([1, 2, 3]), torch.tensor([1, 5, 3]))
    assert not v.ok and v.error == 1 and "(1,)" in v.detail
    assert tolerance.check_exact(torch.tensor([1, 2]), torch.tensor([1, 2])).ok
    assert not tolerance.check_exact(torch.tensor([1, 2]), torch.tensor([1, 2, 3])).ok


def test_shape_mismatch_is_a_value_error():
    with pytest.raises(ValueError, match="shape"):
        tolerance.check_close(torch.zeros(2, dtype=torch.float64), torch.zeros(3, dtype=torch.float64))


def test_the_policy_is_a_table_a_technique_extends(monkeypatch):
    """A contract declares its scheme rules (``Contract.rules``); the policy finds them by name
    without anything registered at import, and refuses a name two rules claim."""
    from inference_conformance.conformance import registry
    from inference_conformance.conformance import tolerance as tol

    rule = tol.NaiveMultipleRule("toy-int8-weight", factor=1.5, floor_ulps=1, cap_fraction=0.25,
                                 ulp_dtype=torch.bfloat16, sees="test", blind_to="test")
    toy = registry.Contract("toy", ("f",), "a toy contract", rules={"toy-int8-weight": rule})
    real = registry.contracts()
    monkeypatch.setattr(registry, "contracts", lambda: {**real, "toy": toy})
    out_ref = torch.linspace(-1, 1, 64, dtype=torch.float64)
    out_pt = out_ref + 0.01                       # the naive dequantize-then-compute error
    assert tol.check_close(out_ref + 0.012, out_ref, out_pt=out_pt, rule="toy-int8-weight").ok
    bad = tol.check_close(out_ref + 0.03, out_ref, out_pt=out_pt, rule="toy-int8-weight")
    assert not bad.ok and "toy-int8-weight" in bad.rule and "1.5 * max|out_pt-out_ref|" in bad.rule
    assert tol.check_close(out_ref + 0.012, out_ref, out_pt=out_pt, rule=rule).ok   # the object itself
    with pytest.raises(ValueError, match="out_pt"):
        tol.check_close(out_ref, out_ref, rule="toy-int8-weight")
    clash = registry.Contract("clash", ("f",), "x", rules={"toy-int8-weight": tol.RelativeRule("other", 1e-3)})
    monkeypatch.setattr(registry, "contracts", lambda: {**real, "toy": toy, "clash": clash})
    with pytest.raises(ValueError, match="already has"):
        tol.all_rules()
    monkeypatch.setattr(registry, "contracts", lambda: real)
    with pytest.raises(ValueError, match="no tolerance rule for toy-int8-weight"):
        tol.check_close(torch.zeros(2), torch.zeros(2), rule="toy-int8-weight")
    assert "quant-matmul" in tol.all_rules() and "quant-matmul" not in tol.RULES


def test_every_rule_states_what_it_sees_and_cannot_see():
    from inference_conformance.conformance import tolerance as tol

    for key, rule in tol.all_rules().items():
        assert rule.sees and rule.blind_to, key


def test_a_failure_names_the_worst_element_and_counts_nans():
    """The message says where the worst error is, both values there, and how many elements are
    NaN (a NaN is an error of +inf, so it is the worst element)."""
    out_ref = torch.zeros(3, 4, dtype=torch.float64)
    out = out_ref.clone()
    out[1, 2] = 0.5
    v = tolerance.check_close(out, out_ref)
    assert not v.ok and "worst element (1, 2): out 0.5, out_ref 0" in v.message()
    out[2, 3] = float("nan")
    msg = tolerance.check_close(out, out_ref).message()
    assert "worst element (2, 3): out nan" in msg and "1 of 12 elements off by +inf" in msg
    assert tolerance.check_close(out_ref, out_ref).detail == ""


def test_quant_matmul_floor_follows_the_products_magnitude_not_the_cancelled_output():
    """QT-9's pinned cancelling row (one-sign weights, K = 43): a correct float64 product summed
    in numpy's order differs from torch's by ~5e-16 where |out| is ~3e-2; judged at the output's
    scale (floor 8 ulp x |out| = 5e-17) it was rejected, at the products' magnitude it passes,
    and an error of one quantization step still fails."""
    from inference_conformance.properties.quantization.cases import EXAMPLE_SEEDS, EXAMPLES, make_weight, make_x
    from inference_conformance.reference import quantization as ref

    case, seed = EXAMPLES[-1], EXAMPLE_SEEDS[-1]
    w = make_weight(case, seed, torch.float64, "cpu", extreme=False)
    qw = ref.quantize(w, bits=case.bits, granularity=case.granularity)
    x, d = make_x(case, seed, torch.float64, "cpu"), ref.dequantize(qw)
    out_ref, out_pt = x @ d.T, x @ d.T
    out_np = torch.from_numpy(x.numpy() @ d.numpy().T)
    mag = float((x.abs() @ d.abs().T).max())
    # the floor at the products' magnitude, not at the cancelled output's (whether numpy's order
    # differs from torch's enough to cross the output-scale floor depends on its BLAS build)
    at_out = tolerance.check_close(out_np, out_ref, out_pt=out_pt, rule="quant-matmul")
    at_mag = tolerance.check_close(out_np, out_ref, out_pt=out_pt, rule="quant-matmul", magnitude=mag)
    assert at_mag.ok and at_mag.bound > 4 * at_out.bound, (at_out, at_mag)
    step = float(qw.scales.max())
    bad = out_ref + step * x.abs().max()
    assert not tolerance.check_close(bad, out_ref, out_pt=out_pt, rule="quant-matmul", magnitude=mag).ok
