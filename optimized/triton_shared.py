"""Triton pieces shared by every kernel of the suite, whatever its technique: the loop over tiles
(``tile_loop``, with the interpreter switch ``RANGE_LOOP``), the 1-D grids every kernel launches
(``flat_grid``) and the output tile of a program of a matmul's grid (``output_tile``), how tiles of each dtype are multiplied (``DOT_*``,
``dot_mode``),
float32 -> bfloat16 rounding, and the host checks and device queries that every wrapper makes. The attention kernels
(:mod:`inference_conformance.optimized.attention.tiles`,
:mod:`inference_conformance.optimized.attention.flash_attention`, :mod:`inference_conformance.optimized.attention.flash_decoding`,
:mod:`inference_conformance.optimized.paged_attention`) and the quantized matmuls
(:mod:`inference_conformance.optimized.quantization.quant_matmul`,
:mod:`inference_conformance.optimized.quantization.w8a8_matmul`) import this module; it imports none of them.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import warnings

import numpy
import torch
import triton
import triton.language as tl

from inference_conformance.conformance.device import (cache_interpreter_patching, skip_discarded_overflow_checks,
                                                      triton_interpreted)

# DOT_MODE values (a constexpr of the kernels)
DOT_NATIVE = 0   # 16-bit on GPU: tl.dot on the input dtype, float32 accumulation, P cast to it
DOT_UPCAST = 1   # 16-bit under the interpreter: cast tiles to float32 first (its bf16 tl.dot is wrong)
DOT_SUM = 2      # float64: broadcast multiply and tl.sum (no reliance on a float64 tl.dot)
DOT_IEEE = 3     # float32: tl.dot with input_precision="ieee" (TF32 would cost ~1e-3 relative)


def _range_takes_runtime_bounds() -> bool:
    """Whether ``range(start, end, step)`` in a kernel may have run-time (non-constexpr) bounds.

    Always true for compiled kernels. Triton < 3.7's interpreter holds every scalar as a
    1-element numpy array and turns a loop bound into ``int(array)``, which numpy >= 2.4 refuses
    ("only 0-dimensional arrays can be converted to Python scalars"); there a ``while`` loop
    walks the tiles instead (``bool(array)`` still works). Decided when the kernels are defined,
    like the interpreter itself (``TRITON_INTERPRET`` is read by ``triton.jit``)."""
    if not triton_interpreted():
        return True
    if tuple(int(x) for x in re.findall(r"\d+", triton.__version__)[:2]) >= (3, 7):
        return True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            int(numpy.ones(1))
        except TypeError:
            return False
    return True


if triton_interpreted():
    cache_interpreter_patching()  # the interpreter's per-call rescans of triton.language, read once
    skip_discarded_overflow_checks()  # int64 overflow checks whose verdict debug=False discards


#: True: ``tile_loop`` walks its tiles with ``for ... in range`` (compiled code, where the loop
#: is software-pipelined, and interpreters that allow it); False: with ``while`` (see above).
RANGE_LOOP = tl.constexpr(_range_takes_runtime_bounds())


@triton.jit
def tile_loop(state, args, start, end, STEP: tl.constexpr, BODY: tl.constexpr, CONSTS: tl.constexpr):
    """Run ``state = BODY(state, args, t, CONSTS)`` for t = start, start + STEP, ... < end.

    ``BODY`` is a ``@triton.jit`` function (one tile of a kernel); ``state`` is the tuple it
    carries from tile to tile and returns (accumulators, advancing pointers), ``args`` the tuple
    of run-time values it only reads, ``CONSTS`` the tuple of its constexprs (a tuple passed as
    a run-time argument loses their constexpr-ness). The loop is ``for ... in range`` where
    ``RANGE_LOOP`` allows it (compiled: an ``scf.for``, software-pipelined), else ``while``.
    Returns the last state."""
    if RANGE_LOOP:
        for t in range(start, end, STEP):
            state = BODY(state, args, t, CONSTS)
    else:            # Triton < 3.7's interpreter with numpy >= 2.4 (see RANGE_LOOP)
        t = start
        while t < end:
            state = BODY(state, args, t, CONSTS)
            t += STEP
    return state


@triton.jit
def output_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The (BLOCK_M, BLOCK_N) tile of an (M, N) output that program program_id(0) of the 1-D
    grid ``flat_grid(cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))`` owns (M tiles vary fastest):
    (offs_m (BLOCK_M,), offs_n (BLOCK_N,), offs_m < M, offs_n < N)."""
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    offs_m = (pid % tiles_m) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (pid // tiles_m) * BLOCK_N + tl.arange(0, BLOCK_N)
    return offs_m, offs_n, offs_m < M, offs_n < N


@triton.jit
def round_to_bf16(w):
    """float32 -> the nearest bfloat16 value (ties to even), kept in float32 (finite inputs).
    Triton's interpreter truncates float32 -> bfloat16 casts; kernels round by hand there."""
    bits = w.to(tl.uint32, bitcast=True)
    bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


# ----------------------------------------------------------------------------------------------
# host side
# ----------------------------------------------------------------------------------------------

def dot_mode(dtype: torch.dtype) -> int:
    """How the kernels multiply tiles of ``dtype`` (see DOT_* above); decided per call."""
    if dtype == torch.float64:
        return DOT_SUM
    if dtype == torch.float32:
        return DOT_IEEE
    return DOT_UPCAST if triton_interpreted() else DOT_NATIVE


#: Most programs a CUDA grid may have on axis 0 (x), and on axes 1 and 2 (y, z).
MAX_GRID_X = 2**31 - 1
MAX_GRID_YZ = 65535


def flat_grid(*counts: int) -> tuple[int]:
    """The 1-D grid of ``prod(counts)`` programs that every kernel here launches: a kernel
    splits program_id(0) back into its coordinates (the first count varying fastest), so no
    count of batch x heads, rows or tiles lands on axis 1 or 2, where CUDA allows only
    MAX_GRID_YZ programs. ValueError when the product passes MAX_GRID_X."""
    n = 1
    for c in counts:
        n *= int(c)
    if n > MAX_GRID_X:
        raise ValueError(f"the launch needs {n} programs ({' x '.join(str(int(c)) for c in counts)}), "
                         f"more than a CUDA grid holds ({MAX_GRID_X})")
    return (n,)


def check_device(t: torch.Tensor, name: str = "q") -> None:
    """The kernels need CUDA tensors, or CPU tensors under the interpreter (TRITON_INTERPRET=1);
    ValueError naming ``name`` otherwise."""
    if t.device.type != "cuda" and not triton_interpreted():
        raise ValueError(f"{name} is on {t.device}; the Triton kernels need CUDA tensors "
                         "(or TRITON_INTERPRET=1 for CPU tensors)")


@functools.lru_cache(maxsize=None)
def sm_count(index: int) -> int:
    """Streaming multiprocessors of CUDA device ``index`` (read once, at the first call that
    sizes a grid on that device; never at import time)."""
    return torch.cuda.get_device_properties(index).multi_processor_count


@dataclasses.dataclass(frozen=True)
class CompileVariant:
    """One ahead-of-time compilation a kernel module asks for (``tests/test_triton_compile.py``
    compiles each for sm_90 without a GPU): ``kernel`` (a ``@triton.jit`` function), ``types``
    (pointer and float argument types, e.g. ``{"Q_ptr": "*fp16", "scale": "fp32"}``; the others
    are i32), ``constexprs`` (name -> value), ``min_for_loops`` (the ``scf.for`` loops its
    tile loops must compile to, never ``scf.while``; 0: not checked)."""

    label: str
    kernel: object
    types: dict
    constexprs: dict
    min_for_loops: int = 0


@dataclasses.dataclass(frozen=True)
class SmokeCall:
    """One tiny call of a kernel through its host wrapper (``scripts/kernel_smoke.py`` runs each
    once): ``run()`` returns a :class:`inference_conformance.conformance.tolerance.Comparison` against the reference."""

    label: str
    run: object


def kernel_modules() -> list:
    """Every module of ``optimized/`` that defines a Triton kernel (a ``@triton.jit`` function
    whose name ends in ``_kernel``), imported, in file order. Each provides
    ``compile_variants()`` and ``smoke_calls(device)``; the compile check and the smoke script
    read them, so no list of kernels is kept anywhere else."""
    import importlib
    from pathlib import Path

    here = Path(__file__).resolve().parent
    kernel = re.compile(r"@triton\.jit\s*\n\s*def \w+_kernel\(")
    names = sorted(".".join(p.relative_to(here).parent.parts if p.stem == "__init__" else p.relative_to(here).with_suffix("").parts)
                   for p in here.rglob("*.py") if kernel.search(p.read_text(encoding="utf-8")))
    return [importlib.import_module(f"{__package__}.{n}") for n in names]
