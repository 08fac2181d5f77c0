"""The analytic claims' checks (properties/roofline/cases.py) reject known-bad formulas: each
test feeds the claim's own check the suite's formula (it must pass) and a formula with one
classic mistake (it must fail, by the figure the mistake moves).

Claims: AI-1..AI-7, KV-5, KV-6 (its cache ratio).
"""
from __future__ import annotations

import pytest

from inference_conformance.properties.falsify import rejects
from inference_conformance.properties.roofline.cases import (check_ai1, check_ai2, check_ai3, check_ai4, check_ai5, check_ai6, check_ai7,
                                       check_kv5, check_kv6_ratio)
from inference_conformance.reference.roofline import perf_model
from inference_conformance.reference import roofline as rl


# ------------------------------------------------------------------------ known-bad formulas
def matmul_flops_once(B, D, F):
    """X @ W with one FLOP per multiply-add (BDF, not 2BDF)."""
    return B * D * F / rl.matmul_bytes(B, D, F)


def matmul_fp32_bytes(B, D, F):
    """The bf16 matmul's bytes counted at 4 bytes per value."""
    return rl.matmul_intensity(B, D, F, bytes_per_value=4)


def gated_mlp_gate_forgotten(B, T, D, F):
    """The gated MLP's FLOPs counted for two matmuls (4BTDF), the gate left out."""
    return 4 * B * T * D * F / rl.gated_mlp_bytes(B, T, D, F)


def attention_scores_written(S, T, B=1, D=1):
    """Attention's bytes with the (T, S) score matrix written to HBM (standard attention's
    accounting in a claim about FlashAttention's)."""
    return rl.attention_flops(B, S, T, D) / (rl.attention_bytes(B, S, T, D) + 2 * B * S * T)


def attention_kv_shared_by_batch(S, T, B=1, D=1):
    """Attention's bytes with K and V read once for the whole batch, as if shared."""
    return rl.attention_flops(B, S, T, D) / (2 * (2 * B * T * D + 2 * S * D))


def accelerator_bits(peak_flops, bandwidth):
    """FLOP/s over bits/s: bandwidth counted in bits."""
    return peak_flops / (8 * bandwidth)


class KVWithoutFactorTwo(perf_model.PerfModel):
    """The KV cache counted for K only: L x KV heads x head dim x bytes (no factor 2 for V)."""

    def kv_bytes_per_token(self, m):
        return m.L * m.K * m.H * m.kv_bpv


class ParametersInFP32(perf_model.PerfModel):
    """The bf16 model's parameters counted at 4 bytes each."""

    def parameter_bytes(self, m):
        return self.num_params(m) * 4


class GQAWithHq(perf_model.PerfModel):
    """GQA's cache computed with the query heads (Hq = N) in place of the KV heads (Hkv = K)."""

    def kv_bytes_per_token(self, m):
        return 2 * m.L * m.N * m.H * m.kv_bpv

    def kv_cache_ratio(self, N, K):
        return 1.0


class DecodeFLOPsOnce(perf_model.PerfModel):
    """Exercise 1's compute time with n_params FLOPs per token (not 2 n_params)."""

    def decode_bound(self, n_params, acc, B=1, bytes_per_value=rl.BF16_BYTES):
        read = n_params * bytes_per_value / acc.bandwidth
        compute = n_params * B / acc.peak_flops
        return perf_model.DecodeBound(read, compute, B / max(read, compute), acc.intensity * bytes_per_value)


class KVBytesIgnored(perf_model.PerfModel):
    """An 8-bit KV cache still counted at the parameters' 2 bytes per value."""

    def kv_bytes_per_token(self, m):
        return 2 * m.L * m.K * m.H * m.bytes_per_value


# ---------------------------------------------------------------------------------- the tests
@pytest.mark.claim("AI-1")
def test_ai1_rejects_flops_counted_once():
    rejects("AI-1", check_ai1, (rl.matmul_intensity,), (matmul_flops_once,), match="AI-1: B=1 matvec intensity")


@pytest.mark.claim("AI-1")
def test_ai1_rejects_fp32_bytes_for_bf16():
    rejects("AI-1", check_ai1, (rl.matmul_intensity,), (matmul_fp32_bytes,), match="AI-1: B=1 matvec intensity")


@pytest.mark.claim("AI-2")
def test_ai2_rejects_the_gate_forgotten():
    rejects("AI-2", check_ai2, (rl.gated_mlp_intensity, 4, 8, 64, 64), (gated_mlp_gate_forgotten, 4, 8, 64, 64),
            match=r"AI-2: gated MLP intensity vs 6BTDF")


@pytest.mark.claim("AI-3")
def test_ai3_rejects_scores_written_to_memory():
    rejects("AI-3", check_ai3, (rl.attention_intensity, 1024, 8, 128), (attention_scores_written, 1024, 8, 128),
            match=r"AI-3: (generation|prefill) intensity")


@pytest.mark.claim("AI-3")
def test_ai3_rejects_kv_read_once_per_batch():
    rejects("AI-3", check_ai3, (rl.attention_intensity, 1024, 8, 128), (attention_kv_shared_by_batch, 1024, 8, 128),
            match=r"AI-3: generation intensity \S+ >= 1")  # at B = 8 it passes 1: the bytes did not grow with B


@pytest.mark.claim("AI-4")
def test_ai4_rejects_bandwidth_in_bits():
    rejects("AI-4", check_ai4, (rl.accelerator_intensity,), (accelerator_bits,), match="AI-4: H100")


@pytest.mark.claim("AI-5")
def test_ai5_rejects_kv_cache_without_factor_two():
    rejects("AI-5", check_ai5, (perf_model.CS336,), (KVWithoutFactorTwo(),), match="AI-5: KV cache bytes per sequence")


@pytest.mark.claim("AI-5")
def test_ai5_rejects_parameters_in_fp32():
    rejects("AI-5", check_ai5, (perf_model.CS336,), (ParametersInFP32(),), match="AI-5: B=1 latency")


@pytest.mark.claim("AI-6")
def test_ai6_rejects_gqa_with_query_heads():
    rejects("AI-6", check_ai6, (perf_model.CS336,), (GQAWithHq(),), match="AI-6: KV cache MHA / GQA")


@pytest.mark.claim("AI-7")
def test_ai7_rejects_decode_flops_counted_once():
    rejects("AI-7", check_ai7, (perf_model.CS336,), (DecodeFLOPsOnce(),), match="AI-7: 2 x 7e9 / 312 TFLOP/s")


@pytest.mark.claim("KV-5")
def test_kv5_rejects_kv_cache_without_factor_two():
    rejects("KV-5", check_kv5, (perf_model.CS336,), (KVWithoutFactorTwo(),), match="KV-5: Llama-2-7B: requests")


@pytest.mark.claim("KV-5")
def test_kv5_rejects_8bit_cache_counted_at_16_bits():
    rejects("KV-5", check_kv5, (perf_model.CS336,), (KVBytesIgnored(),), match="KV-5: Llama-3-8B 8-bit KV: requests")


@pytest.mark.claim("KV-6")
def test_kv6_rejects_gqa_cache_with_query_heads():
    rejects("KV-6", check_kv6_ratio, (perf_model.CS336, 8, 4, 32, 128, 2), (GQAWithHq(), 8, 4, 32, 128, 2),
            match="KV-6: MHA / GQA cache")
