"""Cases of the quantization laws (``properties/quantization/test_quantization.py``): drawn weights with the
group contents that break quantizers, and the calls through an implementation.

A case fixes N, K, bits, the granularity and a cycle of group *kinds*; the weight is drawn from a
seed. Each cell (a group of the granularity; for "tensor" and "channel" a row) takes the next
kind:

- ``normal``: N(0, 1) times a per-cell magnitude in {1e-3, 1, 1e3} ({1e-2, 1, 10} for the
  products of QT-9, whose float16 outputs must not overflow);
- ``zero``: all zeros (the step is 0 and the group must come back as zeros);
- ``pos`` / ``neg``: one sign only (all >= 0, all <= 0: zero points at both ends of their range);
- ``outlier``: N(0, 1) with one huge element (a quarter of the dtype's largest value for QT-1,
  100 for the products of QT-9);
- ``subnormal``: N(0, 1) with every other element a subnormal of the dtype (a quarter of its
  smallest normal), of either sign.

A group made only of subnormals arises where a cell has one or two elements (group size 1 or 2,
K <= 2): its step is below float32's normal range, so a float32 scale keeps only a few
significant bits; the contract's bound allows half the dtype's subnormal spacing for it.
The products of QT-9 keep one normal element in every cell (a one-element cell stays normal):
a weight made only of subnormals has a subnormal product, which tl.dot flushes to zero (as GPUs
do); judging it would judge the flush, not the fusion.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from hypothesis import strategies as st

from inference_conformance.conformance.contracts.quantization import COVERAGE, GROUP_KINDS
from inference_conformance.conformance.coverage import class_names, classes_reached
from inference_conformance.conformance.laws import Run, refusal
from inference_conformance.conformance.contracts.quantization import bounds as quantization_bounds
from inference_conformance.conformance.tolerance import check_close, check_exact, check_within

KINDS = GROUP_KINDS
DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class QCase:
    """One quantize call (N, K, bits, granularity), the kinds its cells cycle through, and the
    rows M of x for the product laws."""

    N: int
    K: int
    bits: int
    granularity: object
    kinds: tuple = ("normal",)
    M: int = 3

    @property
    def group_size(self) -> int:
        return self.granularity if isinstance(self.granularity, int) else self.K

    def __str__(self) -> str:
        return (f"QCase(N={self.N}, K={self.K}, bits={self.bits}, granularity={self.granularity!r}, "
                f"kinds={self.kinds}, M={self.M})")


def boundary_classes(case: QCase) -> set[str]:
    """The boundary classes a case reaches (``inference_conformance.conformance.contracts.quantization.COVERAGE``): its
    kinds, its granularity kind, several groups per row, odd K, one scale per element (group of
    1), decode (M = 1) and tiled (M > 16) products, the packed widths (2 and 4 bits) and int8."""
    return classes_reached(COVERAGE, "law_half_step", case)


#: Every class QT-1's law must reach, for each registered implementation.
REQUIRED_CLASSES = class_names(COVERAGE, "law_half_step")


@st.composite
def quant_cases(draw, max_k: int = 160) -> QCase:
    """Drawn cases: bits 2..8; "tensor", "channel" (K 1..80) or groups of 1..64 (1..4 per row);
    N 1..6; 1..4 kinds; M 1..20."""
    bits = draw(st.integers(2, 8))
    kind = draw(st.sampled_from(["tensor", "channel", "group"]))
    if kind == "group":
        g = draw(st.sampled_from([1, 2, 3, 4, 8, 16, 32, 64]))
        K = g * draw(st.integers(1, max(1, min(4, max_k // g))))
        gran = g
    else:
        K, gran = draw(st.integers(1, 80)), kind
    kinds = tuple(draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=4)))
    return QCase(draw(st.integers(1, 6)), K, bits, gran, kinds, draw(st.integers(1, 20)))


def make_weight(case: QCase, seed: int, dtype: torch.dtype, device: str, *, extreme: bool = True) -> torch.Tensor:
    """The case's weight (N, K) in ``dtype`` (drawn in float64 on the CPU, then cast and moved)."""
    g = torch.Generator().manual_seed(seed)
    gs = case.group_size
    cells = case.K // gs
    w = torch.randn(case.N, case.K, generator=g, dtype=torch.float64)
    fin = torch.finfo(dtype)
    for i in range(case.N * cells):
        n, c = divmod(i, cells)
        kind = case.kinds[i % len(case.kinds)]
        cell = w[n, c * gs:(c + 1) * gs]
        if kind == "normal":
            cell *= ((1e-3, 1.0, 1e3) if extreme else (1e-2, 1.0, 10.0))[int(torch.randint(3, (1,), generator=g))]
        elif kind == "zero":
            cell.zero_()
        elif kind == "pos":
            cell.abs_()
        elif kind == "neg":
            cell.abs_().neg_()
        elif kind == "outlier":
            j = int(torch.randint(gs, (1,), generator=g))
            cell[j] = (fin.max / 4 if extreme else 100.0) * (1 if j % 2 else -1)
        elif kind == "subnormal" and (extreme or gs > 1):
            cell[::2] = fin.tiny / 4 * torch.where(cell[::2] >= 0, 1.0, -1.0)
    return w.to(dtype).to(device)


def make_x(case: QCase, seed: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """x (M, K), N(0, 1), in ``dtype``."""
    g = torch.Generator().manual_seed(seed + 7919)
    return torch.randn(case.M, case.K, generator=g, dtype=torch.float64).to(dtype).to(device)


def as_impl(name: str, target: str, **attrs) -> SimpleNamespace:
    """A stand-in implementation object for a law over functions outside the contract (an FP8
    cast, a KV-cache format): ``name``, ``target`` (where it lives, as ``--impl`` names it),
    origin "builtin", and the functions ``attrs``."""
    return SimpleNamespace(name=name, target=target, origin="builtin", **attrs)


def number_format(impl) -> str:
    """The implementation's number format: its ``number_format`` attribute (default "int")."""
    return str(getattr(getattr(impl, "namespace", impl), "number_format", "int"))


def integer_only(impl) -> str | None:
    """None for an integer scheme; for an FP8 or FP4 scheme, why an integer law does not apply
    (QT-11's laws, ``test_quantization_fp8.py``; QT-13's, ``test_quantization_fp4.py``)."""
    fmt = number_format(impl)
    if fmt == "int":
        return None
    if fmt.startswith("fp8"):
        return f"{fmt} is an FP8 scheme: QT-11's laws judge it (test_quantization_fp8.py)"
    return f"{fmt} is an FP4 block scheme: QT-13's laws judge it (test_quantization_fp4.py)"


def symmetric(impl) -> bool:
    """The implementation's scheme: its ``symmetric`` attribute (default True)."""
    return bool(getattr(getattr(impl, "namespace", impl), "symmetric", True))


def scheme(impl) -> str | None:
    """The implementation's declared outside scheme (its ``scheme`` attribute, a key of the
    contract's SCHEMES), or None for the contract's own absmax / zero point. A declaration is
    not an excuse by itself: :func:`accepted_scheme` says where the suite accepts it."""
    return getattr(getattr(impl, "namespace", impl), "scheme", None)


def _stored(impl):
    """The implementation's ``stored(qw)`` (codes and scales read back), or None."""
    fn = getattr(getattr(impl, "namespace", impl), "stored", None)
    return fn if callable(fn) else None


def accepted_scheme(impl, case: QCase) -> str | None:
    """The declared scheme where the suite accepts it for ``case``, else None (the contract's own
    step judges the result): only for the bits and granularity the scheme defines
    (``quantization_bounds.scheme_defines``) and only from an implementation with ``stored(qw)``,
    which the own-scale law reads back (``check_own_scale``)."""
    declared = scheme(impl)
    if declared is None or _stored(impl) is None:
        return None
    return declared if quantization_bounds.scheme_defines(declared, case.bits, case.granularity) else None


def check_own_scale(impl, qw, w: torch.Tensor, d: torch.Tensor, case: QCase, declared: str) -> None:
    """The own-scale law of a declared scheme (QT-1), on what ``impl.stored(qw)`` hands back:
    ``(q, scale)``, q (N, K) integer (each code minus its zero point) and scale (N, K) float (the
    stored scale of each element's group). The scale is one per requested group and follows the
    scheme's formula (within its storage rounding); each code is round-to-nearest of
    w / stored scale within the scheme's code range; dequantize reproduces q x stored scale.
    AssertionError (a tolerance verdict) naming the first comparison that fails."""
    q, scale = _stored(impl)(qw)
    N, K = w.shape
    assert tuple(q.shape) == (N, K) and tuple(scale.shape) == (N, K), (
        f"stored(qw) returned codes {tuple(q.shape)} and scales {tuple(scale.shape)}, expected {(N, K)} each")
    assert not q.dtype.is_floating_point, f"stored(qw) returned codes of dtype {q.dtype}, expected an integer dtype"
    s = scale.detach().to("cpu", torch.float64)
    g = case.group_size if case.granularity != "tensor" else N * K
    groups = s.reshape(-1, g)
    check_exact(groups, groups[:, :1].expand_as(groups), what=f"stored scale, one per requested group ({case})").check()
    ref, scale_bound, x, code_bound = quantization_bounds.own_scale_targets(w, case.bits, case.granularity, declared, s)
    check_within(s, ref, scale_bound, what=f"stored scale vs {declared}'s formula ({case})",
                 rule="declared scheme's scale formula").check()
    qf = q.detach().to("cpu", torch.float64)
    check_within(qf, x, code_bound, what=f"codes vs round(w / stored scale) ({case})",
                 rule="own-scale law: round to nearest of the stored scale").check()
    check_within(d, qf * s, quantization_bounds.product_bound(qf, s, d.dtype),
                 what=f"dequantize vs code x stored scale ({case})", rule="own-scale law: code x stored scale").check()


def act_order_cases() -> st.SearchStrategy[QCase]:
    """Drawn cases for the act-order laws: an int group size with at least two groups per row."""
    return quant_cases().filter(lambda c: isinstance(c.granularity, int) and c.K // c.granularity >= 2)


def make_g_idx(case: QCase, seed: int, device: str) -> torch.Tensor:
    """An act-order g_idx (K,) for the case: the columns in a drawn processing order, group
    i // g for the i-th (``act_order_g_idx``). Never the identity grouping k // g: where the
    drawn order keeps every column in its group, the groups are rotated by one."""
    from inference_conformance.conformance.contracts.quantization import act_order_g_idx

    g = torch.Generator().manual_seed(seed + 104729)
    g_idx = act_order_g_idx(torch.randperm(case.K, generator=g), case.group_size)
    plain = torch.arange(case.K) // case.group_size
    if torch.equal(g_idx, plain):
        g_idx = (plain + 1) % (case.K // case.group_size)
    return g_idx.to(device)


def quantize(impl, w: torch.Tensor, case: QCase, g_idx: torch.Tensor | None = None, *, run: Run | None = None):
    """impl.quantize(w, bits=, granularity=) (and g_idx= when given). Inside a law's example
    (``run`` given) the case is observed (for the contract's coverage table) and a
    NotImplementedError discards the example ("every example refused" is "unsupported");
    outside a law it skips the test as "unsupported". Never a pass."""
    extra = {} if g_idx is None else {"g_idx": g_idx}
    if run is not None:
        run.observe(case)
    with refusal(run, f"{getattr(impl, 'name', impl)} refuses {w.dtype}, bits={case.bits}, "
                      f"granularity={case.granularity!r}"):
        return impl.quantize(w, bits=case.bits, granularity=case.granularity, **extra)


def check_matmul(out, x, d, case, what="matmul(x, qw)"):
    """The tolerance policy's ``quant-matmul`` rule: out vs x @ d.T in float64 (out_ref), with the
    naive dequantize-then-multiply in x's dtype (out_pt) and the floor at the products' own
    magnitude max(|x| @ |d|.T), so a correct sum in another order passes a cancelling row."""
    assert tuple(out.shape) == (case.M, case.N), f"matmul returned {tuple(out.shape)}, expected {(case.M, case.N)}"
    assert out.dtype == x.dtype, f"matmul returned {out.dtype}, x is {x.dtype}"
    out_ref = x.double() @ d.double().T
    out_pt = x @ d.T
    magnitude = float((x.double().abs() @ d.double().abs().T).max()) if x.numel() and d.numel() else 0.0
    return check_close(out, out_ref, out_pt=out_pt, rule="quant-matmul", what=f"{what} ({case})",
                       magnitude=magnitude).check()


# -------------------------------------------------------------------------------------- QT-9
#: Pinned: together they reject every zoo entry and reach every boundary class in every profile.
EXAMPLES = (
    QCase(3, 32, 4, 8, ("normal", "zero", "pos", "neg", "outlier", "subnormal"), M=5),   # kills all six
    QCase(5, 33, 8, "channel", ("normal", "outlier"), M=1),                             # int8 per channel, odd K
    QCase(4, 7, 2, "tensor", ("pos", "normal"), M=17),                                  # 2 bits per tensor, tiled
    QCase(2, 5, 3, 1, ("neg", "subnormal", "zero"), M=2),                               # a scale per element
    QCase(2, 64, 6, 16, ("subnormal", "neg", "pos"), M=16),
    QCase(6, 128, 8, 32, ("normal",), M=20),                                            # int8 groups
    QCase(4, 128, 4, 64, ("normal", "outlier"), M=1),                                   # int4 g64 decode
    QCase(3, 24, 5, 12, ("zero", "pos"), M=3),
    QCase(3, 4, 7, 2, ("subnormal", "outlier"), M=2),                                  # subnormal-only groups
    QCase(1, 2, 2, 1, ("normal",), M=1),                             # one row, a scale per element
    QCase(1, 43, 4, "tensor", ("pos",), M=1),       # one-sign weights: a product with heavy cancellation
)
#: The seed of each pinned example (the last one's seed 52 cancels heavily: bfloat16
#: tiles truncated instead of rounded, as Triton's interpreter casts, fail QT-9 there).
EXAMPLE_SEEDS = tuple(range(1, len(EXAMPLES))) + (52,)



def pinned(cases_and_seeds) -> tuple:
    """Pinned examples ``dict(case=c, seed=s)`` of the laws drawing ``case`` and ``seed``."""
    return tuple(dict(case=c, seed=s) for c, s in cases_and_seeds)


def product_case(impl, case: QCase) -> QCase:
    """The case a product law runs for ``impl``: its bits its number format's (8 for an FP8
    scheme, 4 for an FP4 one; an integer scheme's as drawn), the rest unchanged."""
    fmt = number_format(impl)
    return case if fmt == "int" else dataclasses.replace(case, bits=8 if fmt.startswith("fp8") else 4)


