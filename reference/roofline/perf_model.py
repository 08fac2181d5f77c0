"""The CS336 transformer performance model: parameters, KV-cache bytes, memory, latency and
throughput of a decode step against batch size, whether a batch fits, and lecture 001's
exercises 1 (AI-7: 7B fp16 decode on an A100) and 2 (KV-5: concurrent requests per KV budget).

Arithmetic on shapes; nothing runs a model. Units: bytes, seconds, FLOPs, tokens/s. Sizes keep
CS336's letters so that each formula reads as the lecture's (the suite's glossary,
``conformance/contracts/glossary.py``, names them d_model, d_ff, Hq, Hkv and D elsewhere):

    B batch (concurrent sequences)   S tokens in each sequence's KV cache
    D model dimension   F MLP hidden dimension   N query heads   K key/value heads
    H head dimension    L layers     V vocabulary

Sources: CS336 lecture 10 ("Inference") part 1: the Llama 2 13B on H100 worked example (AI-5) and
its GQA variant (AI-6); lecture 001 §1.2 and exercise 1 (AI-7), §2.3 and exercise 2 (KV-4, KV-5).

The CS336 latency model is memory-bound by construction: a decode step reads all parameters and
the whole KV cache once, latency = bytes / bandwidth (:func:`latency_s`). :func:`roofline_latency_s`
adds the compute side, max(bytes / bandwidth, FLOPs / peak), which the lecture's own exercise 1
uses to find where compute takes over (:func:`decode_bound`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable

from inference_conformance.reference.roofline import BF16_BYTES, Accelerator, attention_flops, require_positive

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
            require_positive(n, getattr(self, n), integer=True)
        if self.kv_bytes_per_value is not None:
            require_positive("kv_bytes_per_value", self.kv_bytes_per_value, integer=True)
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


class PerfModel:
    """CS336's performance model as one set of formulas. Each formula calls the others through
    ``self``, so a variant that overrides one (a KV cache without the factor 2, parameters counted
    in the wrong bytes) changes every figure built on it: the claims' checks take a model
    (``properties/roofline/cases.py``) and reject such variants. :data:`CS336` is the model; the
    module-level functions below are its methods."""

    def num_params(self, m: ModelShape) -> int:
        """CS336's parameter count: 2VD (embedding and output head) + 3DFL (gated MLP) +
        (2DNH + 2DKH)L (Q and output projections, K and V projections). Norm weights are left out."""
        return 2 * m.V * m.D + 3 * m.D * m.F * m.L + (2 * m.D * m.N * m.H + 2 * m.D * m.K * m.H) * m.L

    def parameter_bytes(self, m: ModelShape) -> int:
        """num_params x bytes_per_value (Llama 2 13B in bf16: about 26 GB)."""
        return self.num_params(m) * m.bytes_per_value

    def kv_bytes_per_token(self, m: ModelShape) -> int:
        """2 (K and V) x L x K x H x bytes per value (KV-4; Llama-2-7B fp16: 512 KiB)."""
        return 2 * m.L * m.K * m.H * m.kv_bpv

    def kv_bytes_per_sequence(self, m: ModelShape, context: int | None = None) -> int:
        """KV cache of one sequence of ``context`` tokens (default S): CS336's S*(K*H)*L*2*2 in bf16."""
        context = m.S if context is None else context
        require_positive("context", context, integer=True)
        return context * self.kv_bytes_per_token(m)

    def kv_cache_ratio(self, N: int, K: int) -> float:
        """How many times less KV cache GQA with K groups stores than MHA with N heads: N/K (KV-6)."""
        require_positive("N", N, integer=True)
        require_positive("K", K, integer=True)
        if N % K:
            raise ValueError(f"K ({K}) must divide N ({N})")
        return N / K

    def memory_bytes(self, m: ModelShape, B: int) -> int:
        """Total memory for a batch of B sequences: B x KV bytes per sequence + parameter bytes
        (CS336: ``memory = B * kv_cache_size + parameter_size``)."""
        require_positive("B", B, integer=True)
        return B * self.kv_bytes_per_sequence(m) + self.parameter_bytes(m)

    def latency_s(self, m: ModelShape, B: int, bandwidth: float) -> float:
        """Seconds per decode step (= per token of each sequence), CS336's memory-bound model:
        every step reads all parameters and the whole KV cache once, latency = memory / bandwidth."""
        require_positive("bandwidth", bandwidth)
        return self.memory_bytes(m, B) / bandwidth

    def throughput(self, m: ModelShape, B: int, bandwidth: float) -> float:
        """Tokens per second over the batch: B / latency (CS336). Rises with B towards
        bandwidth / KV bytes per sequence, with diminishing returns."""
        return B / self.latency_s(m, B, bandwidth)

    def throughput_limit(self, m: ModelShape, bandwidth: float) -> float:
        """lim_{B->inf} throughput = bandwidth / KV bytes per sequence (the asymptote CS336 draws)."""
        require_positive("bandwidth", bandwidth)
        return bandwidth / self.kv_bytes_per_sequence(m)

    def fits(self, m: ModelShape, B: int, capacity_bytes: float) -> bool:
        """Whether parameters and the KV cache of B sequences fit in ``capacity_bytes``."""
        require_positive("capacity_bytes", capacity_bytes)
        return self.memory_bytes(m, B) <= capacity_bytes

    def max_batch(self, m: ModelShape, capacity_bytes: float) -> int:
        """The largest B that fits (0 when the parameters alone do not)."""
        require_positive("capacity_bytes", capacity_bytes)
        free = capacity_bytes - self.parameter_bytes(m)
        return max(0, int(free // self.kv_bytes_per_sequence(m)))

    def decode_flops(self, m: ModelShape, B: int, include_attention: bool = False) -> int:
        """FLOPs of one decode step for B sequences: 2 x params x B (001 §1.2), plus, with
        ``include_attention``, attention over the S cached tokens: 4 x B x S x (N*H) x L."""
        require_positive("B", B, integer=True)
        flops = 2 * self.num_params(m) * B
        if include_attention:
            flops += attention_flops(B, m.S, 1, m.N * m.H) * m.L
        return flops

    def roofline_latency_s(self, m: ModelShape, B: int, acc: Accelerator, include_attention: bool = True) -> float:
        """max(memory / bandwidth, decode FLOPs / peak): the roofline version of :func:`latency_s`
        (not the lecture's formula). For Llama 2 13B on an H100 at S = 1024 the memory term wins at
        every B: each sequence adds 250 us of KV reading but only 27 us of compute; with contexts
        shorter than about 110 tokens, compute wins at large B."""
        return max(self.latency_s(m, B, acc.bandwidth), self.decode_flops(m, B, include_attention) / acc.peak_flops)

    def performance(self, m: ModelShape, batch_sizes: Iterable[int], acc: Accelerator) -> list[PerfPoint]:
        """CS336's table: memory, latency, throughput and fits-in-memory for each B on ``acc``."""
        return [PerfPoint(B, self.memory_bytes(m, B), self.latency_s(m, B, acc.bandwidth),
                          self.throughput(m, B, acc.bandwidth), self.fits(m, B, acc.memory_bytes),
                          self.decode_flops(m, B, include_attention=True) / acc.peak_flops)
                for B in batch_sizes]

    def decode_bound(self, n_params: float, acc: Accelerator, B: int = 1,
                     bytes_per_value: int = BF16_BYTES) -> DecodeBound:
        """Exercise 1 of lecture 001 (AI-7): reading n_params x bpv bytes takes ``weight_read_s``;
        2 n_params B FLOPs take ``compute_s``; a step takes the larger, giving B / step tokens/s.
        Intensity 2 n_params B / (bpv n_params) = 2B/bpv meets the ridge at B = ridge x bpv / 2."""
        require_positive("n_params", n_params)
        require_positive("B", B, integer=True)
        read = n_params * bytes_per_value / acc.bandwidth
        compute = 2 * n_params * B / acc.peak_flops
        return DecodeBound(read, compute, B / max(read, compute), acc.intensity * bytes_per_value / 2)

    def concurrent_requests(self, budget_bytes: float, m: ModelShape, context: int | None = None) -> int:
        """How many requests of ``context`` tokens (default S) a KV budget holds:
        floor(budget / KV bytes per sequence) (KV-5)."""
        require_positive("budget_bytes", budget_bytes)
        return int(budget_bytes // self.kv_bytes_per_sequence(m, context))


#: The lectures' model; the module-level functions are its bound methods.
CS336 = PerfModel()
num_params = CS336.num_params
parameter_bytes = CS336.parameter_bytes
kv_bytes_per_token = CS336.kv_bytes_per_token
kv_bytes_per_sequence = CS336.kv_bytes_per_sequence
kv_cache_ratio = CS336.kv_cache_ratio
memory_bytes = CS336.memory_bytes
latency_s = CS336.latency_s
throughput = CS336.throughput
throughput_limit = CS336.throughput_limit
fits = CS336.fits
max_batch = CS336.max_batch
decode_flops = CS336.decode_flops
roofline_latency_s = CS336.roofline_latency_s
performance = CS336.performance
decode_bound = CS336.decode_bound
concurrent_requests = CS336.concurrent_requests
