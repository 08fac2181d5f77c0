"""The tolerance policy's rules: the comparison each dtype or number format is judged by.

:class:`Comparison` (one comparison's result; ``Verdict`` is its former name, kept for callers), the error measures (:func:`max_abs_error`,
:func:`worst_element`, :func:`scale_of`, :func:`ulp`, :func:`spacing`), the rule classes
(:class:`RelativeRule`, :class:`MixedPrecisionRule`, :class:`NaiveMultipleRule`) and the policy's
table :data:`RULES`, by dtype or scheme name, and the engines' near-tie rule :data:`NEAR_TIE`
(:class:`NearTieRule`, registered by the ``inference_engine`` contract). The policy itself, what each rule sees and is blind
to, and the checks that use them are in :mod:`inference_conformance.conformance.tolerance`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from inference_conformance.conformance.failures import ToleranceFailure

REL_TOL = {torch.float64: 1e-12, torch.float32: 1e-5}
HALF_DTYPES = (torch.float16, torch.bfloat16)
#: 16-bit kernel rule: allowed ulps of each element, and ulps of the output's scale.
ELEMENT_ULPS = 1.0
SCALE_ULPS = 0.5
#: 16-bit whole-model rule: multiple of the reference model's own 16-bit error, floor in ulps.
SAME_DTYPE_FACTOR = 2.0
FLOOR_ULPS = 4.0


@dataclass(frozen=True)
class Comparison:
    """The result of one comparison: ``ok``, the ``rule`` it was judged by, ``error`` and
    ``bound`` in the output's units. (A test's outcome is an
    :class:`inference_conformance.conformance.outcomes.Outcome`; this is one comparison's.)"""

    ok: bool
    rule: str
    error: float
    bound: float
    what: str = "output"
    detail: str = ""

    @property
    def ratio(self) -> float:
        """error / bound (0 when both are 0): below 1 passes."""
        if self.bound == 0:
            return 0.0 if self.error == 0 else math.inf
        return self.error / self.bound

    def message(self) -> str:
        status = "within" if self.ok else "EXCEEDS"
        text = (f"{self.what}: measured error {self.error:.3e} {status} bound {self.bound:.3e} "
                f"(rule {self.rule})")
        return text + (f"; {self.detail}" if self.detail else "")

    def check(self) -> "Comparison":
        """Raise :class:`inference_conformance.conformance.failures.ToleranceFailure` (an
        AssertionError printed as its message alone) with :meth:`message` unless ``ok``; return self."""
        if not self.ok:
            raise ToleranceFailure(self.message(), self)
        return self


#: the former name of :class:`Comparison`, kept so that callers written against it still work
Verdict = Comparison


def ulp(dtype: torch.dtype) -> float:
    """Machine epsilon of a floating dtype (spacing of floats at 1.0)."""
    return torch.finfo(dtype).eps


def spacing(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """ulp(x): the spacing of ``dtype``'s floats at |x| (float64 tensor, same shape): 2^e * eps
    for |x| in [2^e, 2^(e+1)); the subnormal spacing below the smallest normal."""
    fi = torch.finfo(dtype)
    a = x.detach().to(torch.float64).abs()
    a = torch.where(torch.isfinite(a), a, torch.full_like(a, fi.max))
    e = torch.floor(torch.log2(a.clamp_min(fi.tiny)))
    return torch.exp2(e) * fi.eps


def _as_tensor(x) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(x)


def max_abs_error(out: torch.Tensor, out_ref: torch.Tensor) -> float:
    """max|out - out_ref| in float64; matching infinities count as equal, a NaN or a
    non-matching infinity as +inf. Raises ValueError on a shape mismatch."""
    out, out_ref = _as_tensor(out), _as_tensor(out_ref)
    if tuple(out.shape) != tuple(out_ref.shape):
        raise ValueError(f"shape mismatch: out {tuple(out.shape)} vs out_ref {tuple(out_ref.shape)}")
    if out.numel() == 0:
        return 0.0
    return float(_abs_diff(out, out_ref).max())


def _abs_diff(out: torch.Tensor, out_ref: torch.Tensor) -> torch.Tensor:
    """|out - out_ref| element by element in float64 on the CPU: matching infinities and NaN
    against NaN are 0; a NaN or a non-matching infinity is +inf."""
    a = out.detach().to("cpu", torch.float64)
    b = out_ref.detach().to("cpu", torch.float64)
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    diff = torch.where(same, torch.zeros_like(a), (a - b).abs())
    return torch.nan_to_num(diff, nan=math.inf, posinf=math.inf)


def worst_element(out: torch.Tensor, out_ref: torch.Tensor) -> str:
    """Where ``out`` is furthest from ``out_ref`` (index, both values) and how many of its
    elements are NaN or a non-matching infinity: the detail a failure message carries."""
    out, out_ref = _as_tensor(out), _as_tensor(out_ref)
    if out.shape != out_ref.shape or out.numel() == 0:
        return ""
    diff = _abs_diff(out, out_ref).flatten()
    a, b = out.detach().to("cpu", torch.float64).flatten(), out_ref.detach().to("cpu", torch.float64).flatten()
    flat = int(diff.argmax())
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), out.shape))
    text = f"worst element {idx}: out {a[flat].item():.6g}, out_ref {b[flat].item():.6g}"
    n_nan, n_bad = int(torch.isnan(a).sum()), int(torch.isinf(diff).sum())
    if n_bad:
        text += f"; {n_bad} of {a.numel()} elements off by +inf (NaN or an infinity the reference does not have; {n_nan} NaN)"
    return text


def scale_of(out_ref: torch.Tensor) -> float:
    """max|out_ref| over its finite entries (the output's scale)."""
    r = _as_tensor(out_ref).detach().to("cpu", torch.float64)
    r = r[torch.isfinite(r)]
    return float(r.abs().max()) if r.numel() else 0.0



@dataclass(frozen=True)
class Rule:
    """One comparison rule of the policy: ``judge(out, out_ref, out_pt, what) -> Comparison``.
    ``sees``: the errors it is sure to catch; ``blind_to``: what it cannot see (keywords, after
    each rule's own fields); ``needs_out_pt``: whether it judges by the naive computation
    ``out_pt`` (a property of the rule's kind)."""

    sees: str = field(default="", kw_only=True)
    blind_to: str = field(default="", kw_only=True)
    needs_out_pt: ClassVar[bool] = False

    def judge(self, out: torch.Tensor, out_ref: torch.Tensor, out_pt, what: str, magnitude: float | None = None) -> Comparison:
        raise NotImplementedError


@dataclass(frozen=True)
class RelativeRule(Rule):
    """max|out - out_ref| <= rel * max|out_ref| (float64, float32)."""

    name: str
    rel: float

    def judge(self, out, out_ref, out_pt, what, magnitude=None):
        err, scale = max_abs_error(out, out_ref), scale_of(out_ref)
        bound = self.rel * scale
        rule = f"{self.name}: max|out-out_ref| <= {self.rel:g} * max|out_ref| ({scale:.3g})"
        ok = err <= bound
        return Comparison(ok, rule, err, bound, what, "" if ok else worst_element(out, out_ref))


@dataclass(frozen=True)
class MixedPrecisionRule(Rule):
    """A 16-bit kernel's output against the mixed-precision reference ``out_mix`` (``out_ref``,
    the float64 result of the same 16-bit inputs, rounded to ``dtype``), element by element:
    |out_i - out_mix_i| <= element_ulps · ulp(out_mix_i) + scale_ulps · ulp(max|out_ref|).
    The verdict reports the element with the largest error/bound ratio, its error and bound in
    the output's units and in ulps of that element."""

    name: str
    dtype: torch.dtype
    element_ulps: float
    scale_ulps: float

    def judge(self, out, out_ref, out_pt, what, magnitude=None):
        rule = (f"{self.name}: |out-out_mix| <= {self.element_ulps:g} ulp(out_mix) + "
                f"{self.scale_ulps:g} ulp(max|out_ref|), out_mix = float64 result of the same "
                f"{self.name} inputs rounded to {self.name}")
        if out.numel() == 0:
            return Comparison(True, rule, 0.0, 0.0, what)
        ref = _as_tensor(out_ref).detach().to("cpu", torch.float64)
        mix = ref.to(self.dtype).to(torch.float64)
        a = out.detach().to("cpu", torch.float64)
        same = (a == mix) | (torch.isnan(a) & torch.isnan(mix))
        err = torch.where(same, torch.zeros_like(a), (a - mix).abs())
        err = torch.nan_to_num(err, nan=math.inf, posinf=math.inf).flatten()
        scale = scale_of(ref)
        ulp_i = spacing(mix, self.dtype).flatten()
        bound = self.element_ulps * ulp_i + self.scale_ulps * float(spacing(torch.tensor(scale), self.dtype))
        ratio = torch.where(err == 0, torch.zeros_like(err), err / bound)
        i = int(ratio.argmax())
        e, b = float(err[i]), float(bound[i])
        idx = tuple(int(j) for j in torch.unravel_index(torch.tensor(i), tuple(out.shape)))
        detail = (f"worst element {idx}: out {float(a.flatten()[i]):.6g}, out_mix {float(mix.flatten()[i]):.6g}, "
                  f"out_ref {float(ref.flatten()[i]):.6g}, {e / float(ulp_i[i]):.3g} ulps of the element; "
                  f"scale {scale:.3g}")
        return Comparison(bool(ratio[i] <= 1.0), rule, e, b, what, detail)


@dataclass(frozen=True)
class NaiveMultipleRule(Rule):
    """max|out - out_ref| <= min(factor * max|out_pt - out_ref| + floor, cap): the error of the
    naive computation in the output's own number format (``out_pt``: the reference computation in
    the same 16-bit dtype, or dequantize-then-compute for a quantized scheme; never the
    implementation under test) sets the scale of the allowed error; floor = ``floor_ulps`` ulps of
    ``ulp_dtype`` (default: the output's dtype) at the output's scale, so a zero naive error does
    not make the bound zero; cap = ``cap_fraction`` of the scale (None: no cap). When ``out_pt``
    is not finite where ``out_ref`` is (the naive computation overflowed), its error says
    nothing and the bound is the floor alone."""

    name: str
    factor: float
    floor_ulps: float
    cap_fraction: float | None = None
    ulp_dtype: torch.dtype | None = None
    needs_out_pt: ClassVar[bool] = True

    def judge(self, out, out_ref, out_pt, what, magnitude=None):
        err, scale = max_abs_error(out, out_ref), scale_of(out_ref)
        err_pt = max_abs_error(_as_tensor(out_pt), out_ref)
        # the floor's scale: the output's, or the sum's own magnitude (max of sum |a|*|b|) when
        # given: a sum that cancels to a small output still carries rounding of its terms' size
        floor_scale = scale if magnitude is None else max(scale, float(magnitude))
        floor = self.floor_ulps * ulp(self.ulp_dtype or out.dtype) * floor_scale
        cap = math.inf if self.cap_fraction is None else self.cap_fraction * scale
        naive = self.factor * err_pt if math.isfinite(err_pt) else 0.0
        bound = min(naive + floor, cap)
        rule = (f"{self.name}: max|out-out_ref| <= {self.factor:g} * max|out_pt-out_ref| ({err_pt:.3e}) "
                f"+ {self.floor_ulps:g} ulp * {'scale' if magnitude is None else 'max(scale, sum|a||b|)'} ({floor:.3e})")
        if self.cap_fraction is not None:
            rule = rule.replace(f"{self.name}: max|out-out_ref| <= ", f"{self.name}: max|out-out_ref| <= min(")
            rule += f", scale * {self.cap_fraction:g} ({cap:.3e}))"
        detail = "" if math.isfinite(err_pt) else "the naive computation overflowed: bound is the floor alone"
        ok = err <= bound
        if not ok:
            detail = "; ".join(d for d in (worst_element(out, out_ref), detail) if d)
        return Comparison(ok, rule, err, bound, what, detail)


@dataclass(frozen=True)
class NearTieRule(Rule):
    """A generated token against the float64 model's choice, excused as a near-tie by the
    engine's *measured* error, never by a declared dtype: the float64 logit gap between the
    token the engine chose and the one it is judged against (the argmax, or the other run's
    token) must be <= ``factor`` · max(measured, ``floor``), where measured is the engine's own
    error on the request (max |logprob − float64 log-softmax| over its tokens; for an engine that
    returns no logprobs, the error of the suite's reference model run in the dtype it computes
    in, never the engine's own greedy gaps, which would excuse its own wrong tokens). Each position with a gap > 0 is excused and counted;
    more than ``max_share`` of an example's positions excused fails (:meth:`judge_share`)."""

    name: str
    factor: float
    floor: float
    max_share: float

    def limit(self, measured: float) -> float:
        """The largest float64 gap excused for an engine whose measured error is ``measured``."""
        return self.factor * max(float(measured), self.floor)

    def judge(self, out, out_ref, out_pt, what, magnitude=None):
        """``out``: the float64 logits of the chosen tokens (n,); ``out_ref``: those they are
        judged against (n,); ``magnitude``: the engine's measured error on the request."""
        gap = (_as_tensor(out_ref).double() - _as_tensor(out).double()).abs()
        measured = 0.0 if magnitude is None else float(magnitude)
        bound, err = self.limit(measured), float(gap.max()) if gap.numel() else 0.0
        rule = (f"{self.name}: float64 gap <= {self.factor:g} * max(measured error {measured:.3e}, "
                f"{self.floor:g})")
        ok, k = err <= bound, int((gap > 0).sum())
        detail = f"{k} of {gap.numel()} positions {'excused as near-ties' if ok else 'not the float64 choice'}"
        return Comparison(ok, rule, err, bound, what, detail)

    def judge_share(self, excused: int, positions: int, what: str) -> Comparison:
        """At most ``max_share`` of ``positions`` excused (error and bound as shares)."""
        share = excused / positions if positions else 0.0
        return Comparison(share <= self.max_share, f"{self.name}: at most {self.max_share:.0%} of the positions "
                       f"excused as near-ties", share, self.max_share, what, f"{excused} of {positions} excused")


#: The engine near-tie rule's safety factor (the difference of two logprobs errs up to twice one's
#: error, times 2), floor (float64 roundoff at the logits' scale) and largest excused share.
NEAR_TIE_FACTOR, NEAR_TIE_FLOOR, MAX_EXCUSED_SHARE = 4.0, 1e-12, 0.1
NEAR_TIE = NearTieRule(
    "engine-near-tie", NEAR_TIE_FACTOR, NEAR_TIE_FLOOR, MAX_EXCUSED_SHARE,
    sees="a token flip where the float64 top-two gap exceeds 4 times the engine's own measured error "
         "(a batch-, cache- or chunk-dependent choice of an engine computing accurately, whatever "
         "dtype it declares); more than 10% of an example's positions excused",
    blind_to="a flip within 4 times the engine's measured error (an engine with large logprob errors "
             "excuses more: its logprobs are judged by the dtype rule); an engine without logprobs "
             "is judged by its calibration run's gaps")


def _half_rule(dtype: torch.dtype) -> MixedPrecisionRule:
    name = str(dtype).replace("torch.", "")
    return MixedPrecisionRule(
        name, dtype, ELEMENT_ULPS, SCALE_ULPS,
        sees=f"a uniform scaling by 2% ({0.02 / ulp(dtype):.3g} to {0.04 / ulp(dtype):.3g} ulps of each element), "
             "a 16-bit online-softmax accumulator from ~1000 keys on, one dropped key among ~1000, "
             "all-zero or unchanged outputs; independent of the naive 16-bit computation (which may overflow)",
        blind_to=f"errors within {ELEMENT_ULPS:g} ulp of each element plus {SCALE_ULPS:g} ulp of the output's "
                 "scale (a bfloat16 scaling by 1% or less, a 16-bit accumulator over a few key tiles)")


def _model_rule(dtype: torch.dtype) -> NaiveMultipleRule:
    name = str(dtype).replace("torch.", "") + "-model"
    return NaiveMultipleRule(
        name, SAME_DTYPE_FACTOR, FLOOR_ULPS, None, dtype,
        sees="errors above twice the reference model's own error in the same 16-bit dtype (a wrong "
             "position, a missing or stale token); a naive computation that overflows leaves the floor",
        blind_to="errors below twice the reference model's 16-bit error (for a 2-layer bfloat16 "
                 "model, tenths of the logits' scale): small uniform scalings, a few-ulp kernel error")


#: The policy's table: dtype or scheme name -> rule.
RULES: dict[object, Rule] = {
    torch.float64: RelativeRule("float64", REL_TOL[torch.float64],
                                sees="any algorithmic error above 1e-12 of the output's scale "
                                     "(a scale rounded to float32, ~1e-8)",
                                blind_to="errors below 1e-12 relative (float64 rounding is ~1e-16)"),
    torch.float32: RelativeRule("float32", REL_TOL[torch.float32],
                                sees="any error above 1e-5 of the output's scale (TF32 matmuls, ~1e-3, fail)",
                                blind_to="errors below 1e-5 relative"),
    torch.float16: _half_rule(torch.float16),
    torch.bfloat16: _half_rule(torch.bfloat16),
    "float16-model": _model_rule(torch.float16),
    "bfloat16-model": _model_rule(torch.bfloat16),
}


def model_rule(dtype: torch.dtype):
    """The scheme name of the whole-model rule for a 16-bit ``dtype``; None for other dtypes
    (whose rule, chosen by dtype, is the same for kernels and models)."""
    return f"{str(dtype).replace('torch.', '')}-model" if dtype in HALF_DTYPES else None
