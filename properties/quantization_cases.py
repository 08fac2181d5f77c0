"""Cases of the quantization laws (``properties/test_quantization.py``): drawn weights with the
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

from dataclasses import dataclass

import torch
from hypothesis import note, reject
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from conformance.outcomes import unsupported
from conformance.tolerance import check_close
from properties.attention_cases import _Support

KINDS = ("normal", "zero", "pos", "neg", "outlier", "subnormal")
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
    """The boundary classes a case reaches: its kinds, its granularity kind, several groups per
    row, odd K, one scale per element (group of 1), decode (M = 1) and tiled (M > 16) products,
    the packed widths (2 and 4 bits) and int8."""
    out = {f"kind:{k}" for k in case.kinds}
    out.add(f"granularity:{case.granularity if isinstance(case.granularity, str) else 'group'}")
    if isinstance(case.granularity, int) and case.K // case.granularity >= 2 and case.N >= 2:
        out.add("several groups per row")
    if case.granularity == 1:
        out.add("group of one")
    if "subnormal" in case.kinds and case.group_size <= 2:
        out.add("a group of subnormals only")
    if case.K % 2:
        out.add("odd K")
    out.add(f"bits:{case.bits}")
    if case.N == 1:
        out.add("N = 1")
    if case.M == 1:
        out.add("M = 1")
    if case.M > 16:
        out.add("M > 16")
    return out


REQUIRED_CLASSES = ({f"kind:{k}" for k in KINDS} | {"granularity:tensor", "granularity:channel", "granularity:group",
                                                     "several groups per row", "group of one", "odd K",
                                                     "a group of subnormals only", "N = 1",
                                                     "M = 1", "M > 16"} | {f"bits:{b}" for b in (2, 3, 4, 8)})


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


def symmetric(impl) -> bool:
    """The implementation's scheme: its ``symmetric`` attribute (default True)."""
    return bool(getattr(getattr(impl, "namespace", impl), "symmetric", True))


def act_order_cases() -> st.SearchStrategy[QCase]:
    """Drawn cases for the act-order laws: an int group size with at least two groups per row."""
    return quant_cases().filter(lambda c: isinstance(c.granularity, int) and c.K // c.granularity >= 2)


def make_g_idx(case: QCase, seed: int, device: str) -> torch.Tensor:
    """An act-order g_idx (K,) for the case: the columns in a drawn processing order, group
    i // g for the i-th (``act_order_g_idx``). Never the identity grouping k // g: where the
    drawn order keeps every column in its group, the groups are rotated by one."""
    from conformance.contracts.quantization import act_order_g_idx

    g = torch.Generator().manual_seed(seed + 104729)
    g_idx = act_order_g_idx(torch.randperm(case.K, generator=g), case.group_size)
    plain = torch.arange(case.K) // case.group_size
    if torch.equal(g_idx, plain):
        g_idx = (plain + 1) % (case.K // case.group_size)
    return g_idx.to(device)


def quantize(impl, w: torch.Tensor, case: QCase, g_idx: torch.Tensor | None = None):
    """impl.quantize(w, bits=, granularity=) (and g_idx= when given); a NotImplementedError
    discards the example inside a law (``run_law`` turns "every example refused" into
    "unsupported") and skips the test as "unsupported" outside one; never a pass."""
    extra = {} if g_idx is None else {"g_idx": g_idx}
    try:
        qw = impl.quantize(w, bits=case.bits, granularity=case.granularity, **extra)
    except NotImplementedError as exc:
        reason = f"{getattr(impl, 'name', impl)} refuses {w.dtype}, bits={case.bits}, granularity={case.granularity!r}: {exc}"
        if currently_in_test_context():
            _Support.refused.append(reason)
            note(reason)
            reject()
        unsupported(reason)
    _Support.ran += 1
    return qw


def check_matmul(out, x, d, case, what="matmul(x, qw)"):
    """The tolerance policy's ``quant-matmul`` rule: out vs x @ d.T in float64 (out_ref), with the
    naive dequantize-then-multiply in x's dtype (out_pt)."""
    assert tuple(out.shape) == (case.M, case.N), f"matmul returned {tuple(out.shape)}, expected {(case.M, case.N)}"
    assert out.dtype == x.dtype, f"matmul returned {out.dtype}, x is {x.dtype}"
    out_ref = x.double() @ d.double().T
    out_pt = x @ d.T
    return check_close(out, out_ref, out_pt=out_pt, rule="quant-matmul", what=f"{what} ({case})").check()
