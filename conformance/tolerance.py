"""The suite's one tolerance policy. Every float or exact assertion goes through this module.

Rules (chosen by the dtype of the output under test):

- ``exact``      integers, token ids, cache writes, allocator state: equal, element for element.
- ``float64``    max|out - out_ref| <= 1e-12 * scale, scale = max|out_ref| (the lectures claim ~1e-14).
  Sees any algorithmic error above 1e-12 of the output's scale (a scale rounded to float32,
  ~1e-8, fails); blind to errors below 1e-12 relative.
- ``float32``    max|out - out_ref| <= 1e-5 * scale. Sees any error above 1e-5 of the output's
  scale (TF32 matmuls, ~1e-3, fail); blind to errors below 1e-5 relative.
- ``float16`` / ``bfloat16`` (one kernel: 16-bit inputs, a float32 accumulator, one rounding at
  the end): the output is judged element by element against the *mixed-precision reference*
  ``out_mix`` = the float64 result of the same 16-bit inputs (``out_ref``) rounded to the output's
  dtype, by

      |out_i - out_mix_i| <= ulp(out_mix_i) + ulp(max|out_ref|) / 2

  where ulp(x) is the spacing of the dtype at |x| (bfloat16: 2^-7 at 1). The first term is a
  floor in ulps of each element (a correctly rounded kernel is 0 ulps off, one whose float32
  accumulation or whose probabilities rounded to 16 bits before P·V land on the other side of a
  rounding boundary 1 ulp), the second half an ulp of the output's scale, for elements that are
  small because of cancellation (their absolute rounding error follows the inputs' scale, not
  their own). Sees: a uniform scaling by 2% (bfloat16: 2.6 to 5 ulps of each element; float16:
  20), a 16-bit online-softmax accumulator (m, l, acc in 16 bits) from about 1000 keys on, one
  dropped key among ~1000, all-zero or unchanged outputs. Blind to: errors within 1 ulp of each
  element plus half an ulp of the scale (a bfloat16 scaling by 1% or less; a 16-bit accumulator
  over a few key tiles). It needs no ``out_pt``, so an overflowing naive 16-bit computation
  cannot widen it. Measured (properties/test_attention.py, bfloat16): the built-ins (reference,
  Triton, split-KV, SDPA, and a model of the GPU kernel that rounds P to bfloat16 before P·V)
  use at most 0.71 of the bound; a ×1.02 output at least 1.67 of it, the 16-bit accumulator at
  Tk = 1100 at least 1.5, a dropped key at Tk = 1100 at least 4.
- ``float16-model`` / ``bfloat16-model`` (named explicitly by checks of a whole model, where
  every layer rounds its activations to 16 bits): max|out - out_ref| <= 2 * max|out_pt - out_ref|
  + 4 ulps of the output's scale, where ``out_pt`` is the *reference* model run in the same
  16-bit dtype (never the implementation under test). Sees errors above twice what the
  reference model's own 16-bit rounding costs (a wrong position, a missing token, stale cache
  entries); blind to errors smaller than that (for a 2-layer bfloat16 model, ~0.1-0.5 of the
  logits' scale). When ``out_pt`` is not finite where ``out_ref`` is (the naive computation
  overflowed), the bound falls back to the floor instead of growing without limit.

The rules are a table (:data:`RULES`), keyed by the output's dtype or by a scheme name that a
check names explicitly (``check_close(..., rule="quant-matmul")``); a technique declares its own
in its contract (``Contract.rules``; quantization: a multiple of the naive dequantize-then-compute
error plus a floor, an instance of :class:`NaiveMultipleRule`), and :func:`all_rules` reads the
whole table from the contracts: importing a module never changes the policy. Each rule states what it can and cannot see
(``Rule.sees`` / ``Rule.blind_to``), and the report shows it next to the verdicts.

No rule is a bare absolute tolerance: every bound is proportional to the reference's scale, so an
all-zero output, or an input returned unchanged, fails every float comparison
(``tests/test_tolerance.py`` shows it). NaN or inf in ``out`` where ``out_ref`` is finite is an
error of +inf. Statistical rules (sampling claims) live in :mod:`inference_conformance.conformance.stats` and fix
their false-alarm rate per test.

Each check returns a :class:`Verdict`; the ``assert_*`` forms raise ``AssertionError`` whose
message states the measured error, the bound and the rule. Every verdict is also reported to
:mod:`inference_conformance.conformance.results`, which turns the worst one of a test into its result row.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from inference_conformance.conformance import results

REL_TOL = {torch.float64: 1e-12, torch.float32: 1e-5}
HALF_DTYPES = (torch.float16, torch.bfloat16)
#: 16-bit kernel rule: allowed ulps of each element, and ulps of the output's scale.
ELEMENT_ULPS = 1.0
SCALE_ULPS = 0.5
#: 16-bit whole-model rule: multiple of the reference model's own 16-bit error, floor in ulps.
SAME_DTYPE_FACTOR = 2.0
FLOOR_ULPS = 4.0


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


def report_verdict(v: Verdict) -> Verdict:
    """Record ``v`` for the running test's result row (its worst comparison) and return it:
    every check_* does this; a law that builds its own Verdict calls it too."""
    results.note_verdict(v)
    return v


def check_exact(actual, expected, *, what: str = "output") -> Verdict:
    """Element-for-element equality (rule ``exact``); error = number of differing elements."""
    a, e = _as_tensor(actual), _as_tensor(expected)
    if tuple(a.shape) != tuple(e.shape):
        return report_verdict(Verdict(False, "exact", math.inf, 0.0, what,
                               f"shape {tuple(a.shape)} != expected {tuple(e.shape)}"))
    a_cpu, e_cpu = a.detach().cpu(), e.detach().cpu()
    if a_cpu.dtype != e_cpu.dtype and (a_cpu.is_floating_point() != e_cpu.is_floating_point()):
        return report_verdict(Verdict(False, "exact", math.inf, 0.0, what,
                               f"dtype {a_cpu.dtype} != expected {e_cpu.dtype}"))
    neq = (a_cpu != e_cpu)
    if a_cpu.is_floating_point():
        neq &= ~(torch.isnan(a_cpu) & torch.isnan(e_cpu))
    n_bad = int(neq.sum())
    detail = ""
    if n_bad:
        idx = tuple(int(i) for i in neq.nonzero()[0])
        detail = f"{n_bad} of {a_cpu.numel()} elements differ; first at {idx}: {a_cpu[idx].item()} != {e_cpu[idx].item()}"
    return report_verdict(Verdict(n_bad == 0, "exact", float(n_bad), 0.0, what, detail))


class Rule:
    """One comparison rule of the policy: ``judge(out, out_ref, out_pt, what) -> Verdict``.
    ``sees``: the errors it is sure to catch; ``blind_to``: what it cannot see."""

    name: str
    sees: str
    blind_to: str
    needs_out_pt: bool

    def judge(self, out: torch.Tensor, out_ref: torch.Tensor, out_pt, what: str, magnitude: float | None = None) -> Verdict:
        raise NotImplementedError


@dataclass(frozen=True)
class RelativeRule(Rule):
    """max|out - out_ref| <= rel * max|out_ref| (float64, float32)."""

    name: str
    rel: float
    sees: str = ""
    blind_to: str = ""
    needs_out_pt: bool = False

    def judge(self, out, out_ref, out_pt, what, magnitude=None):
        err, scale = max_abs_error(out, out_ref), scale_of(out_ref)
        bound = self.rel * scale
        rule = f"{self.name}: max|out-out_ref| <= {self.rel:g} * max|out_ref| ({scale:.3g})"
        ok = err <= bound
        return Verdict(ok, rule, err, bound, what, "" if ok else worst_element(out, out_ref))


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
    sees: str = ""
    blind_to: str = ""
    needs_out_pt: bool = False

    def judge(self, out, out_ref, out_pt, what, magnitude=None):
        rule = (f"{self.name}: |out-out_mix| <= {self.element_ulps:g} ulp(out_mix) + "
                f"{self.scale_ulps:g} ulp(max|out_ref|), out_mix = float64 result of the same "
                f"{self.name} inputs rounded to {self.name}")
        if out.numel() == 0:
            return Verdict(True, rule, 0.0, 0.0, what)
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
        return Verdict(bool(ratio[i] <= 1.0), rule, e, b, what, detail)


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
    sees: str = ""
    blind_to: str = ""
    needs_out_pt: bool = True

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
        return Verdict(ok, rule, err, bound, what, detail)


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


def all_rules() -> dict[object, Rule]:
    """The whole policy: the dtype and model rules of :data:`RULES`, then each contract's own
    scheme rules (``Contract.rules``, e.g. "quant-matmul"). Raises ValueError when a contract's
    scheme name is taken by another rule. Nothing is registered at import: the table is read
    from the contracts each time."""
    from inference_conformance.conformance import registry

    table: dict[object, Rule] = dict(RULES)
    for technique, c in sorted(registry.contracts().items()):
        for key, rule in c.rules.items():
            if not isinstance(rule, Rule):
                raise TypeError(f"contract {technique!r}: rule {key!r} is not a inference_conformance.conformance.tolerance.Rule")
            if key in table and table[key] != rule:
                raise ValueError(f"contract {technique!r} declares the tolerance rule {key!r}, "
                                 f"which the policy already has: {table[key].name}")
            table[key] = rule
    return table


def rule_for(key) -> Rule:
    """The rule for a dtype or scheme name (a rule object is returned as it is); ValueError when
    the policy has none."""
    if isinstance(key, Rule):
        return key
    if key in RULES:
        return RULES[key]
    table = all_rules()
    if key not in table:
        names = sorted(str(k).replace("torch.", "") for k in table)
        raise ValueError(f"no tolerance rule for {str(key).replace('torch.', '')}; the policy has {names}")
    return table[key]


def check_close(out, out_ref, *, out_pt=None, what: str = "output", rule=None,
                magnitude: float | None = None) -> Verdict:
    """Compare ``out`` with the float64 reference ``out_ref`` by the rule of ``out``'s dtype, or
    by the scheme ``rule`` names (a key of :func:`all_rules`, or a :class:`Rule` itself).

    ``out_pt`` (the naive reference computation in ``out``'s number format, never the
    implementation under test) is required by the naive-multiple rules (the 16-bit whole-model
    rules and quantized schemes) and ignored by the others. ``magnitude`` (a sum's own scale:
    max over outputs of sum_k |a_k| * |b_k|, e.g. ``(|x| @ |w|.T).max()``) sets the floor of the
    naive-multiple rules where it exceeds the output's scale: any summation order rounds at the
    terms' size, which a cancelling sum hides from ``out_ref``. Raises ValueError for a shape
    mismatch, a non-float ``out``, a missing ``out_pt`` or a dtype/scheme without a rule.
    """
    out, out_ref = _as_tensor(out), _as_tensor(out_ref)
    if not out.is_floating_point():
        raise ValueError(f"check_close needs a floating output, got {out.dtype}; use check_exact")
    r = rule_for(out.dtype if rule is None else rule)
    if r.needs_out_pt and out_pt is None:
        raise ValueError(f"out_pt (the naive computation in {out.dtype}) is required by the rule {r.name!r}")
    max_abs_error(out, out_ref)  # shape check before judging
    return report_verdict(r.judge(out, out_ref, out_pt, what, magnitude))


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
        return report_verdict(Verdict(True, rule, 0.0, 1.0, what))
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
    return report_verdict(Verdict(worst <= 1.0, f"{rule}: |out-out_ref| <= bound, elementwise; error and bound in units "
                           f"of each element's own bound", worst, 1.0, what, detail))


def check_scalar(measured: float, expected: float, *, rel: float, what: str) -> Verdict:
    """|measured - expected| <= rel * |expected| (analytic figures and worked answers)."""
    err = abs(float(measured) - float(expected))
    bound = rel * abs(float(expected))
    rule = f"figure: |measured-expected| <= {rel:g} * |expected| (expected {expected:.6g}, measured {measured:.6g})"
    return report_verdict(Verdict(err <= bound, rule, err, bound, what))


def assert_exact(actual, expected, *, what: str = "output") -> Verdict:
    return check_exact(actual, expected, what=what).check()


def assert_close(out, out_ref, *, out_pt=None, what: str = "output", rule=None) -> Verdict:
    return check_close(out, out_ref, out_pt=out_pt, what=what, rule=rule).check()


def assert_scalar(measured: float, expected: float, *, rel: float, what: str) -> Verdict:
    return check_scalar(measured, expected, rel=rel, what=what).check()
