"""The roofline of the lectures: arithmetic intensity of a transformer's kernels, accelerators'
ridge points, the roofline itself, and FLOPs and bytes counted from real tensor shapes.

Everything here is arithmetic on shapes; nothing runs a model. Units: FLOPs (one multiply or one
add is one FLOP), bytes, FLOP/s, bytes/s. The intensity formulas keep CS336's letters, so that
each line reads as the lecture's formula (B batch, T tokens per sequence in this step, S tokens
already in the context, D model dimension, F MLP hidden dimension); the suite's glossary
(``conformance/contracts/glossary.py``) names these d_model and d_ff elsewhere.

Sources:
  CS336 lecture 10 ("Inference") part 1: matmul intensity 2BDF/(2BD+2DF+2BF) -> B (AI-1), gated
    MLP 6BTDF/(4BTD+4BTF+6DF) -> BT (AI-2), attention ST/(S+T) (AI-3), accelerator intensity (AI-4).
  The roofline: Williams, Waterman, Patterson, "Roofline" (CACM 2009):
    attainable FLOP/s = min(peak FLOP/s, intensity x bandwidth).

The model-level performance model (memory, latency and throughput of a whole transformer against
batch size) is :mod:`inference_conformance.reference.roofline.perf_model`; the device's measured ceilings are
:mod:`inference_conformance.perf.ceilings`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

BF16_BYTES = 2  # bytes per value in bf16 / fp16 (the lectures' inference dtype)


# --------------------------------------------------------------------------------------------
# Validation helpers


def require_positive(name: str, value, *, integer: bool = False, allow_zero: bool = False) -> None:
    """Raise TypeError unless ``value`` is a number (an int with ``integer``), ValueError unless it
    is finite and > 0 (>= 0 with ``allow_zero``); the message names ``name``."""
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type:
        kind = "an int" if integer else "a number"
        raise TypeError(f"{name} must be {kind}, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        rel = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {rel}, got {value!r}")


# --------------------------------------------------------------------------------------------
# Arithmetic intensity of the three kernels of a transformer (CS336 part 1)


def matmul_flops(B: int, D: int, F: int) -> int:
    """FLOPs of X(B x D) @ W(D x F): 2BDF (one multiply and one add per term)."""
    return 2 * B * D * F


def matmul_bytes(B: int, D: int, F: int, bytes_per_value: int = BF16_BYTES) -> int:
    """HBM bytes of X(B x D) @ W(D x F): read X and W, write Y(B x F): bpv*(BD + DF + BF)."""
    return bytes_per_value * (B * D + D * F + B * F)


def matmul_intensity(B: int, D: int, F: int, bytes_per_value: int = BF16_BYTES) -> float:
    """Arithmetic intensity (FLOP/byte) of X(B x D) @ W(D x F).

    In bf16 this is CS336's 2BDF / (2BD + 2DF + 2BF) = B / (1 + B/F + B/D) (claim AI-1), which
    tends to B when D, F -> infinity with B fixed (:func:`matmul_intensity_limit`).
    Raises TypeError/ValueError for non-positive or non-integer sizes.
    """
    for n, v in (("B", B), ("D", D), ("F", F), ("bytes_per_value", bytes_per_value)):
        require_positive(n, v, integer=True)
    return matmul_flops(B, D, F) / matmul_bytes(B, D, F, bytes_per_value)


def matmul_intensity_limit(B: int, bytes_per_value: int = BF16_BYTES) -> float:
    """lim_{D,F->inf} matmul_intensity(B, D, F) = 2B / bytes_per_value (= B in bf16; AI-1)."""
    require_positive("B", B, integer=True)
    return 2 * B / bytes_per_value


def gated_mlp_flops(B: int, T: int, D: int, F: int) -> int:
    """FLOPs of a gated MLP Y = (silu(X W_gate) * (X W_up)) W_down over B x T tokens: 6BTDF
    (three matmuls of 2BTDF; the elementwise work is ignored, as in CS336)."""
    return 6 * B * T * D * F


def gated_mlp_bytes(B: int, T: int, D: int, F: int, bytes_per_value: int = BF16_BYTES) -> int:
    """HBM bytes of the gated MLP in CS336's accounting: read X (BTD) and the three weights
    (3DF), write U and G (BTF each) and Y (BTD): bpv*(2BTD + 2BTF + 3DF)."""
    return bytes_per_value * (2 * B * T * D + 2 * B * T * F + 3 * D * F)


def gated_mlp_intensity(B: int, T: int, D: int, F: int, bytes_per_value: int = BF16_BYTES) -> float:
    """6BTDF / (4BTD + 4BTF + 6DF) in bf16 (claim AI-2); tends to BT when D, F -> infinity."""
    for n, v in (("B", B), ("T", T), ("D", D), ("F", F), ("bytes_per_value", bytes_per_value)):
        require_positive(n, v, integer=True)
    return gated_mlp_flops(B, T, D, F) / gated_mlp_bytes(B, T, D, F, bytes_per_value)


def attention_flops(B: int, S: int, T: int, D: int) -> int:
    """FLOPs of attention of T new queries over S keys: Q K^T and softmax(.) V, 2BSTD each:
    4BSTD (softmax ignored, as in CS336; D = N*H, summed over heads)."""
    return 4 * B * S * T * D


def attention_bytes(B: int, S: int, T: int, D: int, bytes_per_value: int = BF16_BYTES) -> int:
    """HBM bytes of attention in CS336's accounting: read Q (BTD), K and V (BSD each), write
    Y (BTD): bpv*(2BTD + 2BSD)."""
    return bytes_per_value * (2 * B * T * D + 2 * B * S * D)


def attention_intensity(S: int, T: int, B: int = 1, D: int = 1,
                        bytes_per_value: int = BF16_BYTES) -> float:
    """4BSTD / (4BTD + 4BSD) = ST/(S+T) in bf16 (claim AI-3): independent of B and D.

    Prefill (T = S): S/2. Generation (T = 1): S/(S+1) < 1 for every S.
    """
    for n, v in (("S", S), ("T", T), ("B", B), ("D", D), ("bytes_per_value", bytes_per_value)):
        require_positive(n, v, integer=True)
    return attention_flops(B, S, T, D) / attention_bytes(B, S, T, D, bytes_per_value)


# --------------------------------------------------------------------------------------------
# Accelerators and the roofline (AI-4)


@dataclass(frozen=True)
class Accelerator:
    """Spec-sheet figures of one accelerator.

    peak_flops: dense bf16 tensor-core FLOP/s; bandwidth: HBM bytes/s; memory_bytes: HBM capacity.
    """

    name: str
    peak_flops: float
    bandwidth: float
    memory_bytes: float

    @property
    def intensity(self) -> float:
        """Accelerator intensity (ridge point), FLOP/byte = peak FLOP/s / bandwidth (AI-4)."""
        return accelerator_intensity(self.peak_flops, self.bandwidth)


#: Spec sheets (dense bf16, no sparsity). H100 and A100 figures are the lectures' (CS336 part 1,
#: 001 §1.2); H200 is NVIDIA's (same compute as H100, HBM3e at 4.8 TB/s, 141 GB).
ACCELERATORS: dict[str, Accelerator] = {
    "H100": Accelerator("H100 SXM", 989e12, 3.35e12, 80e9),
    "A100": Accelerator("A100 80GB", 312e12, 2.0e12, 80e9),
    "H200": Accelerator("H200 SXM", 989e12, 4.8e12, 141e9),
}


def accelerator_intensity(peak_flops: float, bandwidth: float) -> float:
    """FLOP/s divided by bytes/s (AI-4): above it a kernel is compute-bound, below memory-bound."""
    require_positive("peak_flops", peak_flops)
    require_positive("bandwidth", bandwidth)
    return peak_flops / bandwidth


def attainable(ai: float, peak_flops: float, bandwidth: float) -> float:
    """The roofline: attainable FLOP/s = min(peak_flops, ai * bandwidth) for intensity ``ai``
    (FLOP/byte, >= 0). Raises ValueError for a negative or non-finite argument."""
    require_positive("ai", ai, allow_zero=True)
    require_positive("peak_flops", peak_flops)
    require_positive("bandwidth", bandwidth)
    return min(peak_flops, ai * bandwidth)


# --------------------------------------------------------------------------------------------
# Counting FLOPs and bytes from actual tensor shapes


@dataclass(frozen=True)
class Traffic:
    """FLOPs and HBM bytes of a kernel (each operand read once, each result written once)."""

    flops: int
    bytes_read: int
    bytes_written: int

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def intensity(self) -> float:
        """FLOP per byte moved."""
        return self.flops / self.bytes if self.bytes else math.inf

    def __add__(self, other: "Traffic") -> "Traffic":
        return Traffic(self.flops + other.flops, self.bytes_read + other.bytes_read,
                       self.bytes_written + other.bytes_written)


def itemsize(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype`` (2 for bf16/fp16, 4 for fp32, ...)."""
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
    return torch.empty((), dtype=dtype).element_size()


def _shape(name: str, shape: Sequence[int], min_dims: int) -> tuple[int, ...]:
    shape = tuple(shape)
    if len(shape) < min_dims or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1
                                        for s in shape):
        raise ValueError(f"{name} must be a shape of >= {min_dims} positive ints, got {shape}")
    return shape


def count_matmul(x_shape: Sequence[int], w_shape: Sequence[int], dtype: torch.dtype) -> Traffic:
    """FLOPs and bytes of ``x @ w`` with x (*batch, M, K) or (K,) and w (K, N), all in ``dtype``.

    FLOPs 2*prod(batch)*M*K*N; bytes read numel(x) + numel(w), written numel(out), times the
    item size. Raises ValueError when the shapes do not chain (x's last dim != w's first).
    """
    x_shape, w_shape = _shape("x_shape", x_shape, 1), _shape("w_shape", w_shape, 2)
    if len(w_shape) != 2:
        raise ValueError(f"w_shape must be 2-D (K, N), got {w_shape}")
    if x_shape[-1] != w_shape[0]:
        raise ValueError(f"x_shape {x_shape} and w_shape {w_shape} do not chain: "
                         f"x's last dim {x_shape[-1]} != w's first dim {w_shape[0]}")
    rows = math.prod(x_shape[:-1])
    k, n = w_shape
    size = itemsize(dtype)
    return Traffic(2 * rows * k * n, size * (rows * k + k * n), size * rows * n)


def count_gated_mlp(x_shape: Sequence[int], d_ff: int, dtype: torch.dtype) -> Traffic:
    """FLOPs and bytes of the gated MLP on x (*batch, D) with hidden size ``d_ff``, CS336's
    accounting: up, gate and down matmuls; X is read once, U and G written, the elementwise
    silu(G)*U and re-reading it for the down projection are left out (fused)."""
    x_shape = _shape("x_shape", x_shape, 1)
    require_positive("d_ff", d_ff, integer=True)
    d = x_shape[-1]
    up = count_matmul(x_shape, (d, d_ff), dtype)
    down = count_matmul(x_shape[:-1] + (d_ff,), (d_ff, d), dtype)
    x_bytes = itemsize(dtype) * math.prod(x_shape)
    h_bytes = itemsize(dtype) * math.prod(x_shape[:-1]) * d_ff
    # up + gate read X once between them; down's input H is not re-read (fused elementwise).
    return Traffic(2 * up.flops + down.flops,
                   2 * up.bytes_read - x_bytes + down.bytes_read - h_bytes,
                   2 * up.bytes_written + down.bytes_written)


def count_attention(q_shape: Sequence[int], kv_shape: Sequence[int], dtype: torch.dtype) -> Traffic:
    """FLOPs and bytes of attention with q (*batch, T, D) over k, v (*batch, S, D).

    FLOPs 4*batch*S*T*D (Q K^T and P V); read Q, K, V; write Y (*batch, T, D). The scores never
    reach memory (CS336's accounting, which is FlashAttention's). Raises ValueError for
    mismatched batch or feature dims.
    """
    q_shape, kv_shape = _shape("q_shape", q_shape, 2), _shape("kv_shape", kv_shape, 2)
    if q_shape[:-2] != kv_shape[:-2] or q_shape[-1] != kv_shape[-1]:
        raise ValueError(f"q_shape {q_shape} and kv_shape {kv_shape} must share batch dims and "
                         "the last (feature) dim")
    batch, t, d = math.prod(q_shape[:-2]), q_shape[-2], q_shape[-1]
    s = kv_shape[-2]
    size = itemsize(dtype)
    return Traffic(4 * batch * s * t * d, size * batch * (t * d + 2 * s * d), size * batch * t * d)
