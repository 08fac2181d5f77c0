"""The one split-KV merge (``inference_conformance.optimized.attention.tiles.merge_splits``, claim FA-7) that
Flash-Decoding and paged attention share: a split that saw no key (lse = -inf) weighs 0, and a
row whose splits all saw none comes out 0, never NaN; through the public kernels too, where
later splits are empty for early causal rows (split-KV) and for short sequences (paged)."""
from __future__ import annotations

import pytest
import torch

from inference_conformance.properties.paged_attention.cases import PagedCase, make_inputs

pytestmark = pytest.mark.usefixtures("one_torch_thread")

INF = float("inf")


def _spy_merge(monkeypatch, mod):
    """Record the split count of every merge that ``mod`` launches."""
    seen = []
    real = mod.merge_splits

    def spy(o_part, lse, out):
        seen.append(o_part.shape[2])
        return real(o_part, lse, out)

    monkeypatch.setattr(mod, "merge_splits", spy)
    return seen


@pytest.mark.parametrize("part_dtype", [torch.float32, torch.float64])
def test_merge_weighs_empty_splits_zero_and_gives_zero_for_a_row_with_no_key(device, part_dtype):
    tiles = pytest.importorskip("inference_conformance.optimized.attention.tiles")
    g = torch.Generator().manual_seed(0)
    B, Hq, Tq, S, D = 1, 2, 3, 3, 5
    o_part = torch.randn(B * Hq, Tq, S, D, generator=g, dtype=torch.float64)
    lse = torch.randn(B * Hq, Tq, S, generator=g, dtype=torch.float64)
    lse[:, 1, 1] = -INF                       # row 1: split 1 saw no key (its o is written as 0)
    o_part[:, 1, 1] = 0.0
    lse[:, 2] = -INF                          # row 2: no split saw a key
    o_part[:, 2] = 0.0
    w = torch.softmax(lse[:, :2], dim=-1)     # the exact merge of rows 0 and 1
    want = torch.zeros(B * Hq, Tq, D, dtype=torch.float64)
    want[:, :2] = (w[..., None] * o_part[:, :2]).sum(dim=2)
    out = torch.full((B, Hq, Tq, D), float("nan"), dtype=part_dtype, device=device)
    tiles.merge_splits(o_part.to(device, part_dtype), lse.to(device, part_dtype), out)
    out = out.cpu().double().reshape(B * Hq, Tq, D)
    assert torch.isfinite(out).all(), out
    assert torch.equal(out[:, 2], torch.zeros_like(out[:, 2]))
    tol = 1e-6 if part_dtype == torch.float32 else 1e-14
    torch.testing.assert_close(out, want, rtol=tol, atol=tol)


def test_merge_rejects_partials_that_do_not_fit_the_output(device):
    tiles = pytest.importorskip("inference_conformance.optimized.attention.tiles")
    o_part = torch.zeros(4, 3, 2, 5, device=device)
    out = torch.empty(1, 2, 3, 5, device=device)
    with pytest.raises(ValueError, match="do not fit"):
        tiles.merge_splits(o_part, torch.zeros(4, 3, 2, device=device), out)


def test_split_kv_with_splits_past_a_causal_row_matches_the_reference(device, monkeypatch):
    """Tq = Tk = 8, causal, one key per split: row r sees splits 0..r, the other splits are
    empty for it."""
    fd = pytest.importorskip("inference_conformance.optimized.attention.flash_decoding")
    from inference_conformance.reference.attention import attention_naive

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 8, 16, generator=g, dtype=torch.float64).to(device) for _ in range(3))
    seen = _spy_merge(monkeypatch, fd)
    out = fd.flash_decoding(q, k, v, causal=True, scale=0.25, num_splits=8)
    want = attention_naive(q, k, v, causal=True, scale=0.25, dtype=torch.float64)
    assert seen == [8]
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)


def test_paged_splits_past_a_short_sequence_weigh_zero(device, monkeypatch):
    """Lengths 300 and 5 in three splits: the second sequence's last two splits are empty."""
    pa = pytest.importorskip("inference_conformance.optimized.paged_attention")
    from inference_conformance.reference.paged_attention import paged_attention as paged_ref

    case = PagedCase((300, 5), 4, 2, 16, 16, 0.25)
    inp = make_inputs(case, 2, torch.float64, device)
    seen = _spy_merge(monkeypatch, pa)
    out = pa.paged_attention(*inp.args(), scale=case.scale, num_splits=3)
    assert seen == [3]
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, paged_ref(*inp.args(), scale=case.scale), rtol=1e-12, atol=1e-12)


def test_triton_num_splits_past_max_splits_is_capped(device, monkeypatch):
    """A num_splits above MAX_SPLITS (here a million) makes MAX_SPLITS splits (the merge holds a
    row's splits in one tile), dense and paged, with the exact result."""
    fd = pytest.importorskip("inference_conformance.optimized.attention.flash_decoding")
    pa = pytest.importorskip("inference_conformance.optimized.paged_attention")
    from inference_conformance.optimized.attention.tiles import MAX_SPLITS
    from inference_conformance.reference.attention import attention_naive
    from inference_conformance.reference.paged_attention import paged_attention as paged_ref

    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 1, 1, 1, generator=g, dtype=torch.float64).to(device)
    k, v = (torch.randn(1, 1, MAX_SPLITS + 9, 1, generator=g, dtype=torch.float64).to(device) for _ in range(2))
    seen = _spy_merge(monkeypatch, fd)
    out = fd.flash_decoding(q, k, v, causal=False, scale=0.5, num_splits=10**6)
    assert seen == [MAX_SPLITS]
    torch.testing.assert_close(out, attention_naive(q, k, v, causal=False, scale=0.5, dtype=torch.float64),
                               rtol=1e-12, atol=1e-12)
    case = PagedCase((300, 5), 2, 1, 8, 16, 0.25)
    inp = make_inputs(case, 4, torch.float64, device)
    seen = _spy_merge(monkeypatch, pa)
    out = pa.paged_attention(*inp.args(), scale=case.scale, num_splits=10**6)
    assert len(seen) == 1 and 1 < seen[0] <= MAX_SPLITS, seen
    torch.testing.assert_close(out, paged_ref(*inp.args(), scale=case.scale), rtol=1e-12, atol=1e-12)
