"""How the paged kernels split a sequence's keys (split-KV; claims PA-1, PA-8): the decode kernel
(``optimized/paged_attention/__init__.py``) and the mixed-batch kernel (``optimized/paged_attention/prefill.py``)
both size their key ranges by :func:`split_plan` (:func:`tokens_per_split`, or a fixed size in the
batch-invariant mode); the ranges are merged exactly
(``inference_conformance.optimized.attention.tiles.merge_splits``).
"""
from __future__ import annotations

import torch

from inference_conformance.conformance.contracts.checks import check_num_splits
from inference_conformance.conformance.device import triton_interpreted
from inference_conformance.optimized.attention.batch_invariant import keys_per_split
from inference_conformance.optimized.attention.tiles import MAX_SPLITS
from inference_conformance.optimized.triton_shared import sm_count

#: Keys per split under the interpreter: one split up to this length, then two.
INTERPRET_TOKENS_PER_SPLIT = 128
#: Fewest keys per split on GPU.
MIN_TOKENS_PER_SPLIT = 256


def tokens_per_split(programs: int, Hkv: int, max_len: int, block_n: int, device: torch.device,
                     num_splits: int | None, *, split_interpreted: bool = True) -> int:
    """Keys per split (a multiple of ``block_n``) of a launch with ``programs`` x ``Hkv``
    programs per split (sequences, or query tiles) over sequences of at most ``max_len`` keys:
    ceil(max_len / num_splits) when ``num_splits`` is given (at most MAX_SPLITS ranges); under
    the interpreter or on the CPU one split up to INTERPRET_TOKENS_PER_SPLIT keys, then two (one
    whatever the length when not ``split_interpreted``); on GPU enough splits for two programs
    per SM, each at least MIN_TOKENS_PER_SPLIT keys. Queries the GPU's SM count on CUDA only."""
    if num_splits is not None:
        per = -(-max_len // min(num_splits, MAX_SPLITS))
    elif triton_interpreted() or device.type != "cuda":
        per = max_len if max_len <= INTERPRET_TOKENS_PER_SPLIT or not split_interpreted else -(-max_len // 2)
    else:
        sms = sm_count(device.index if device.index is not None else torch.cuda.current_device())
        want = max(1, min(MAX_SPLITS, -(-2 * sms // (programs * Hkv))))
        per = max(MIN_TOKENS_PER_SPLIT, -(-max_len // want))
    return -(-per // block_n) * block_n                                      # a multiple of BLOCK_N


def split_plan(programs: int, Hkv: int, max_len: int, block_n: int, device: torch.device, num_splits: int | None,
               batch_invariant: bool, *, split_interpreted: bool = True) -> tuple[int, int, bool]:
    """(keys per split, split count S, whether to write partials and merge) of a paged launch.
    Default: :func:`tokens_per_split` (from the batch's grid and longest sequence), partials only
    when S > 1. ``batch_invariant``: a fixed split size
    (:func:`inference_conformance.optimized.attention.batch_invariant.keys_per_split`), S to cover
    the longest sequence and always partials, so that a sequence's splits and its merge never
    depend on the batch. Raises ValueError naming ``num_splits`` when given with ``batch_invariant``."""
    if batch_invariant:
        check_num_splits(num_splits, batch_invariant)
        per = keys_per_split(block_n, device)
        return per, max(1, -(-max_len // per)), True
    per = tokens_per_split(programs, Hkv, max_len, block_n, device, num_splits, split_interpreted=split_interpreted)
    S = -(-max_len // per)
    return per, S, S > 1
