"""FA-1, FA-2, FA-4, FA-5 and FA-6's checks (properties/attention/flash_cases.py) reject known-bad
softmaxes, traces, traffic formulas and memory measurements: each test feeds the claim's own
check the reference's functions (they must pass) and a known-bad one (it must fail, by the figure
the mistake moves)."""
from __future__ import annotations

import math

import pytest
import torch

from inference_conformance.properties.falsify import rejects
from inference_conformance.properties.attention.flash_cases import check_fa1, check_fa2_exercise3, check_fa4, check_fa5, check_fa6
from inference_conformance.reference import attention as ref


# ------------------------------------------------------------------------ known-bad functions
def softmax_unnormalised(x):
    """exp(x - max x), never divided by the sum."""
    return torch.exp(x - x.max(dim=-1, keepdim=True).values)


def trace_without_rescale(x, chunks):
    """Online softmax whose running sum is not rescaled by exp(m - m') when the max rises."""
    m, l, out, i = -math.inf, 0.0, [], 0
    for c in chunks:
        part = x[i:i + c]
        i += c
        m_new = max(m, max(part))
        l = l + sum(math.exp(v - m_new) for v in part)
        m = m_new
        out.append((m, l))
    return out


def trace_stale_max(x, chunks):
    """Online softmax that keeps the first chunk's max (the running max never updated)."""
    m, l, out, i = None, 0.0, [], 0
    for c in chunks:
        part = x[i:i + c]
        i += c
        m = max(part) if m is None else m
        l = l + sum(math.exp(v - m) for v in part)
        out.append((m, l))
    return out


def standard_traffic_p_fused(T, d):
    """Standard attention counted with P never stored: S written and read once (2T^2, not 4T^2)."""
    counts = ref.standard_attention_traffic(T, d)
    return {k: v for k, v in counts.items() if not k.endswith(" P")}


def flash_traffic_kv_once(T, d, block):
    """FlashAttention counted with K and V read once in all, not once per query block."""
    return {"read Q": T * d, "read K": T * d, "read V": T * d, "write O": T * d}


def flash_scores_block_squared(T, block, bytes_per_value):
    """FlashAttention's scores counted as one block x block tile (not T x block)."""
    return block * block * bytes_per_value


def scores_in_fp32(T, bytes_per_value):
    """The fp16 score matrix counted at 4 bytes per value."""
    return T * T * 4


# ---------------------------------------------------------------------------------- the tests
@pytest.mark.claim("FA-1")
def test_fa1_rejects_softmax_without_max_subtraction():
    rejects("FA-1", check_fa1, (ref.softmax_textbook, ref.softmax, torch.float32),
            (ref.softmax_textbook, ref.softmax_textbook, torch.float32), match="FA-1: max-subtracted softmax .* not finite")


@pytest.mark.claim("FA-1")
def test_fa1_rejects_unnormalised_softmax():
    rejects("FA-1", check_fa1, (ref.softmax_textbook, ref.softmax, torch.float64),
            (ref.softmax_textbook, softmax_unnormalised, torch.float64), match="FA-1: max-subtracted softmax rounded")


@pytest.mark.claim("FA-2")
def test_fa2_rejects_sum_not_rescaled():
    rejects("FA-2", check_fa2_exercise3, (ref.online_softmax_trace, ref.softmax_stats),
            (trace_without_rescale, ref.softmax_stats), match="FA-2: l after chunk 2")


@pytest.mark.claim("FA-2")
def test_fa2_rejects_stale_running_max():
    rejects("FA-2", check_fa2_exercise3, (ref.online_softmax_trace, ref.softmax_stats),
            (trace_stale_max, ref.softmax_stats), match="FA-2: m after chunk 2")


@pytest.mark.claim("FA-4")
def test_fa4_rejects_kv_read_once():
    good = (ref.standard_attention_traffic, ref.flash_attention_traffic, ref.score_matrix_bytes, ref.flash_score_bytes)
    rejects("FA-4", check_fa4, good, (ref.standard_attention_traffic, flash_traffic_kv_once) + good[2:],
            match="FA-4: FlashAttention traffic at T=1024")


@pytest.mark.claim("FA-4")
def test_fa4_rejects_standard_attention_without_p():
    good = (ref.standard_attention_traffic, ref.flash_attention_traffic, ref.score_matrix_bytes, ref.flash_score_bytes)
    rejects("FA-4", check_fa4, good, (standard_traffic_p_fused,) + good[1:], match="FA-4: standard traffic at T=1024")


@pytest.mark.claim("FA-5")
def test_fa5_rejects_scores_block_squared():
    rejects("FA-5", check_fa5, (ref.score_matrix_bytes, ref.flash_score_bytes),
            (ref.score_matrix_bytes, flash_scores_block_squared), match="FA-5: FlashAttention scores per head")


@pytest.mark.claim("FA-5")
def test_fa5_rejects_scores_in_fp32():
    rejects("FA-5", check_fa5, (ref.score_matrix_bytes, ref.flash_score_bytes),
            (scores_in_fp32, ref.flash_score_bytes), match="FA-5: S per head")


@pytest.mark.claim("FA-6")
def test_fa6_rejects_memory_quadratic_in_T():
    """Synthetic peak extra memory (B = 1, H = 8, bf16 at lengths 1K..8K): an output-sized
    workspace (linear) passes; a stored score matrix (T^2) fails the same bound."""
    lengths = (1024, 2048, 4096, 8192)
    linear = {T: 8 * T * 64 * 2 for T in lengths}
    quadratic = {T: 8 * T * T * 2 for T in lengths}
    rejects("FA-6", check_fa6, (linear,), (quadratic,), match="FA-6: peak extra memory grew 64.0x")
