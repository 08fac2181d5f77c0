"""The analytic performance model of the lectures: arithmetic intensity, the roofline, and the
CS336 transformer performance model (memory, latency, throughput against batch size).

Everything here is arithmetic on shapes; nothing runs a model. Units: FLOPs (one multiply or
one add is one FLOP), bytes, seconds, FLOP/s, bytes/s. Sizes follow CS336's letters:

    B batch (concurrent sequences)   T tokens processed per sequence in this step
    S tokens already in the context  D model dimension        F MLP hidden dimension
    N query heads   K key/value heads   H head dimension   L layers   V vocabulary

Sources:
  CS336 lecture 10 ("Inference") part 1: matmul intensity 2BDF/(2BD+2DF+2BF) -> B (AI-1), gated
    MLP 6BTDF/(4BTD+4BTF+6DF) -> BT (AI-2), attention ST/(S+T) (AI-3), accelerator intensity
    (AI-4), the Llama 2 13B on H100 worked example (AI-5) and its GQA variant (AI-6).
  Lecture 001 §1.2 and exercise 1 (AI-7: 7B fp16 decode on an A100), §2.3 and exercise 2 (KV-4,
    KV-5: KV bytes per token and concurrent requests per KV budget).
  The roofline: Williams, Waterman, Patterson, "Roofline" (CACM 2009):
    attainable FLOP/s = min(peak FLOP/s, intensity x bandwidth).

The CS336 latency model is memory-bound by construction: a decode step reads all parameters and
the whole KV cache once, latency = bytes / bandwidth (:func:`latency_s`). :func:`roofline_latency_s`
adds the compute side, max(bytes / bandwidth, FLOPs / peak), which the lecture's own exercise 1
uses to find where compute takes over (:func:`decode_bound`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Iterable, Sequence

import torch

BF16_BYTES = 2  # bytes per value in bf16 / fp16 (the lectures' inference dtype)


# --------------------------------------------------------------------------------------------
# Validation helpers


def _positive(name: str, value, *, integer: bool = False, allow_zero: bool = False) -> None:
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
        _positive(n, v, integer=True)
    return matmul_flops(B, D, F) / matmul_bytes(B, D, F, bytes_per_value)


def matmul_intensity_limit(B: int, bytes_per_value: int = BF16_BYTES) -> float:
    """lim_{D,F->inf} matmul_intensity(B, D, F) = 2B / bytes_per_value (= B in bf16; AI-1)."""
    _positive("B", B, integer=True)
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
        _positive(n, v, integer=True)
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
        _positive(n, v, integer=True)
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
    _positive("peak_flops", peak_flops)
    _positive("bandwidth", bandwidth)
    return peak_flops / bandwidth


def attainable(ai: float, peak_flops: float, bandwidth: float) -> float:
    """The roofline: attainable FLOP/s = min(peak_flops, ai * bandwidth) for intensity ``ai``
    (FLOP/byte, >= 0). Raises ValueError for a negative or non-finite argument."""
    _positive("ai", ai, allow_zero=True)
    _positive("peak_flops", peak_flops)
    _positive("bandwidth", bandwidth)
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
    _positive("d_ff", d_ff, integer=True)
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


# --------------------------------------------------------------------------------------------
# The CS336 transformer performance model (AI-5, AI-6) and the KV cache (KV-4, KV-5, KV-6)


@dataclass(frozen=True)
class ModelShape:
    """The shape of a decoder-only transformer, in CS336's letters.

    S: context length (tokens in each sequence's KV cache); D: model dim; F: MLP hidden dim;
    N: query heads; K: KV heads (K = N: MHA; K = 1: MQA); H: head dim; L: layers; V: vocabulary;
    bytes_per_value: parameter bytes (2 for bf16/fp16); kv_bytes_per_value: KV-cache bytes per
    value (None: same as the parameters; 1 for an 8-bit cache).
    """

    S: int
    D: int
    F: int
    N: int
    K: int
    H: int
    L: int
    V: int
    bytes_per_value: int = BF16_BYTES
    kv_bytes_per_value: int | None = None
    name: str = field(default="", compare=False)

    def __post_init__(self):
        for n in ("S", "D", "F", "N", "K", "H", "L", "V", "bytes_per_value"):
            _positive(n, getattr(self, n), integer=True)
        if self.kv_bytes_per_value is not None:
            _positive("kv_bytes_per_value", self.kv_bytes_per_value, integer=True)
        if self.N % self.K:
            raise ValueError(f"K ({self.K}) must divide N ({self.N})")

    @property
    def kv_bpv(self) -> int:
        return self.bytes_per_value if self.kv_bytes_per_value is None else self.kv_bytes_per_value

    def with_(self, **changes) -> "ModelShape":
        """A copy with some fields changed (``LLAMA2_13B.with_(K=8)``)."""
        return replace(self, **changes)


#: CS336's ``llama2_13b_config`` (part 1): S=1024, D=5120, F=13824, N=K=40, H=128, L=40, V=32000.
LLAMA2_13B = ModelShape(S=1024, D=5120, F=13824, N=40, K=40, H=128, L=40, V=32000, name="Llama-2-13B")
#: Llama-2-7B (32 layers, 32 heads of 128, MHA), 4K context (001 exercise 2).
LLAMA2_7B = ModelShape(S=4096, D=4096, F=11008, N=32, K=32, H=128, L=32, V=32000, name="Llama-2-7B")
#: Llama-3-8B (32 layers, 32 query heads, 8 KV heads of 128), 4K context (001 exercise 2).
LLAMA3_8B = ModelShape(S=4096, D=4096, F=14336, N=32, K=8, H=128, L=32, V=128256, name="Llama-3-8B")


def num_params(m: ModelShape) -> int:
    """CS336's parameter count: 2VD (embedding and output head) + 3DFL (gated MLP) +
    (2DNH + 2DKH)L (Q and output projections, K and V projections). Norm weights are left out."""
    return 2 * m.V * m.D + 3 * m.D * m.F * m.L + (2 * m.D * m.N * m.H + 2 * m.D * m.K * m.H) * m.L


def parameter_bytes(m: ModelShape) -> int:
    """num_params x bytes_per_value (Llama 2 13B in bf16: about 26 GB)."""
    return num_params(m) * m.bytes_per_value


def kv_bytes_per_token(m: ModelShape) -> int:
    """2 (K and V) x L x K x H x bytes per value (KV-4; Llama-2-7B fp16: 512 KiB)."""
    return 2 * m.L * m.K * m.H * m.kv_bpv


def kv_bytes_per_sequence(m: ModelShape, context: int | None = None) -> int:
    """KV cache of one sequence of ``context`` tokens (default S): CS336's S*(K*H)*L*2*2 in bf16."""
    context = m.S if context is None else context
    _positive("context", context, integer=True)
    return context * kv_bytes_per_token(m)


def kv_cache_ratio(N: int, K: int) -> float:
    """How many times less KV cache GQA with K groups stores than MHA with N heads: N/K (KV-6)."""
    _positive("N", N, integer=True)
    _positive("K", K, integer=True)
    if N % K:
        raise ValueError(f"K ({K}) must divide N ({N})")
    return N / K


def memory_bytes(m: ModelShape, B: int) -> int:
    """Total memory for a batch of B sequences: B x KV bytes per sequence + parameter bytes
    (CS336: ``memory = B * kv_cache_size + parameter_size``)."""
    _positive("B", B, integer=True)
    return B * kv_bytes_per_sequence(m) + parameter_bytes(m)


def latency_s(m: ModelShape, B: int, bandwidth: float) -> float:
    """Seconds per decode step (= per token of each sequence), CS336's memory-bound model:
    every step reads all parameters and the whole KV cache once, latency = memory / bandwidth."""
    _positive("bandwidth", bandwidth)
    return memory_bytes(m, B) / bandwidth


def throughput(m: ModelShape, B: int, bandwidth: float) -> float:
    """Tokens per second over the batch: B / latency (CS336). Rises with B towards
    bandwidth / KV bytes per sequence, with diminishing returns."""
    return B / latency_s(m, B, bandwidth)


def throughput_limit(m: ModelShape, bandwidth: float) -> float:
    """lim_{B->inf} throughput = bandwidth / KV bytes per sequence (the asymptote CS336 draws)."""
    _positive("bandwidth", bandwidth)
    return bandwidth / kv_bytes_per_sequence(m)


def fits(m: ModelShape, B: int, capacity_bytes: float) -> bool:
    """Whether parameters and the KV cache of B sequences fit in ``capacity_bytes``."""
    _positive("capacity_bytes", capacity_bytes)
    return memory_bytes(m, B) <= capacity_bytes


def max_batch(m: ModelShape, capacity_bytes: float) -> int:
    """The largest B that fits (0 when the parameters alone do not)."""
    _positive("capacity_bytes", capacity_bytes)
    free = capacity_bytes - parameter_bytes(m)
    return max(0, int(free // kv_bytes_per_sequence(m)))


def decode_flops(m: ModelShape, B: int, include_attention: bool = False) -> int:
    """FLOPs of one decode step for B sequences: 2 x params x B (001 §1.2), plus, with
    ``include_attention``, attention over the S cached tokens: 4 x B x S x (N*H) x L."""
    _positive("B", B, integer=True)
    flops = 2 * num_params(m) * B
    if include_attention:
        flops += attention_flops(B, m.S, 1, m.N * m.H) * m.L
    return flops


def roofline_latency_s(m: ModelShape, B: int, acc: Accelerator, include_attention: bool = True) -> float:
    """max(memory / bandwidth, decode FLOPs / peak): the roofline version of :func:`latency_s`
    (not the lecture's formula). For Llama 2 13B on an H100 at S = 1024 the memory term wins at
    every B: each sequence adds 250 us of KV reading but only 27 us of compute; with contexts
    shorter than about 110 tokens, compute wins at large B."""
    return max(latency_s(m, B, acc.bandwidth), decode_flops(m, B, include_attention) / acc.peak_flops)


@dataclass(frozen=True)
class PerfPoint:
    """The CS336 statistics of one batch size (units: bytes, seconds, tokens/s)."""

    B: int
    memory_bytes: int
    latency_s: float
    throughput: float
    fits: bool
    compute_s: float

    @property
    def bound(self) -> str:
        """"memory" when reading the bytes takes longer than computing the FLOPs, else "compute"."""
        return "memory" if self.latency_s >= self.compute_s else "compute"


def performance(m: ModelShape, batch_sizes: Iterable[int], acc: Accelerator) -> list[PerfPoint]:
    """CS336's table: memory, latency, throughput and fits-in-memory for each B on ``acc``."""
    return [PerfPoint(B, memory_bytes(m, B), latency_s(m, B, acc.bandwidth),
                      throughput(m, B, acc.bandwidth), fits(m, B, acc.memory_bytes),
                      decode_flops(m, B, include_attention=True) / acc.peak_flops)
            for B in batch_sizes]


# --------------------------------------------------------------------------------------------
# Lecture 001, exercise 1 (AI-7) and exercise 2 (KV-5)


@dataclass(frozen=True)
class DecodeBound:
    """Decode of a model of ``n_params`` parameters on one accelerator, weights only (no KV):
    weight_read_s (bytes / bandwidth), compute_s (2 n_params B / peak), tokens_per_s at that B,
    and compute_bound_batch, the B from which compute takes longer than reading the weights."""

    weight_read_s: float
    compute_s: float
    tokens_per_s: float
    compute_bound_batch: float

    @property
    def memory_over_compute(self) -> float:
        return self.weight_read_s / self.compute_s


def decode_bound(n_params: float, acc: Accelerator, B: int = 1,
                 bytes_per_value: int = BF16_BYTES) -> DecodeBound:
    """Exercise 1 of lecture 001 (AI-7): reading n_params x bpv bytes takes ``weight_read_s``;
    2 n_params B FLOPs take ``compute_s``; a step takes the larger, giving B / step tokens/s.
    Intensity 2 n_params B / (bpv n_params) = 2B/bpv meets the ridge at B = ridge x bpv / 2."""
    _positive("n_params", n_params)
    _positive("B", B, integer=True)
    read = n_params * bytes_per_value / acc.bandwidth
    compute = 2 * n_params * B / acc.peak_flops
    return DecodeBound(read, compute, B / max(read, compute), acc.intensity * bytes_per_value / 2)


def concurrent_requests(budget_bytes: float, m: ModelShape, context: int | None = None) -> int:
    """How many requests of ``context`` tokens (default S) a KV budget holds:
    floor(budget / KV bytes per sequence) (KV-5)."""
    _positive("budget_bytes", budget_bytes)
    return int(budget_bytes // kv_bytes_per_sequence(m, context))
