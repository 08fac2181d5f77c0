"""The suite's one tolerance policy. Every float or exact assertion goes through this module.

Rules (chosen by the dtype of the output under test):

- ``exact``      integers, token ids, cache writes, allocator state: equal, element for element.
- ``float64``    max|out - out_ref| <= 1e-12 * scale, scale = max|out_ref| (the lectures claim ~1e-14).
- ``float32``    max|out - out_ref| <= 1e-5 * scale.
- ``float16`` / ``bfloat16``: max|out - out_ref| <= 2 * max|out_pt - out_ref| + floor, where
  ``out_ref`` is the float64 reference, ``out_pt`` the naive computation in the same 16-bit dtype
  (what rounding alone costs), and floor = 4 ulps of the dtype at the output's scale (so a zero
  naive error does not make the bound zero). The bound is capped at 1/16 of the output's scale:
  when the naive computation itself overflows or collapses (fp16 scores past 65504), its error
  says nothing, and an output wrong by more than 1/16 of its scale is wrong in any dtype.

The rules are a table (:data:`RULES`), keyed by the output's dtype or by a scheme name that a
check names explicitly (``check_close(..., rule="int4-weight")``); a technique adds its own with
:func:`register_rule` (quantization: a multiple of the naive dequantize-then-compute error plus a
floor, an instance of :class:`NaiveMultipleRule`). Each rule states what it can and cannot see
(``Rule.sees`` / ``Rule.blind_to``), and the report shows it next to the verdicts.

No rule is a bare absolute tolerance: every bound is proportional to the reference's scale, so an
all-zero output, or an input returned unchanged, fails every float comparison
(``tests/test_tolerance.py`` shows it). NaN or inf in ``out`` where ``out_ref`` is finite is an
error of +inf. Statistical rules (sampling claims) live in :mod:`conformance.stats` and fix
their false-alarm rate per test.

Each check returns a :class:`Verdict`; the ``assert_*`` forms raise ``AssertionError`` whose
message states the measured error, the bound and the rule. Every verdict is also reported to
:mod:`conformance.results`, which turns the worst one of a test into its result row.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from conformance import results

REL_TOL = {torch.float64: 1e-12, torch.float32: 1e-5}
HALF_DTYPES = (torch.float16, torch.bfloat16)
SAME_DTYPE_FACTOR = 2.0
FLOOR_ULPS = 4.0
HALF_CAP_FRACTION = 1.0 / 16


@dataclass(frozen=True)
class Verdict:
    """Outcome of one comparison: ``error`` and ``bound`` in the output's units."""

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

    def check(self) -> "Verdict":
        """Raise AssertionError with :meth:`message` unless ``ok``; return self."""
        if not self.ok:
            raise AssertionError(self.message())
        return self


def ulp(dtype: torch.dtype) -> float:
    """Machine epsilon of a floating dtype (spacing of floats at 1.0)."""
    return torch.finfo(dtype).eps


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
    a = out.detach().to("cpu", torch.float64)
    b = out_ref.detach().to("cpu", torch.float64)
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    diff = torch.where(same, torch.zeros_like(a), (a - b).abs())
    diff = torch.nan_to_num(diff, nan=math.inf)
    return float(diff.max())


def scale_of(out_ref: torch.Tensor) -> float:
    """max|out_ref| over its finite entries (the output's scale)."""
    r = _as_tensor(out_ref).detach().to("cpu", torch.float64)
    r = r[torch.isfinite(r)]
    return float(r.abs().max()) if r.numel() else 0.0


def _report(v: Verdict) -> Verdict:
    results.note_verdict(v)
    return v


def check_exact(actual, expected, *, what: str = "output") -> Verdict:
    """Element-for-element equality (rule ``exact``); error = number of differing elements."""
    a, e = _as_tensor(actual), _as_tensor(expected)
    if tuple(a.shape) != tuple(e.shape):
        return _report(Verdict(False, "exact", math.inf, 0.0, what,
                               f"shape {tuple(a.shape)} != expected {tuple(e.shape)}"))
    a_cpu, e_cpu = a.detach().cpu(), e.detach().cpu()
    if a_cpu.dtype != e_cpu.dtype and (a_cpu.is_floating_point() != e_cpu.is_floating_point()):
        return _report(Verdict(False, "exact", math.inf, 0.0, what,
                               f"dtype {a_cpu.dtype} != expected {e_cpu.dtype}"))
    neq = (a_cpu != e_cpu)
    if a_cpu.is_floating_point():
        neq &= ~(torch.isnan(a_cpu) & torch.isnan(e_cpu))
    n_bad = int(neq.sum())
    detail = ""
    if n_bad:
        idx = tuple(int(i) for i in neq.nonzero()[0])
        detail = f"{n_bad} of {a_cpu.numel()} elements differ; first at {idx}: {a_cpu[idx].item()} != {e_cpu[idx].item()}"
    return _report(Verdict(n_bad == 0, "exact", float(n_bad), 0.0, what, detail))


class Rule:
    """One comparison rule of the policy: ``judge(out, out_ref, out_pt, what) -> Verdict``.
    ``sees``: the errors it is sure to catch; ``blind_to``: what it cannot see."""

    name: str
    sees: str
    blind_to: str
    needs_out_pt: bool

    def judge(self, out: torch.Tensor, out_ref: torch.Tensor, out_pt, what: str) -> Verdict:
        raise NotImplementedError


@dataclass(frozen=True)
class RelativeRule(Rule):
    """max|out - out_ref| <= rel * max|out_ref| (float64, float32)."""

    name: str
    rel: float
    sees: str = ""
    blind_to: str = ""
    needs_out_pt: bool = False

    def judge(self, out, out_ref, out_pt, what):
        err, scale = max_abs_error(out, out_ref), scale_of(out_ref)
        bound = self.rel * scale
        rule = f"{self.name}: max|out-out_ref| <= {self.rel:g} * max|out_ref| ({scale:.3g})"
        return Verdict(err <= bound, rule, err, bound, what)


@dataclass(frozen=True)
class NaiveMultipleRule(Rule):
    """max|out - out_ref| <= min(factor * max|out_pt - out_ref| + floor, cap): the error of the
    naive computation in the output's own number format (``out_pt``: the same 16-bit dtype, or
    dequantize-then-compute for a quantized scheme) sets the scale of the allowed error;
    floor = ``floor_ulps`` ulps of ``ulp_dtype`` (default: the output's dtype) at the output's
    scale, so a zero naive error does not make the bound zero; cap = ``cap_fraction`` of the
    scale, because when the naive computation itself overflows its error says nothing."""

    name: str
    factor: float
    floor_ulps: float
    cap_fraction: float
    ulp_dtype: torch.dtype | None = None
    sees: str = ""
    blind_to: str = ""
    needs_out_pt: bool = True

    def judge(self, out, out_ref, out_pt, what):
        err, scale = max_abs_error(out, out_ref), scale_of(out_ref)
        err_pt = max_abs_error(_as_tensor(out_pt), out_ref)
        floor = self.floor_ulps * ulp(self.ulp_dtype or out.dtype) * scale
        cap = self.cap_fraction * scale
        bound = min(self.factor * err_pt + floor, cap)
        rule = (f"{self.name}: max|out-out_ref| <= min({self.factor:g} * max|out_pt-out_ref| ({err_pt:.3e}) "
                f"+ {self.floor_ulps:g} ulp * scale ({floor:.3e}), scale * {self.cap_fraction:g} ({cap:.3e}))")
        return Verdict(err <= bound, rule, err, bound, what)


def _half_rule(dtype: torch.dtype) -> NaiveMultipleRule:
    name = str(dtype).replace("torch.", "")
    return NaiveMultipleRule(
        name, SAME_DTYPE_FACTOR, FLOOR_ULPS, HALF_CAP_FRACTION,
        sees=f"errors above twice the naive {name} computation's own rounding error, at any "
             "output scale; all-zero or unchanged outputs",
        blind_to=f"errors smaller than twice the naive {name} error (a few ulps of the output's "
                 "maximum), e.g. a uniform scaling by 1-2%")


#: The policy's table: dtype or scheme name -> rule.
RULES: dict[object, Rule] = {
    torch.float64: RelativeRule("float64", REL_TOL[torch.float64],
                                sees="any algorithmic error above 1e-12 of the output's scale",
                                blind_to="errors below 1e-12 relative (float64 rounding is ~1e-16)"),
    torch.float32: RelativeRule("float32", REL_TOL[torch.float32],
                                sees="any error above 1e-5 of the output's scale (TF32 matmuls, ~1e-3, fail)",
                                blind_to="errors below 1e-5 relative"),
    torch.float16: _half_rule(torch.float16),
    torch.bfloat16: _half_rule(torch.bfloat16),
}


def register_rule(key, rule: Rule) -> None:
    """Add ``rule`` to the policy under ``key`` (a dtype or a scheme name such as "int4-weight").
    Raises TypeError for a non-Rule, ValueError when ``key`` is taken by another rule."""
    if not isinstance(rule, Rule):
        raise TypeError(f"rule must be a conformance.tolerance.Rule, got {type(rule).__name__}")
    if key in RULES and RULES[key] != rule:
        raise ValueError(f"a tolerance rule is already registered for {key!r}: {RULES[key].name}")
    RULES[key] = rule


def rule_for(key) -> Rule:
    """The rule for a dtype or scheme name; ValueError when the policy has none."""
    if key not in RULES:
        names = sorted(str(k).replace("torch.", "") for k in RULES)
        raise ValueError(f"no tolerance rule for {str(key).replace('torch.', '')}; the policy has {names}")
    return RULES[key]


def check_close(out, out_ref, *, out_pt=None, what: str = "output", rule=None) -> Verdict:
    """Compare ``out`` with the float64 reference ``out_ref`` by the rule of ``out``'s dtype, or
    by the scheme ``rule`` names (a key of :data:`RULES`).

    ``out_pt`` (the naive computation in ``out``'s number format) is required by the
    naive-multiple rules (float16/bfloat16 and quantized schemes). Raises ValueError for a shape
    mismatch, a non-float ``out``, a missing ``out_pt`` or a dtype/scheme without a rule.
    """
    out, out_ref = _as_tensor(out), _as_tensor(out_ref)
    if not out.is_floating_point():
        raise ValueError(f"check_close needs a floating output, got {out.dtype}; use check_exact")
    r = rule_for(out.dtype if rule is None else rule)
    if r.needs_out_pt and out_pt is None:
        raise ValueError(f"out_pt (the naive computation in {out.dtype}) is required by the rule {r.name!r}")
    max_abs_error(out, out_ref)  # shape check before judging
    return _report(r.judge(out, out_ref, out_pt, what))


def check_within(out, out_ref, bound, *, what: str = "output", rule: str = "per-element bound") -> Verdict:
    """Every element within its own bound: |out - out_ref| <= bound elementwise (``bound`` a
    tensor of out's shape, >= 0; where it is 0 the element must be equal). The verdict's error
    is max |out - out_ref| / bound (a ratio), its bound 1. Used by bound claims whose limit varies
    per element, such as quantization's half step of each group (QT-1); a NaN is an error of
    +inf. Raises ValueError on a shape mismatch."""
    out, out_ref, bound = _as_tensor(out), _as_tensor(out_ref), _as_tensor(bound)
    if tuple(bound.shape) != tuple(out_ref.shape):
        raise ValueError(f"shape mismatch: bound {tuple(bound.shape)} vs out_ref {tuple(out_ref.shape)}")
    max_abs_error(out, out_ref)  # shape check
    if out.numel() == 0:
        return _report(Verdict(True, rule, 0.0, 1.0, what))
    a = out.detach().to("cpu", torch.float64)
    b = out_ref.detach().to("cpu", torch.float64)
    lim = bound.detach().to("cpu", torch.float64)
    diff = torch.nan_to_num((a - b).abs(), nan=math.inf)
    ratio = torch.where(lim > 0, diff / torch.where(lim > 0, lim, 1.0),
                        torch.where(diff > 0, math.inf, 0.0))
    worst = float(ratio.max())
    idx = tuple(int(i) for i in (ratio == ratio.max()).nonzero()[0])
    detail = (f"worst element {idx}: out {a[idx].item():.6g}, out_ref {b[idx].item():.6g}, "
              f"bound {lim[idx].item():.3g}")
    return _report(Verdict(worst <= 1.0, f"{rule}: |out-out_ref| <= bound, elementwise", worst, 1.0, what, detail))


def check_scalar(measured: float, expected: float, *, rel: float, what: str) -> Verdict:
    """|measured - expected| <= rel * |expected| (analytic figures and worked answers)."""
    err = abs(float(measured) - float(expected))
    bound = rel * abs(float(expected))
    rule = f"figure: |measured-expected| <= {rel:g} * |expected| (expected {expected:.6g}, measured {measured:.6g})"
    return _report(Verdict(err <= bound, rule, err, bound, what))


def assert_exact(actual, expected, *, what: str = "output") -> Verdict:
    return check_exact(actual, expected, what=what).check()


def assert_close(out, out_ref, *, out_pt=None, what: str = "output") -> Verdict:
    return check_close(out, out_ref, out_pt=out_pt, what=what).check()


def assert_scalar(measured: float, expected: float, *, rel: float, what: str) -> Verdict:
    return check_scalar(measured, expected, rel=rel, what=what).check()
