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
  cannot widen it. Measured (properties/attention/test_attention.py, bfloat16): the built-ins (reference,
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

Each check returns a :class:`Comparison`; the ``assert_*`` forms raise ``AssertionError`` whose
message states the measured error, the bound and the rule. Every verdict is also reported to
:mod:`inference_conformance.conformance.results`, which turns the worst one of a test into its result row.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from inference_conformance.conformance import failures, results
from inference_conformance.conformance.tolerance_rules import (  # noqa: F401 - the policy's names, re-exported
    ELEMENT_ULPS,
    FLOOR_ULPS,
    HALF_DTYPES,
    REL_TOL,
    RULES,
    SAME_DTYPE_FACTOR,
    SCALE_ULPS,
    MixedPrecisionRule,
    NaiveMultipleRule,
    RelativeRule,
    Comparison,
    Rule,
    Verdict,
    _abs_diff,
    _as_tensor,
    max_abs_error,
    model_rule,
    scale_of,
    spacing,
    ulp,
    worst_element,
)


def report_verdict(v: Comparison) -> Comparison:
    """Record ``v`` for the running test's result row (its worst comparison) and return it:
    every check_* does this; a law that builds its own Comparison calls it too."""
    results.note_verdict(v)
    return v


def _exact(actual, expected, what: str) -> Comparison:
    a, e = _as_tensor(actual), _as_tensor(expected)
    if tuple(a.shape) != tuple(e.shape):
        return Comparison(False, "exact", math.inf, 0.0, what, f"shape {tuple(a.shape)} != expected {tuple(e.shape)}")
    a_cpu, e_cpu = a.detach().cpu(), e.detach().cpu()
    if a_cpu.dtype != e_cpu.dtype and (a_cpu.is_floating_point() != e_cpu.is_floating_point()):
        return Comparison(False, "exact", math.inf, 0.0, what, f"dtype {a_cpu.dtype} != expected {e_cpu.dtype}")
    neq = (a_cpu != e_cpu)
    if a_cpu.is_floating_point():
        neq &= ~(torch.isnan(a_cpu) & torch.isnan(e_cpu))
    n_bad = int(neq.sum())
    detail = ""
    if n_bad:
        idx = tuple(int(i) for i in neq.nonzero()[0])
        detail = f"{n_bad} of {a_cpu.numel()} elements differ; first at {idx}: {a_cpu[idx].item()} != {e_cpu[idx].item()}"
    return Comparison(n_bad == 0, "exact", float(n_bad), 0.0, what, detail)


def _same_by(judge: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    """``same(out, other)``: ``judge(out, other)`` passes (False where it cannot compare them)."""
    def same(out, other) -> bool:
        try:
            return bool(judge(out, other))
        except (ValueError, TypeError, RuntimeError):
            return False
    return same


def check_exact(actual, expected, *, what: str = "output") -> Comparison:
    """Element-for-element equality (rule ``exact``); error = number of differing elements."""
    v = _exact(actual, expected, what)
    failures.note_comparison(v, actual, _same_by(lambda o, z: _exact(o, z, what).ok))
    return report_verdict(v)



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
                magnitude: float | None = None) -> Comparison:
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
    v = r.judge(out, out_ref, out_pt, what, magnitude)
    if r.needs_out_pt:        # its bound follows from out_pt: another output is judged by that bound
        same = _same_by(lambda o, z: max_abs_error(o, z) <= v.bound)
    else:
        same = _same_by(lambda o, z: r.judge(_as_tensor(o), _as_tensor(z), None, what, magnitude).ok)
    failures.note_comparison(v, out, same)
    return report_verdict(v)


def check_within(out, out_ref, bound, *, what: str = "output", rule: str = "per-element bound") -> Comparison:
    """Every element within its own bound: |out - out_ref| <= bound elementwise (``bound`` a
    tensor of out's shape, >= 0; where it is 0 the element must be equal). The verdict's error
    is max |out - out_ref| / bound (a ratio), its bound 1. Used by bound claims whose limit varies
    per element, such as quantization's half step of each group (QT-1); a NaN, or an infinity
    where the reference is finite, is an error of +inf. Raises ValueError on a shape mismatch."""
    out, out_ref, bound = _as_tensor(out), _as_tensor(out_ref), _as_tensor(bound)
    if tuple(bound.shape) != tuple(out_ref.shape):
        raise ValueError(f"shape mismatch: bound {tuple(bound.shape)} vs out_ref {tuple(out_ref.shape)}")
    v = _within(out, out_ref, bound, what, rule)
    failures.note_comparison(v, out, _same_by(lambda o, z: _within(_as_tensor(o), _as_tensor(z), bound, what, rule).ok))
    return report_verdict(v)


def _within(out, out_ref, bound, what: str, rule: str) -> Comparison:
    max_abs_error(out, out_ref)  # shape check
    if out.numel() == 0:
        return Comparison(True, rule, 0.0, 1.0, what)
    a = out.detach().to("cpu", torch.float64)
    b = out_ref.detach().to("cpu", torch.float64)
    lim = bound.detach().to("cpu", torch.float64)
    # the verdict's ratio: an infinity stands at float64's max (only an infinite bound admits it)
    diff = torch.nan_to_num((a - b).abs(), nan=math.inf)
    ratio = torch.where(lim > 0, diff / torch.where(lim > 0, lim, 1.0),
                        torch.where(diff > 0, math.inf, 0.0))
    worst = float(ratio.max())
    idx = tuple(int(i) for i in (ratio == ratio.max()).nonzero()[0])
    ok = worst <= 1.0
    if not ok and not math.isfinite(a[idx].item()):
        worst = math.inf    # the error an infinity where a finite value is due is measured at, as NaN's
    detail = (f"worst element {idx}: out {a[idx].item():.6g}, out_ref {b[idx].item():.6g}, "
              f"bound {lim[idx].item():.3g}")
    return Comparison(ok, f"{rule}: |out-out_ref| <= bound, elementwise; error and bound in units "
                   f"of each element's own bound", worst, 1.0, what, detail)


def check_scalar(measured: float, expected: float, *, rel: float, what: str) -> Comparison:
    """|measured - expected| <= rel * |expected| (analytic figures and worked answers)."""
    err = abs(float(measured) - float(expected))
    bound = rel * abs(float(expected))
    rule = f"figure: |measured-expected| <= {rel:g} * |expected| (expected {expected:.6g}, measured {measured:.6g})"
    v = Comparison(err <= bound, rule, err, bound, what)
    failures.note_comparison(v, measured, _same_by(lambda o, z: abs(float(o) - float(z)) <= bound))
    return report_verdict(v)


def assert_exact(actual, expected, *, what: str = "output") -> Comparison:
    return check_exact(actual, expected, what=what).check()


def assert_close(out, out_ref, *, out_pt=None, what: str = "output", rule=None) -> Comparison:
    return check_close(out, out_ref, out_pt=out_pt, what=what, rule=rule).check()


def assert_scalar(measured: float, expected: float, *, rel: float, what: str) -> Comparison:
    return check_scalar(measured, expected, rel=rel, what=what).check()

