"""Grids past CUDA's per-axis limits: axis 0 (x) of a grid may hold 2^31 - 1 programs, axes 1 and
2 (y, z) only 65,535; a launch past them fails and its output is never written. Every Triton
launch of ``optimized/`` whose program count grows with batch x heads, rows, columns, tokens or
splits is a 1-D grid (``inference_conformance.optimized.triton_shared.flat_grid``): the kernel splits program_id(0)
back into its coordinates.

Two checks per launch, at shapes where the count that used to sit on axis 1 or 2 exceeds 65,535:

- ``test_triton_grids_stay_within_cuda_limits`` (every profile, every device): the grid each
  host wrapper computes, captured in place of the kernels (nothing is launched), has at most
  65,535 programs on axes 1 and 2 and 2^31 - 1 on axis 0. The interpreter has no such limit,
  so this is the check that fails on the former 2-D and 3-D grids.
- ``test_triton_launch_past_65535_programs`` (CUDA only: the interpreter spends milliseconds per
  program, and one of these launches holds 65,536 or more): the same shapes launched for real,
  every output compared with a reference.
"""
from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

from inference_conformance.conformance.tolerance import assert_close, assert_exact

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: CUDA's limits (inference_conformance.optimized.triton_shared.MAX_GRID_X / MAX_GRID_YZ, restated: the check must not
#: read its bound from the code it checks).
MAX_X, MAX_YZ = 2**31 - 1, 65535
#: The smallest count past MAX_YZ.
PAST = MAX_YZ + 1


class GridRecorder:
    """Stands in for a Triton kernel (``kernel[grid](*args, **kwargs)``): records the grid of
    every launch (a callable grid is evaluated on the launch's keyword arguments, as Triton's
    launcher does with the meta-parameters) and launches only when ``launch`` is true."""

    def __init__(self, name: str, kernel, grids: list, launch: bool):
        self.name, self.kernel, self.grids, self.launch = name, kernel, grids, launch

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            g = grid(kwargs) if callable(grid) else grid
            self.grids.append((self.name, tuple(int(x) for x in g)))
            if self.launch:
                return self.kernel[grid](*args, **kwargs)
            return None
        return run


@dataclasses.dataclass(frozen=True)
class Launch:
    """A host wrapper called at a shape past the limit: ``kernels`` are the (module, name) of
    every kernel it launches; ``make(device, real)`` returns (call, check): ``call()`` runs the
    wrapper, ``check(result)`` compares its result with a reference. ``real`` false: inputs for
    the host check only (zeros, or stride-0 views of one element, where a real input is large).
    ``launchable`` false: the shape is too large to launch in a test (host check only)."""

    kernels: tuple
    make: object
    launchable: bool = True


def _attention(fn_name: str, B: int, Hq: int, Hkv: int, Tk: int, **kw):
    def make(device, real):
        from inference_conformance.reference.attention import attention as ref

        mod = importlib.import_module("inference_conformance.optimized.attention.flash_decoding" if fn_name == "flash_decoding"
                                      else "inference_conformance.optimized.attention.flash_attention")
        g = torch.Generator().manual_seed(0)
        q = torch.randn(B, Hq, 1, 1, generator=g, dtype=torch.float64)
        k = torch.randn(B, Hkv, Tk, 1, generator=g, dtype=torch.float64)
        v = torch.randn(B, Hkv, Tk, 1, generator=g, dtype=torch.float64)
        args = [t.to(device, torch.float32) for t in (q, k, v)]

        def check(out):
            assert_close(out, ref(q, k, v, causal=False, scale=1.0).to(device), what=f"{fn_name} {B}x{Hq} heads")
        return (lambda: getattr(mod, fn_name)(*args, causal=False, scale=1.0, **kw)), check
    return make


def _paged(B: int, Hq: int, Hkv: int, n: int, block_size: int, num_splits: int):
    def make(device, real):
        from inference_conformance.properties.paged_attention.cases import PagedCase, check_against_contiguous, make_inputs
        from inference_conformance.optimized.paged_attention import paged_attention

        case = PagedCase((n,) * B, Hq, Hkv, 1, block_size, 1.0, spare_blocks=0, spare_cols=0)
        if real:
            inp = make_inputs(case, 0, torch.float32, device)
            return ((lambda: paged_attention(*inp.args(), scale=1.0, num_splits=num_splits)),
                    lambda out: check_against_contiguous(out, inp, case, what=f"paged attention, {B}x{Hq} heads"))
        blocks = -(-n // block_size)        # host check only: zero caches, blocks in order
        kc = torch.zeros(B * blocks, block_size, Hkv, 1, dtype=torch.float16, device=device)
        table = torch.arange(B * blocks, dtype=torch.int32, device=device).reshape(B, blocks)
        lens = torch.full((B,), n, dtype=torch.int32, device=device)
        q = torch.zeros(B, Hq, 1, dtype=torch.float16, device=device)
        return (lambda: paged_attention(q, kc, kc.clone(), table, lens, scale=1.0, num_splits=num_splits)), None
    return make


def _quant(M: int, N: int):
    def make(device, real):
        from inference_conformance.optimized.quantization.quant_matmul import quant_matmul

        g = torch.Generator().manual_seed(0)
        x = torch.randn(M, 2, generator=g)
        codes = torch.randint(0, 256, (N, 2), generator=g, dtype=torch.uint8)
        zeros = torch.randint(0, 256, (N, 1), generator=g, dtype=torch.uint8)
        scales = torch.rand(N, 1, generator=g) + 0.5
        dev = [t.to(device) for t in (x, codes, scales, zeros)]

        def check(out):
            w = (codes.double() - zeros.double()) * scales.double()
            assert_close(out, (x.double() @ w.T).to(device), out_pt=(x @ w.float().T).to(device),
                         what=f"quant_matmul, N = {N}", rule="quant-matmul")
        return (lambda: quant_matmul(*dev, bits=8, group_size=2, N=N, K=2)), check
    return make


def _w8a8(M: int, N: int):
    def make(device, real):
        from inference_conformance.optimized.quantization.w8a8_matmul import w8a8_matmul, w8a8_matmul_torch

        g = torch.Generator().manual_seed(0)
        x_q = torch.randint(-127, 128, (M, 1), generator=g, dtype=torch.int8).to(device)
        w_q = torch.randint(-127, 128, (N, 1), generator=g, dtype=torch.int8).to(device)
        x_s, w_s = torch.ones(M, device=device), torch.ones(N, device=device)
        return ((lambda: w8a8_matmul(x_q, x_s, w_q, w_s, out_dtype=torch.int32)),
                lambda out: assert_exact(out, w8a8_matmul_torch(x_q, x_s, w_q, w_s, out_dtype=torch.int32),
                                         what=f"w8a8 int32 accumulator, N = {N}"))
    return make


def _kv_append(Hkv: int, T: int, D: int):
    def make(device, real):
        from inference_conformance.optimized.kv_cache.append import kv_append, kv_append_torch

        g = torch.Generator().manual_seed(0)
        new = [torch.randn(1, Hkv, 1, D, generator=g).to(device, torch.float16).expand(1, Hkv, T, D) for _ in "kv"]
        start = torch.zeros(1, dtype=torch.int64, device=device)
        count = torch.full((1,), T, dtype=torch.int64, device=device)
        if not real:      # host check only: caches of stride 0 (nothing is written)
            caches = [torch.zeros(1, 1, 1, 1, dtype=torch.float16, device=device).expand(1, Hkv, T, D) for _ in "kv"]
            return (lambda: kv_append(*caches, *new, start, count)), None
        caches = [torch.full((1, Hkv, T, D), float("nan"), dtype=torch.float16, device=device) for _ in "kv"]
        want = [c.clone() for c in caches]
        kv_append_torch(*want, *new, start, count)

        def check(_):
            for c, w in zip(caches, want):
                assert_exact(c, w, what=f"kv_append of {T} tokens")
        return (lambda: kv_append(*caches, *new, start, count)), check
    return make


_ATTN = "inference_conformance.optimized.attention"
FA, FD, TILES = f"{_ATTN}.flash_attention", f"{_ATTN}.flash_decoding", f"{_ATTN}.tiles"
PA, QM = "inference_conformance.optimized.paged_attention", "inference_conformance.optimized.quantization.quant_matmul"
MERGE = (TILES, "split_kv_merge_kernel")

#: Each launch at a shape whose former axis-1 or axis-2 count exceeds 65,535 (the former grid in
#: the comment).
LAUNCHES = {
    # (1, B·Hq): batch x heads on axis 1
    "flash_attention-65536-heads": Launch(((FA, "_flash_attn_fwd_kernel"),),
                                          _attention("flash_attention", 2048, 32, 8, 1)),
    # (1, B·Hq, S) and the merge's (1, B·Hq)
    "split_kv-65536-heads": Launch(((FD, "_split_kv_kernel"), MERGE),
                                   _attention("flash_decoding", 4096, 16, 16, 2, num_splits=2)),
    # (1, 1, S): splits on axis 2 (now capped at MAX_SPLITS: the merge holds a row's splits in one tile)
    "split_kv-65536-splits": Launch(((FD, "_split_kv_kernel"), MERGE),
                                    _attention("flash_decoding", 1, 1, 1, PAST, num_splits=PAST)),
    # decode (B·Hkv, S) = (512, 2) (129 tokens: two splits), then the merge's (1, B·Hq) = (1, 65536)
    "paged-65536-heads": Launch(((PA, "_paged_decode_kernel"), MERGE), _paged(512, 128, 1, 129, 16, 2)),
    # decode (1, S) with S = 65536 splits of 128 tokens (the interpreter's BLOCK_N; now capped
    # at MAX_SPLITS)
    "paged-65536-splits": Launch(((PA, "_paged_decode_kernel"), MERGE),
                                 _paged(1, 1, 1, PAST * 128, 2048, PAST), launchable=False),
    # tiled (cdiv(M, 32), cdiv(N, 32)) with N = 65536 · 32
    "quant_tiled-65536-column-tiles": Launch(((QM, "quant_matmul_kernel"),), _quant(17, PAST * 32)),
    # decode (cdiv(N, 64), splits): column blocks were already on axis 0
    "quant_gemv-65536-column-tiles": Launch(((QM, "quant_gemv_kernel"),), _quant(1, PAST * 64)),
    # (cdiv(M, 16), cdiv(N, 64)) with N = 65536 · 64
    "w8a8-65536-column-tiles": Launch((("inference_conformance.optimized.quantization.w8a8_matmul", "w8a8_matmul_kernel"),),
                                      _w8a8(1, PAST * 64)),
    # (B, cdiv(T, BLOCK_T)) with BLOCK_T = 1 (Hkv·D = 4096 lanes) and T = 65536 tokens
    "kv_append-65536-token-tiles": Launch((("inference_conformance.optimized.kv_cache.append", "kv_append_kernel"),),
                                          _kv_append(2, PAST, 2048)),
}


def _write_kv(N: int):
    def make(device, real):
        from inference_conformance.optimized.paged_attention import write_kv_cache

        caches = [torch.full((N // 16, 16, 1, 1), float("nan"), device=device) for _ in "kv"]
        new = [torch.randn(N, 1, 1, generator=torch.Generator().manual_seed(i)).to(device) for i in range(2)]
        slots = torch.randperm(N, generator=torch.Generator().manual_seed(2)).to(device)

        def check(_):
            for c, t in zip(caches, new):
                assert_exact(c.reshape(N, 1, 1)[slots], t, what=f"write_kv_cache of {N} tokens")
        return (lambda: write_kv_cache(*caches, *new, slots)), check
    return make


LAUNCHES["paged_write-65536-tokens"] = Launch(((PA, "_write_kv_kernel"),), _write_kv(PAST))   # (N,): axis 0
# the batch-invariant mode: (1, B·Hq, S) as above, then the ordered merge's rows (B·Hq) on axis 0
LAUNCHES["split_kv_invariant-65536-heads"] = Launch(
    ((FD, "_split_kv_kernel"), ("inference_conformance.optimized.attention.batch_invariant", "ordered_merge_kernel")),
    _attention("flash_decoding", 4096, 16, 16, 2, batch_invariant=True))


def _tree_attention(B: int):
    """B sequences, one query head, a one-node tree after a one-token prefix: B programs."""
    def make(device, real):
        from inference_conformance.optimized.tree_attention.fused import tree_attention

        g = torch.Generator().manual_seed(0)
        q = torch.randn(B, 1, 1, 1, generator=g, dtype=torch.float64)
        k = torch.randn(B, 1, 2, 1, generator=g, dtype=torch.float64)
        v = torch.randn(B, 1, 2, 1, generator=g, dtype=torch.float64)
        args = [t.to(device, torch.float32) for t in (q, k, v)]
        parents = torch.tensor([-1], device=device)
        lens = torch.ones(B, dtype=torch.int64, device=device)

        def check(out):
            w = torch.softmax((q[:, 0, 0] * k[:, 0, :, 0]), -1)              # (B, 2): the prefix key, itself
            out_ref = (w * v[:, 0, :, 0]).sum(-1)
            assert_close(out[:, 0, 0, 0], out_ref.to(device), what=f"tree_attention over {B} sequences")
        return (lambda: tree_attention(*args, parents, lens, scale=1.0)), check
    return make


LAUNCHES["tree_attention-65536-sequences"] = Launch((("inference_conformance.optimized.tree_attention.fused", "tree_attention_kernel"),),
                                                    _tree_attention(PAST))   # (B * Hq,): axis 0


def _paged_prefill(B: int):
    """B sequences of one cached token each, one query token each (the mixed batch's decode rows),
    one head, block size 16, no key split: B tiles, B programs; each output is its token's value."""
    def make(device, real):
        from inference_conformance.optimized.paged_attention.prefill import paged_prefill

        g = torch.Generator().manual_seed(0)
        kc = torch.randn(B, 16, 1, 1, generator=g).to(device)
        vc = torch.randn(B, 16, 1, 1, generator=g).to(device)
        q = torch.randn(B, 1, 1, generator=g).to(device)
        table = torch.randperm(B, generator=g).to(torch.int32).reshape(B, 1).to(device)
        lens = torch.ones(B, dtype=torch.int32, device=device)
        starts = torch.arange(B + 1, dtype=torch.int32, device=device)

        def check(out):
            assert_close(out[:, 0, 0], vc[table[:, 0].long(), 0, 0, 0], what=f"paged_prefill over {B} sequences")
        return (lambda: paged_prefill(q, kc, vc, table, lens, starts, scale=1.0, num_splits=1)), check
    return make


LAUNCHES["paged_prefill-65536-sequences"] = Launch((("inference_conformance.optimized.paged_attention.prefill", "_paged_prefill_kernel"),),
                                                   _paged_prefill(PAST))   # (S * tiles * Hkv,): axis 0


def _mla_decode(B: int):
    """B sequences of one cached token each, one query head, C = 1, R = 2, a contiguous cache, one
    split: B programs, then the merge; each output is its token's latent."""
    def make(device, real):
        from inference_conformance.optimized.mla_decode.split_kv import mla_decode

        g = torch.Generator().manual_seed(0)
        q_nope, q_rope, w_uk, cache = (torch.randn(*s, generator=g).to(device)
                                       for s in ((B, 1, 1), (B, 1, 2), (1, 1, 1), (B, 1, 3)))
        lens = torch.ones(B, dtype=torch.int32, device=device)

        def check(out):
            assert_close(out[:, 0, 0], cache[:, 0, 0], what=f"mla_decode over {B} sequences")
        return (lambda: mla_decode(q_nope, q_rope, w_uk, cache, None, lens, scale=1.0, rope_theta=10000.0,
                                   num_splits=1)), check
    return make


LAUNCHES["mla_decode-65536-sequences"] = Launch((("inference_conformance.optimized.mla_decode.split_kv", "mla_split_kernel"),
                                                 MERGE), _mla_decode(PAST))   # (S * head tiles * B,): axis 0


def _record(monkeypatch, launch: Launch, device: str, run: bool):
    grids = []
    for mod_name, name in launch.kernels:
        mod = importlib.import_module(mod_name)
        monkeypatch.setattr(mod, name, GridRecorder(name, getattr(mod, name), grids, run))
    call, check = launch.make(device, run)
    return grids, call, check


@pytest.mark.parametrize("name", list(LAUNCHES))
def test_triton_grids_stay_within_cuda_limits(monkeypatch, device, name):
    """The grid of every launch of the wrapper stays within CUDA's limits (nothing launched)."""
    grids, call, _ = _record(monkeypatch, LAUNCHES[name], device, run=False)
    call()
    launched = {n for n, _ in grids}
    assert launched == {n for _, n in LAUNCHES[name].kernels}, f"{name}: launched {launched}"
    for kernel, grid in grids:
        assert 1 <= len(grid) <= 3, f"{kernel}: grid {grid}"
        assert grid[0] <= MAX_X and all(g <= MAX_YZ for g in grid[1:]), (
            f"{kernel}: grid {grid} past CUDA's limits ({MAX_X} on axis 0, {MAX_YZ} on axes 1 and 2)")


@pytest.mark.gpu
@pytest.mark.parametrize("name", [n for n, launch in LAUNCHES.items() if launch.launchable])
def test_triton_launch_past_65535_programs(monkeypatch, device, name):
    """The same shapes launched on CUDA, each output against a reference."""
    grids, call, check = _record(monkeypatch, LAUNCHES[name], device, run=True)
    out = call()
    torch.cuda.synchronize()
    check(out)
    assert {n for n, _ in grids} == {n for _, n in LAUNCHES[name].kernels}, f"{name}: launched {grids}"


def test_every_triton_kernel_has_a_grid_check():
    """Every ``@triton.jit`` ``*_kernel`` of optimized/ is launched by some entry of LAUNCHES, and
    no kernel reads program_id(1) or program_id(2) (its grid would have a second axis)."""
    import re

    from inference_conformance.optimized.triton_shared import kernel_modules

    checked = {id(getattr(importlib.import_module(m), n)) for launch in LAUNCHES.values() for m, n in launch.kernels}
    for mod in kernel_modules():
        src = open(mod.__file__, encoding="utf-8").read()
        assert not re.search(r"program_id\((1|2|axis=[12])\)", src), f"{mod.__name__} reads a second grid axis"
        for name in re.findall(r"@triton\.jit\s*\n\s*def (\w+_kernel)\(", src):
            assert id(getattr(mod, name)) in checked, f"{mod.__name__}.{name} has no entry in LAUNCHES"

