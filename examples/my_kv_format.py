"""A worked outside implementation of the ``kv_format`` contract, written from its docs page
(docs/kv_format.md) without the suite's code except its argument checks and the format's token
count: plain PyTorch, a dict of tensors as the stored cache (int8 codes, FP8 codes in torch's
8-bit dtypes, int4 codes two per byte, float64 scales, the residual tokens as given).
``my_kv_format`` conforms; ``wrong_kv_format`` takes one scale per token over all its heads
("per-head scales applied per token"), a bug QT-12's value law rejects where one head is louder
than the others.

    PYTHONPATH=examples pytest properties --impl kv_format=my_kv_format:my_kv_format
"""
from __future__ import annotations

import torch

from inference_conformance.conformance.contracts.kv_format import kv_quantized_tokens, validate

_FP8 = {"fp8_e4m3fn": (448.0, torch.float8_e4m3fn), "fp8_e5m2": (57344.0, torch.float8_e5m2)}


class MyKVFormat:
    def __init__(self, shared_heads: bool = False):
        self.shared_heads = shared_heads

    def quantize_kv(self, k, v, *, format):
        B, H, T, D = validate(k, v, format)
        Tq = kv_quantized_tokens(T, format)
        stored = {"format": format, "dtype": k.dtype, "D": D}
        for name, x in (("k", k), ("v", v)):
            x64 = x.detach().to(torch.float64)[:, :, :Tq]
            if format.kind == "int4_kivi" and name == "k":          # per channel over groups of G tokens
                amax = x64.reshape(B, H, Tq // format.group, format.group, D).abs().amax(dim=3)
                full = amax.repeat_interleave(format.group, dim=2)
            else:                                                  # per token and head
                amax = x64.abs().amax(dim=-1, keepdim=True)
                if self.shared_heads:
                    amax = amax.amax(dim=1, keepdim=True).expand(B, H, Tq, 1)
                full = amax
            top = _FP8[format.kind][0] if format.kind in _FP8 else (127.0 if format.kind == "int8" else 7.0)
            s, s_full = amax / top, full / top
            y = torch.where(s_full > 0, x64 / torch.where(s_full > 0, s_full, 1.0), 0.0)
            if format.kind in _FP8:
                codes = y.to(_FP8[format.kind][1])
            else:
                codes = torch.round(y).clamp(-top, top).to(torch.int8)
                if format.kind == "int4_kivi":                     # u = q + 8, two per byte, low nibble first
                    u = torch.nn.functional.pad(codes.to(torch.int32) + 8, (0, D % 2))
                    codes = (u[..., 0::2] | (u[..., 1::2] << 4)).to(torch.uint8)
            stored[name] = {"codes": codes, "scale": s.contiguous(), "rest": x[:, :, Tq:].clone()}
        return stored

    def dequantize_kv(self, stored):
        fmt, D = stored["format"], stored["D"]
        out = []
        for name in ("k", "v"):
            part = stored[name]
            codes = part["codes"]
            if fmt.kind == "int4_kivi":
                c = codes.to(torch.int32)
                codes = (torch.stack([c & 15, c >> 4], dim=-1).flatten(-2)[..., :D] - 8)
            s = part["scale"]
            if fmt.kind == "int4_kivi" and name == "k":
                s = s.repeat_interleave(fmt.group, dim=2)
            x = (codes.to(torch.float64) * s).to(stored["dtype"])
            out.append(torch.cat([x, part["rest"]], dim=2))
        return out[0], out[1]


my_kv_format = MyKVFormat()
wrong_kv_format = MyKVFormat(shared_heads=True)
