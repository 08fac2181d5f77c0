"""Known-bad quantization implementations (the bug zoo): each is a classic weight-quantization bug,
and a law of ``properties/quantization/test_quantization.py`` must reject every one (QT-1 for the
quantize/dequantize bugs, QT-9 for the one that only the fused product gets wrong; the act-order
law for the one that ignores ``g_idx``). At the end, the kernels' own bugs
(``properties/quantization/test_quant_kernels.py``): the Triton decode launch reading every row as the first
token (QT-9 at 1 < M <= 16), the Triton kernels reading group k // g despite a g_idx (the
act-order QT-9 law, ``properties/quantization/test_quantization.py``), and :data:`W8A8_ZOO`, W8A8 products with a float16 accumulator,
per-token scales applied per column, or a truncating activation quantizer. FP8 and KV-cache
formats (QT-11, QT-12, ``properties/quantization/test_quantization_fp8.py``, ``properties/quantization/test_quantization_kv.py``): an FP8
scheme rounding to
E5M2's grid while naming E4M3, one rounding w / s through float16 first (the casts' own zoo is
the ``fp8_cast`` contract's, ``properties/fp8_cast/zoo.py``); the KV-cache formats' zoo is the ``kv_format`` contract's
(``properties/kv_format/zoo.py``). FP4 blocks
(QT-13): ``properties/quantization/zoo_fp4.py`` (a ceil scale exponent, nibbles swapped, ties away).

All follow the ``quantization`` contract and store float64 scales, so that only the bug (not
rounding) makes them wrong. The packed layout is the one of ``optimized/quantization/__init__.py``.
"""
from __future__ import annotations

import dataclasses

import torch

from inference_conformance.conformance.contracts.quantization import levels, validate_matmul, validate_quantize
from inference_conformance.optimized import quantization as quant_torch
from inference_conformance.optimized.quantization import packing as quant_pack
from inference_conformance.reference.quantization import codes_per_byte


def _swap_order(u: torch.Tensor, bits: int, L: int) -> torch.Tensor:
    """Reverse the codes within each byte's run (high bits read first), (R, L) -> (R, L)."""
    per = codes_per_byte(bits)
    R = u.shape[0]
    full = torch.nn.functional.pad(u, (0, (-L) % per)).reshape(R, -1, per).flip(-1).reshape(R, -1)
    return full[:, :L]


# ------------------------------------------------------------------ act-order (g_idx) entries
class _IgnoresGIdx:
    """Quantizes by the act-order groups of ``g_idx`` (as a GPTQ checkpoint stores them), but
    dequantize and matmul read column k's scale and zero point from group k // group_size, as
    a kernel written for plain groups does."""

    name = "g_idx_ignored"
    symmetric = True

    def quantize(self, w, *, bits, granularity, g_idx=None):
        return quant_torch.quantize(w, bits=bits, granularity=granularity, g_idx=g_idx)

    def dequantize(self, qw):
        qw = quant_torch.check_packed(qw)
        return quant_torch.dequantize(dataclasses.replace(qw, g_idx=None))

    def matmul(self, x, qw):
        return quant_torch.OPS.matmul(x, dataclasses.replace(quant_torch.check_packed(qw), g_idx=None))


g_idx_ignored = _IgnoresGIdx()


# -------------------------------------------------------------------------- scheme entries
class _Bad:
    """A quantizer with one bug switched on (see each instance's docstring below)."""

    def __init__(self, name: str, doc: str, *, symmetric: bool = True, floor: bool = False,
                 pow2_scale: bool = False, wrong_groups: bool = False, swap_in_matmul: bool = False,
                 zero_minus_one: bool = False, zeros_interleave: bool = False):
        self.name, self.__doc__ = name, doc
        self.symmetric = symmetric
        self.floor, self.pow2_scale, self.wrong_groups = floor, pow2_scale, wrong_groups
        self.swap_in_matmul, self.zero_minus_one, self.zeros_interleave = swap_in_matmul, zero_minus_one, zeros_interleave

    def quantize(self, w, *, bits, granularity):
        shape = validate_quantize(w, bits, granularity)
        N, K, b, g = shape.N, shape.K, shape.bits, shape.group_size
        grp = w.double().reshape(1, 1, N * K) if granularity == "tensor" else w.double().reshape(N, K // g, g)
        if self.symmetric:
            s = grp.abs().amax(dim=-1) / (2 ** (b - 1) if self.pow2_scale else levels(b, True))
            z = torch.full_like(s, 2 ** (b - 1))
            lo, hi = 1, 2 ** b - 1
        else:
            lo_w, hi_w = grp.amin(dim=-1).clamp(max=0), grp.amax(dim=-1).clamp(min=0)
            s = (hi_w - lo_w) / levels(b, False)
            z = torch.where(s > 0, torch.round(-lo_w / torch.where(s > 0, s, 1.0)), 0.0).clamp(0, 2 ** b - 1)
            lo, hi = 0, 2 ** b - 1
        rnd = torch.floor if self.floor else torch.round
        safe = torch.where(s > 0, s, 1.0)[..., None]
        u = torch.where(s[..., None] > 0, (rnd(grp / safe) + z[..., None]).clamp(lo, hi), z[..., None])
        stored = (z - 1) % 256 if self.zero_minus_one else z          # a checkpoint's z - 1, read as z
        stored = stored.to(torch.int32)
        if self.zeros_interleave:          # packed low-first, repacked for the kernel high-first
            stored = _swap_order(stored, b, stored.shape[1])
        return quant_torch.PackedWeight(quant_pack.pack(u.reshape(N, K).to(torch.int32), b), s,
                                        stored.to(torch.uint8), b, g, granularity, N, K, w.dtype, self.symmetric)

    def _dequantize64(self, qw, swap: bool = False) -> torch.Tensor:
        u = quant_pack.unpack(qw.codes, qw.bits, qw.K)
        if swap:
            u = _swap_order(u, qw.bits, qw.K)
        s, z = qw.scales, qw.zeros.to(torch.int32)
        if self.wrong_groups:              # (N, groups) read as if stored (groups, N)
            s = s.t().contiguous().reshape(s.shape)
        if qw.granularity == "tensor":
            s, z = s.expand(qw.N, qw.K), z.expand(qw.N, qw.K)
        else:
            s, z = s.repeat_interleave(qw.group_size, dim=1), z.repeat_interleave(qw.group_size, dim=1)
        return (u - z).double() * s

    def dequantize(self, qw):
        return self._dequantize64(quant_torch.check_packed(qw)).to(qw.dtype)

    def matmul(self, x, qw):
        qw = quant_torch.check_packed(qw)
        validate_matmul(x, K=qw.K, dtype=qw.dtype, device=qw.codes.device)
        return (x.double() @ self._dequantize64(qw, swap=self.swap_in_matmul).T).to(x.dtype)


floor_not_round = _Bad("floor_not_round", "q = floor(w / s) instead of round: errors up to a whole step.",
                       floor=True)
scale_pow2_clamped = _Bad("scale_pow2_clamped", "s = max|w| / 2^(b-1) with q clamped to ±(2^(b-1) - 1): "
                          "the largest weight is clipped by a whole step s.", pow2_scale=True)
scales_wrong_groups = _Bad("scales_wrong_groups", "the (N, groups) scales read as if stored (groups, N): "
                           "each group gets another group's scale.", wrong_groups=True)
nibbles_swapped_in_matmul = _Bad("nibbles_swapped_in_matmul", "quantize packs the first code in the low bits, "
                                 "the fused matmul reads it from the high bits (dequantize is right).",
                                 swap_in_matmul=True)
zero_point_off_by_one = _Bad("zero_point_off_by_one", "zero points stored as z - 1 (a checkpoint format's "
                             "convention) and read as z: every value shifts by one step.",
                             symmetric=False, zero_minus_one=True)
zero_points_wrong_interleave = _Bad("zero_points_wrong_interleave", "zero points packed two per byte low "
                                    "first and unpacked high first: neighbouring groups swap zero points.",
                                    symmetric=False, zeros_interleave=True)


# ----------------------------------------------------------- the kernels' bugs (test_quant_kernels.py)
class _BadTritonLaunch:
    """The Triton scheme (quantize and dequantize right, ``g_idx`` included) whose matmul calls
    the kernels wrongly; subclasses say how in :meth:`launch`."""

    symmetric = True

    def quantize(self, w, *, bits, granularity, g_idx=None):
        return quant_torch.TRITON_SYMMETRIC.quantize(w, bits=bits, granularity=granularity, g_idx=g_idx)

    def dequantize(self, qw):
        return quant_torch.dequantize(qw)

    def matmul(self, x, qw):
        from inference_conformance.optimized.quantization import quant_matmul

        qw = quant_torch.check_packed(qw)
        M = validate_matmul(x, K=qw.K, dtype=qw.dtype, device=qw.codes.device)
        x, g_idx = self.launch(x, qw, M, quant_matmul.GEMV_MAX_M)
        return quant_matmul.quant_matmul(x, qw.codes, qw.scales, qw.zeros, bits=qw.bits,
                                         group_size=qw.group_size, N=qw.N, K=qw.K, g_idx=g_idx)


class _DecodeRowsReadFirstToken(_BadTritonLaunch):
    """The Triton scheme whose decode launch (M <= GEMV_MAX_M) reads x with row stride 0, as a
    GEMV kernel written for one token does: every row gets the first row's product. M = 1 and
    the tiled launch (M > GEMV_MAX_M) are right."""

    def launch(self, x, qw, M, gemv_max_m):
        return (x[:1].expand(M, qw.K) if M <= gemv_max_m else x), qw.g_idx


class _KernelIgnoresGIdx(_BadTritonLaunch):
    """The Triton scheme whose kernels read column k's scale and zero point from group
    k // group_size even when the weight has an act-order g_idx (HAS_G_IDX off), as a kernel
    written for plain groups does; quantize and dequantize honour g_idx, so only the product
    (the act-order QT-9 law) shows it."""

    name = "triton_kernel_ignores_g_idx"

    def launch(self, x, qw, M, gemv_max_m):
        return x, None


decode_rows_read_first_token = _DecodeRowsReadFirstToken()
triton_kernel_ignores_g_idx = _KernelIgnoresGIdx()


class _BadW8A8:
    """A W8A8 product (``quantize_activations``, ``quantize_weight``, ``w8a8_matmul`` as in
    ``optimized/quantization/w8a8_matmul.py``, computed in PyTorch) with one bug switched on."""

    def __init__(self, name: str, doc: str, *, fp16_accumulator: bool = False, scale_per_column: bool = False,
                 truncate: bool = False):
        self.name, self.__doc__ = name, doc
        self.fp16_accumulator, self.scale_per_column, self.truncate = fp16_accumulator, scale_per_column, truncate

    def quantize_activations(self, x):
        from inference_conformance.optimized.quantization import w8a8_matmul as w8

        if not self.truncate:
            return w8.quantize_activations(x)
        x64 = x.double()
        amax = x64.abs().amax(dim=-1, keepdim=True)
        s = torch.where(amax > 0, amax / w8.QMAX, torch.ones_like(amax))
        return torch.trunc(x64 / s).clamp(-w8.QMAX, w8.QMAX).to(torch.int8), s[:, 0].float()

    def quantize_weight(self, w):
        from inference_conformance.optimized.quantization import w8a8_matmul as w8

        return w8.quantize_weight(w)

    def w8a8_matmul(self, x_q, x_scales, w_q, w_scales, *, out_dtype=torch.float32):
        from inference_conformance.optimized.quantization import w8a8_matmul as w8

        M, N, K = w8.validate(x_q, x_scales, w_q, w_scales, out_dtype)
        if self.fp16_accumulator:              # acc += (tile product) in float16, tile by tile
            acc = torch.zeros(M, N, dtype=torch.float16, device=x_q.device)
            for k0 in range(0, K, 64):
                acc += (x_q[:, k0:k0 + 64].double() @ w_q[:, k0:k0 + 64].double().T).half()
            acc = acc.double().nan_to_num(posinf=2.0 ** 31 - 1, neginf=-2.0 ** 31).clamp(-2.0 ** 31, 2.0 ** 31 - 1)
        else:
            acc = x_q.double() @ w_q.double().T
        acc = acc.to(torch.int32)
        if out_dtype == torch.int32:
            return acc
        xs = x_scales[:, None]
        if self.scale_per_column:              # the kernel's epilogue loads x_scales at offs_n (masked < M)
            xs = torch.zeros(1, N, dtype=torch.float32, device=x_q.device)
            xs[0, :min(M, N)] = x_scales[:min(M, N)]
        return (acc.float() * xs * w_scales[None, :]).to(out_dtype)


W8A8_ZOO = {z.name: z for z in (
    _BadW8A8("w8a8_fp16_accumulator", "accumulates the int8 products in float16: integers above 2048 "
             "round, sums above 65504 overflow.", fp16_accumulator=True),
    _BadW8A8("w8a8_token_scale_per_column", "the epilogue reads the per-token scales by column "
             "(x_scales[n] instead of x_scales[m]).", scale_per_column=True),
    _BadW8A8("w8a8_truncating_quantizer", "quantizes activations with trunc(x / s) instead of round: "
             "codes off by up to one step, biased toward zero.", truncate=True),
)}


class _FinerGroups:
    """Scales over groups of 8 columns whenever 8 divides the requested group (per tensor and
    per channel included): each element is within half a step of its (finer) group, so only the
    number of levels per requested group shows the wrong layout (a checkpoint measured with it
    reports the memory and the error of a granularity it did not use)."""

    symmetric = True

    def quantize(self, w, *, bits, granularity):
        shape = validate_quantize(w, bits, granularity)
        fine = 8 if shape.group_size % 8 == 0 and shape.group_size > 8 else granularity
        return quant_torch.quantize(w, bits=bits, granularity=fine)

    def dequantize(self, qw):
        return quant_torch.dequantize(qw)

    def matmul(self, x, qw):
        return quant_torch.OPS.matmul(x, qw)


finer_groups = _FinerGroups()


def implementations():
    """The known-bad quantization implementations (the bug zoo): each law's ``kills`` names those it
    must reject."""
    from inference_conformance.conformance.registry import known_bad
    from inference_conformance.properties.quantization import zoo_fp4, zoo_fp8

    return (
        known_bad("quantization", "g_idx_ignored", g_idx_ignored),
        known_bad("quantization", "finer_groups", finer_groups),
        known_bad("quantization", "triton_kernel_ignores_g_idx", triton_kernel_ignores_g_idx),
        known_bad("quantization", "floor_not_round", floor_not_round),
        known_bad("quantization", "scale_pow2_clamped", scale_pow2_clamped),
        known_bad("quantization", "scales_wrong_groups", scales_wrong_groups),
        known_bad("quantization", "nibbles_swapped_in_matmul", nibbles_swapped_in_matmul),
        known_bad("quantization", "zero_point_off_by_one", zero_point_off_by_one),
        known_bad("quantization", "zero_points_wrong_interleave", zero_points_wrong_interleave),
        known_bad("quantization", "decode_rows_read_first_token", decode_rows_read_first_token),
        known_bad("quantization", "fp8_e5m2_grid_as_e4m3_scheme", zoo_fp8.fp8_e5m2_grid_as_e4m3_scheme),
        known_bad("quantization", "fp8_double_rounding_scheme", zoo_fp8.fp8_double_rounding_scheme),
        # the FP4 entries (QT-13), named here so that the static catalog (inference-conformance list) sees them
        known_bad("quantization", "mxfp4_scale_exponent_ceil", zoo_fp4.mxfp4_scale_exponent_ceil),
        known_bad("quantization", "mxfp4_nibbles_swapped", zoo_fp4.mxfp4_nibbles_swapped),
        known_bad("quantization", "nvfp4_ties_away_from_zero", zoo_fp4.nvfp4_ties_away_from_zero),
        known_bad("quantization", "nvfp4_bf16_weights_in_float32", zoo_fp4.nvfp4_bf16_weights_in_float32),
        known_bad("quantization", "nvfp4_bf16_scales_in_float32", zoo_fp4.nvfp4_bf16_scales_in_float32),
    )
