"""Checks several contracts share, each raising the contract's documented error with the
argument's name: a tensor argument's type, rank and dtype (:func:`check_tensor`), an index
tensor's type and dtype (:func:`check_index`), the softmax ``scale`` of the attention contracts
(:func:`check_scale`), the device every tensor of a call shares (:func:`check_devices`), an
attention call's keys and values against its query (:func:`check_kv`), a block
table and its lengths (:func:`check_block_table`, :func:`check_seq_lens`,
:func:`check_live_blocks`), and the ``num_splits`` option of the split-KV kernels
(:func:`check_num_splits`).
No contract is declared here (the registry finds none: no ``CONTRACT``).
"""
from __future__ import annotations

import math
import numbers

import torch


def check_scale(scale, dtype: torch.dtype) -> None:
    """``scale`` must be a real number (not a bool), finite, and representable in the dtype the
    scores of ``dtype`` inputs are computed in (float64 for float64, else float32).

    Raises TypeError for a non-real (or bool) scale, ValueError for a non-finite one or one
    beyond that dtype's largest finite value, each naming ``scale``.
    """
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number (e.g. 1/sqrt(D)), got {type(scale).__name__}")
    if not math.isfinite(float(scale)):
        raise ValueError(f"scale must be finite, got {scale}")
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    if abs(float(scale)) > torch.finfo(acc).max:
        raise ValueError(f"scale must be representable in {str(acc).replace('torch.', '')}, the dtype the "
                         f"scores of {str(dtype).replace('torch.', '')} inputs are computed in "
                         f"(|scale| <= {torch.finfo(acc).max:.4g}), got {scale}")


def check_tensor(name: str, t, rank: int, dims: str, dtypes: tuple, technique: str) -> None:
    """``t`` (the argument ``name``) must be a torch.Tensor of ``rank`` dimensions (``dims`` names
    them, e.g. "(B, H, T, D)") with a dtype in ``dtypes``, those of the ``technique`` contract.

    Raises TypeError for a non-tensor or another dtype, ValueError for another rank, each naming
    ``name``.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"{name} must have {rank} dimensions {dims}, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} has dtype {t.dtype}; the {technique} contract takes "
                        f"{[str(d).replace('torch.', '') for d in dtypes]}")


def _words(dtypes: tuple) -> str:
    return " or ".join(str(d).replace("torch.", "") for d in dtypes)


def check_index(name: str, t, dims: str, dtypes: tuple = (torch.int32,)) -> None:
    """``t`` (the argument ``name``, shaped ``dims``) must be a torch.Tensor with a dtype in
    ``dtypes`` (int32 by default). Raises TypeError naming ``name``; its shape is the caller's."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {dims} of {_words(dtypes)}, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must be {_words(dtypes)} {dims}, got {t.dtype}")


def check_devices(ref_name: str, ref: torch.Tensor, others) -> None:
    """``ref`` (the argument ``ref_name``) must be on a cpu or cuda device and every tensor of
    ``others`` ((name, tensor or None) pairs; None is skipped) on ``ref``'s device. Raises
    ValueError naming the argument."""
    if ref.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{ref_name} must be on a cpu or cuda device, got {ref.device}")
    for name, t in others:
        if t is not None and t.device != ref.device:
            raise ValueError(f"{name} is on {t.device}, {ref_name} on {ref.device}: all tensors must be on one device")


def check_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, names: tuple[str, str, str] = ("q", "k", "v"),
             others=()) -> None:
    """The keys ``k`` and values ``v`` of an attention call (tensors, checked by
    :func:`check_tensor`) must share the query ``q``'s dtype and device, and one shape; ``names``
    are the three arguments' names (e.g. ("q", "k_cache", "v_cache")), ``others`` further
    (name, tensor) pairs that must be on q's device (:func:`check_devices`). Raises TypeError
    (dtype) or ValueError (device, shape) naming the argument."""
    qn, kn, vn = names
    for name, t in ((kn, k), (vn, v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype}, {qn} {q.dtype}: {qn}, {kn} and {vn} must share one dtype")
    check_devices(qn, q, ((kn, k), (vn, v), *others))
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"{kn} and {vn} must have the same shape, got {kn} {tuple(k.shape)} and {vn} {tuple(v.shape)}")


def check_block_table(block_table: torch.Tensor, B: int) -> int:
    """``block_table`` must have shape (B, max_blocks >= 1); returns max_blocks. Raises
    ValueError naming ``block_table``."""
    if block_table.dim() != 2 or block_table.shape[0] != B or block_table.shape[1] < 1:
        raise ValueError(f"block_table must have shape (B={B}, max_blocks >= 1), got {tuple(block_table.shape)}")
    return block_table.shape[1]


def check_seq_lens(seq_lens: torch.Tensor, B: int, capacity: int, of: str) -> torch.Tensor:
    """``seq_lens`` must have shape (B,) and every length lie in [1, capacity], ``of`` naming the
    capacity (e.g. "max_blocks * block_size"). Returns the lengths as int64 on the host (one
    synchronisation on CUDA). Raises ValueError naming ``seq_lens`` (and the first sequence
    outside)."""
    if tuple(seq_lens.shape) != (B,):
        raise ValueError(f"seq_lens must have shape (B,) = ({B},), got {tuple(seq_lens.shape)}")
    lens = seq_lens.detach().to("cpu", torch.int64)
    bad = ((lens < 1) | (lens > capacity)).nonzero()
    if bad.numel():
        b = int(bad[0, 0])
        raise ValueError(f"seq_lens must lie in [1, {of}] = [1, {capacity}]; seq_lens[{b}] = {int(lens[b])}")
    return lens


def blocks_needed(seq_lens: torch.Tensor, block_size: int) -> torch.Tensor:
    """ceil(seq_lens / block_size): the live table entries of each sequence, (B,) int64."""
    return (seq_lens.to(torch.int64) + block_size - 1) // block_size


def check_live_blocks(block_table: torch.Tensor, lens: torch.Tensor, block_size: int, num_blocks: int) -> None:
    """Every live entry of ``block_table`` (B, max_blocks) (those below ceil(lens / block_size),
    ``lens`` the host lengths of :func:`check_seq_lens`) must lie in [0, num_blocks); entries past
    a sequence's blocks are never read. Raises ValueError naming the entry and its sequence."""
    table = block_table.detach().to("cpu", torch.int64)
    live = torch.arange(table.shape[1])[None, :] < blocks_needed(lens, block_size)[:, None]   # (B, max_blocks)
    out_of_range = live & ((table < 0) | (table >= num_blocks))
    if out_of_range.any():
        b, i = (int(x) for x in out_of_range.nonzero()[0])
        raise ValueError(f"block_table[{b}, {i}] = {int(table[b, i])} is a live block of sequence {b} "
                         f"(seq_lens[{b}] = {int(lens[b])}) outside [0, num_blocks) = [0, {num_blocks})")


def check_num_splits(num_splits, batch_invariant: bool = False) -> None:
    """``num_splits`` of a split-KV kernel must be None (the kernel chooses) or an int >= 1 (not
    a bool), and None with ``batch_invariant`` (that mode fixes the split size). Raises
    ValueError naming ``num_splits``."""
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"num_splits must be an int >= 1 or None, got {num_splits!r}")
    if batch_invariant and num_splits is not None:
        raise ValueError(f"num_splits must be None with batch_invariant=True (the mode fixes the split size), "
                         f"got {num_splits!r}")
