"""A static, preallocated KV cache and the Triton kernel that appends new keys and values to it.

The cache holds, for every layer, the keys (after RoPE) and values of every cached token of up
to ``max_batch`` sequences in two tensors of shape (layers, max_batch, n_kv_heads, max_seq_len,
head_dim), allocated once and filled with NaN. A sequence's tokens occupy slots
``[0, length)``; the slots past its length stay NaN, so an attention that reads past a
sequence's length yields NaN and fails every check instead of passing by luck.

Appending is an in-place write of new rows at per-sequence slots ``start[b] + t`` for
``t < count[b]``: :func:`kv_append` (the Triton kernel ``kv_append_kernel``) or
:func:`kv_append_torch` (one vectorized ``index_put_``); both validate on the host first and
write nothing when the input is rejected.

Source: lecture 001 §2.1 (the KV cache: store each layer's k, v and only compute the new
token's), §2.3 (bytes per token = 2 × layers × KV heads × head dim × bytes per value; claim
KV-4); CS336 lecture 10 part 3.
"""
from __future__ import annotations

import torch

try:  # Triton is Linux-only; the PyTorch path works without it.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where Triton is missing
    triton = None
    tl = None

from inference_conformance.conformance.device import triton_interpreted

INDEX_DTYPE = torch.int64


if triton is not None:

    @triton.jit
    def kv_append_kernel(
        k_new_ptr, v_new_ptr, k_cache_ptr, v_cache_ptr, start_ptr, count_ptr,
        n_kv_heads, head_dim,
        stride_knb, stride_knh, stride_knt, stride_knd,  # new keys   (B, Hkv, T, D)
        stride_vnb, stride_vnh, stride_vnt, stride_vnd,  # new values (B, Hkv, T, D)
        stride_cb, stride_ch, stride_cs, stride_cd,      # one layer of the cache (max_batch, Hkv, S_max, D)
        T_TILES,
        BLOCK_T: tl.constexpr, BLOCK_KH: tl.constexpr,
    ):
        # Program j + T_TILES*b of the 1-D grid (B * T_TILES programs: a count of token tiles on
        # CUDA's axis 1 would stop at 65,535) copies the new tokens t in [j*BLOCK_T,
        # (j+1)*BLOCK_T) with t < count[b] of sequence b, all KV heads at once (heads and head
        # dims flattened into BLOCK_KH lanes), to cache slots start[b] + t. Every load and store
        # is masked.
        b = (tl.program_id(0) // T_TILES).to(tl.int64)
        j = tl.program_id(0) % T_TILES
        start = tl.load(start_ptr + b)                         # slot of the first new token
        count = tl.load(count_ptr + b)                         # new tokens of sequence b
        t = (j * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)  # (BLOCK_T,)
        c = tl.arange(0, BLOCK_KH)                              # (BLOCK_KH,) = head * D + dim
        head = (c // head_dim).to(tl.int64)
        dim = (c % head_dim).to(tl.int64)
        mask = (t[:, None] < count) & (c[None, :] < n_kv_heads * head_dim)  # (BLOCK_T, BLOCK_KH)
        dst = (b * stride_cb + head[None, :] * stride_ch + (start + t)[:, None] * stride_cs
               + dim[None, :] * stride_cd)
        src_k = b * stride_knb + head[None, :] * stride_knh + t[:, None] * stride_knt + dim[None, :] * stride_knd
        src_v = b * stride_vnb + head[None, :] * stride_vnh + t[:, None] * stride_vnt + dim[None, :] * stride_vnd
        tl.store(k_cache_ptr + dst, tl.load(k_new_ptr + src_k, mask=mask), mask=mask)
        tl.store(v_cache_ptr + dst, tl.load(v_new_ptr + src_v, mask=mask), mask=mask)

else:  # pragma: no cover
    kv_append_kernel = None


def _check_tensor(x, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")


def validate_append(k_cache, v_cache, k_new, v_new, start, count, host_start=None, host_count=None) -> int:
    """Host-side checks shared by both append paths (raise before anything is written).

    k_cache, v_cache: (max_batch, Hkv, S_max, D), same shape, dtype and device.
    k_new, v_new: (B, Hkv, T, D) with B <= max_batch, same dtype and device as the cache.
    start, count: (B,) int64 on the cache's device, start >= 0, 0 <= count <= T,
    start + count <= S_max (the capacity). ``host_start``/``host_count``: optional CPU copies of
    ``start``/``count`` (the caller's promise that they hold the same values); when given, the
    value checks read them instead of the device tensors, so validation never waits on the device.
    Returns the smallest count.
    Raises TypeError for a non-tensor or a wrong dtype, ValueError for a wrong shape, a wrong
    device, a negative value or a write past the capacity; the message names the argument.
    """
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache), ("k_new", k_new), ("v_new", v_new),
                    ("start", start), ("count", count)):
        _check_tensor(x, name)
    if k_cache.dim() != 4:
        raise ValueError(f"k_cache must have shape (max_batch, n_kv_heads, max_seq_len, head_dim), "
                         f"got {tuple(k_cache.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache must have the shape of k_cache {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    if v_cache.data_ptr() == k_cache.data_ptr():
        raise ValueError("v_cache must be a separate buffer from k_cache (they share storage: the values "
                         "would overwrite the keys)")
    if v_cache.stride() != k_cache.stride():
        raise ValueError(f"v_cache must have the strides of k_cache {k_cache.stride()}, got {v_cache.stride()}")
    if not k_cache.dtype.is_floating_point or v_cache.dtype != k_cache.dtype:
        raise TypeError(f"k_cache and v_cache must share one floating dtype, got {k_cache.dtype} and {v_cache.dtype}")
    max_batch, n_kv, cap, hd = k_cache.shape
    for name, x in (("k_new", k_new), ("v_new", v_new)):
        if x.dim() != 4 or x.shape[0] > max_batch or x.shape[1] != n_kv or x.shape[3] != hd:
            raise ValueError(f"{name} must have shape (B <= {max_batch}, {n_kv}, T, {hd}), got {tuple(x.shape)}")
        if x.dtype != k_cache.dtype:
            raise TypeError(f"{name} must have the cache's dtype {k_cache.dtype}, got {x.dtype}")
    if v_new.shape != k_new.shape:
        raise ValueError(f"v_new must have the shape of k_new {tuple(k_new.shape)}, got {tuple(v_new.shape)}")
    B, T = k_new.shape[0], k_new.shape[2]
    for name, x in (("start", start), ("count", count)):
        if x.dtype != INDEX_DTYPE:
            raise TypeError(f"{name} must be int64, got {x.dtype}")
        if x.shape != (B,):
            raise ValueError(f"{name} must have shape ({B},) (one entry per sequence of k_new), got {tuple(x.shape)}")
    for name, x in (("v_cache", v_cache), ("k_new", k_new), ("v_new", v_new), ("start", start), ("count", count)):
        if x.device != k_cache.device:
            raise ValueError(f"{name} is on {x.device}, but the cache is on {k_cache.device}")
    if B == 0:
        return 0
    for name, x in (("host_start", host_start), ("host_count", host_count)):
        if x is not None and (not isinstance(x, torch.Tensor) or x.dtype != INDEX_DTYPE or x.shape != (B,)
                              or x.device.type != "cpu"):
            raise ValueError(f"{name} must be a CPU int64 tensor of shape ({B},) or None")
    start = start if host_start is None else host_start
    count = count if host_count is None else host_count
    s_min, c_min, c_max = int(start.min()), int(count.min()), int(count.max())
    if s_min < 0:
        raise ValueError(f"start must be >= 0, got min {s_min}")
    if c_min < 0 or c_max > T:
        raise ValueError(f"count must lie in [0, T={T}], got range [{c_min}, {c_max}]")
    end = int((start + count).max())
    if end > cap:
        raise ValueError(f"start + count must be <= the cache capacity max_seq_len={cap}, got {end}: "
                         "the write would go past the cache")
    return c_min


def kv_append(k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
              start: torch.Tensor, count: torch.Tensor, host_start: torch.Tensor | None = None,
              host_count: torch.Tensor | None = None) -> None:
    """Write new keys/values into one layer of the cache in place, with the Triton kernel.

    k_cache, v_cache: (max_batch, Hkv, S_max, D) (one layer of :class:`StaticKVCache`); k_new,
    v_new: (B, Hkv, T, D), any strides; start, count: (B,) int64. For every sequence b and
    t < count[b], ``cache[b, :, start[b] + t] = new[b, :, t]``; nothing else changes.
    host_start, host_count: optional CPU copies of start, count (see :func:`validate_append`).
    Raises as :func:`validate_append`; RuntimeError when Triton is missing or when CPU tensors
    are given without the interpreter (TRITON_INTERPRET=1).
    """
    validate_append(k_cache, v_cache, k_new, v_new, start, count, host_start, host_count)
    if kv_append_kernel is None:
        raise RuntimeError("kv_append needs Triton, which is not installed; use kv_append_torch")
    if k_cache.device.type != "cuda" and not triton_interpreted():
        raise RuntimeError("kv_append: Triton needs CUDA tensors unless TRITON_INTERPRET=1 "
                           f"(got tensors on {k_cache.device})")
    B, Hkv, T, D = k_new.shape
    if B == 0 or T == 0:
        return
    start, count = start.contiguous(), count.contiguous()  # the kernel reads them at unit stride
    block_kh = triton.next_power_of_2(Hkv * D)
    block_t = max(1, min(triton.next_power_of_2(T), 4096 // block_kh))
    from inference_conformance.optimized.triton_shared import flat_grid   # (Triton is optional for this module)

    t_tiles = triton.cdiv(T, block_t)
    kv_append_kernel[flat_grid(t_tiles, B)](
        k_new, v_new, k_cache, v_cache, start, count, Hkv, D,
        *k_new.stride(), *v_new.stride(), *k_cache.stride(), t_tiles,
        BLOCK_T=block_t, BLOCK_KH=block_kh,
    )


def kv_append_torch(k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                    start: torch.Tensor, count: torch.Tensor, host_start: torch.Tensor | None = None,
                    host_count: torch.Tensor | None = None) -> None:
    """The same write as :func:`kv_append`, as one vectorized PyTorch ``index_put_`` per tensor.

    Same arguments, semantics and errors (except that it needs no Triton).
    """
    c_min = validate_append(k_cache, v_cache, k_new, v_new, start, count, host_start, host_count)
    B, Hkv, T, D = k_new.shape
    if B == 0 or T == 0:
        return
    if T == 1 and c_min == 1:  # one token for every sequence (a decode step): no mask needed
        rows = torch.arange(B, device=k_new.device)
        k_cache[rows, :, start] = k_new[:, :, 0]                   # (B, Hkv, D)
        v_cache[rows, :, start] = v_new[:, :, 0]
        return
    t = torch.arange(T, device=k_new.device)                      # (T,)
    valid = t[None, :] < count[:, None]                            # (B, T)
    bi, ti = valid.nonzero(as_tuple=True)                          # (n,), (n,)
    slot = start[bi] + ti                                          # (n,)
    k_cache[bi, :, slot] = k_new[bi, :, ti]                        # (n, Hkv, D)
    v_cache[bi, :, slot] = v_new[bi, :, ti]


APPENDS = {"triton": kv_append, "torch": kv_append_torch}


class StaticKVCache:
    """Preallocated K and V for ``n_layers`` layers of up to ``max_batch`` sequences.

    ``k``, ``v``: (n_layers, max_batch, n_kv_heads, max_seq_len, head_dim) in ``dtype`` on
    ``device``, NaN in every slot not written since the last :meth:`reset`. ``lengths``:
    (max_batch,) int64 on ``device`` (tokens cached per sequence); ``host_lengths`` the same on
    the CPU (so the engine never waits on the device to learn a length). ``append`` is "triton"
    (:func:`kv_append`) or "torch" (:func:`kv_append_torch`).

    Raises ValueError for a non-positive size or an unknown ``append``, TypeError for a
    non-floating dtype.
    """

    def __init__(self, n_layers: int, max_batch: int, n_kv_heads: int, max_seq_len: int, head_dim: int,
                 dtype: torch.dtype, device, append: str = "torch"):
        for name, v in (("n_layers", n_layers), ("max_batch", max_batch), ("n_kv_heads", n_kv_heads),
                        ("max_seq_len", max_seq_len), ("head_dim", head_dim)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        if append not in APPENDS:
            raise ValueError(f"append must be one of {sorted(APPENDS)}, got {append!r}")
        shape = (n_layers, max_batch, n_kv_heads, max_seq_len, head_dim)
        self.k = torch.full(shape, float("nan"), dtype=dtype, device=device)  # (L, Bmax, Hkv, S_max, D)
        self.v = torch.full(shape, float("nan"), dtype=dtype, device=device)  # (L, Bmax, Hkv, S_max, D)
        self.lengths = torch.zeros(max_batch, dtype=INDEX_DTYPE, device=device)  # (Bmax,)
        self.host_lengths = torch.zeros(max_batch, dtype=INDEX_DTYPE)             # (Bmax,) on CPU
        self.append_name = append
        self._append = APPENDS[append]

    @property
    def n_layers(self) -> int:
        return self.k.shape[0]

    @property
    def max_batch(self) -> int:
        return self.k.shape[1]

    @property
    def max_seq_len(self) -> int:
        return self.k.shape[3]

    def reset(self) -> None:
        """Forget every sequence: lengths 0 and NaN in every slot that was written."""
        used = int(self.host_lengths.max())
        if used:
            self.k[:, :, :, :used].fill_(float("nan"))
            self.v[:, :, :, :used].fill_(float("nan"))
        self.lengths.zero_()
        self.host_lengths.zero_()

    def append(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor, start: torch.Tensor,
               count: torch.Tensor, host_start: torch.Tensor | None = None,
               host_count: torch.Tensor | None = None) -> None:
        """Write ``count[b]`` new tokens of sequence b at slots ``start[b]...`` of ``layer``
        (does not change ``lengths``: call :meth:`advance` once every layer is written).
        host_start, host_count: optional CPU copies of start, count (no device wait)."""
        if not isinstance(layer, int) or not 0 <= layer < self.n_layers:
            raise ValueError(f"layer must be an int in [0, {self.n_layers}), got {layer!r}")
        self._append(self.k[layer], self.v[layer], k_new, v_new, start, count, host_start, host_count)

    def advance(self, count: torch.Tensor, host_count: torch.Tensor) -> None:
        """lengths[:B] += count (device) and host_count (CPU), B = len(count)."""
        B = count.shape[0]
        self.lengths[:B] += count
        self.host_lengths[:B] += host_count

    def bytes_per_token(self) -> int:
        """2 × layers × KV heads × head dim × bytes per value (claim KV-4)."""
        L, _, Hkv, _, D = self.k.shape
        return 2 * L * Hkv * D * self.k.element_size()

    def bytes_used(self) -> int:
        """Bytes of K and V held for the cached tokens: bytes_per_token × Σ lengths."""
        return self.bytes_per_token() * int(self.host_lengths.sum())

    def bytes_allocated(self) -> int:
        """Bytes of the two preallocated tensors (the whole capacity)."""
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()


def compile_variants():
    """The append of float16 rows."""
    from inference_conformance.optimized.triton_shared import CompileVariant

    return [CompileVariant("kv_append fp16", kv_append_kernel,
                           {"k_new_ptr": "*fp16", "v_new_ptr": "*fp16", "k_cache_ptr": "*fp16", "v_cache_ptr": "*fp16",
                            "start_ptr": "*i64", "count_ptr": "*i64"}, dict(BLOCK_T=4, BLOCK_KH=128))]


def smoke_calls(device: str):
    """An append at two sequences' own offsets, bit-exact against the PyTorch ``index_put_`` twin
    (unwritten slots NaN in both)."""
    from inference_conformance.optimized.triton_shared import SmokeCall

    def run():
        from inference_conformance.conformance import tolerance

        g = torch.Generator().manual_seed(0)
        k_cache = torch.full((2, 2, 16, 8), float("nan"), device=device)
        v_cache = k_cache.clone()
        k_new = torch.randn(2, 2, 3, 8, generator=g).to(device)
        v_new = torch.randn(2, 2, 3, 8, generator=g).to(device)
        start = torch.tensor([0, 5], device=device)
        count = torch.tensor([3, 2], device=device)
        k2, v2 = k_cache.clone(), v_cache.clone()
        kv_append(k_cache, v_cache, k_new, v_new, start, count)
        kv_append_torch(k2, v2, k_new, v_new, start, count)
        return tolerance.check_exact(torch.nan_to_num(torch.stack([k_cache, v_cache]), nan=7.0),
                                     torch.nan_to_num(torch.stack([k2, v2]), nan=7.0))
    return [SmokeCall("kv_append float32 B=2 T=3", run)]
