"""Shared Hypothesis strategies: odd sizes, dtypes, seeds, and tensors built from a drawn seed;
and :class:`KernelLaunchCapture`, which records a Triton kernel's launch arguments.

Tensors are never drawn element by element (slow, and shrinks badly); a strategy draws a seed
and the test builds the tensor with :func:`randn` from a private ``torch.Generator``, never the
global RNG, so a failing example is reproduced exactly by its seed.
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st

#: Head dims the field's kernels get wrong: non powers of two, 1, odd, just past a tile.
ODD_HEAD_DIMS = (1, 2, 8, 16, 59, 64, 72, 80, 111, 128, 136)
#: Lengths around tiles (16, 32, 64) and primes.
ODD_LENGTHS = (1, 2, 3, 7, 15, 16, 17, 31, 33, 63, 64, 65, 113, 127, 129, 203, 239)

FLOAT_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)

seeds = st.integers(min_value=0, max_value=2**31 - 1)


def dtypes(allowed=FLOAT_DTYPES) -> st.SearchStrategy[torch.dtype]:
    return st.sampled_from(list(allowed))


def lengths(max_len: int = 239, min_len: int = 1) -> st.SearchStrategy[int]:
    """Sequence lengths: odd sizes near tiles, plus any integer in range."""
    odd = [n for n in ODD_LENGTHS if min_len <= n <= max_len]
    return st.one_of(st.sampled_from(odd), st.integers(min_len, max_len)) if odd else st.integers(min_len, max_len)


def head_dims(max_dim: int = 136) -> st.SearchStrategy[int]:
    return st.sampled_from([d for d in ODD_HEAD_DIMS if d <= max_dim])


@st.composite
def gqa_heads(draw, max_kv: int = 3, max_group: int = 3):
    """(n_heads, n_kv_heads) with n_kv_heads | n_heads, group ratios not only powers of two."""
    kv = draw(st.integers(1, max_kv))
    group = draw(st.integers(1, max_group))
    return kv * group, kv


def generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def randn(shape, seed: int, *, dtype=torch.float64, device="cpu", scale: float = 1.0) -> torch.Tensor:
    """N(0, scale^2) tensor from ``seed`` (drawn in float64 on CPU, then cast and moved, so the
    same seed gives the same values on every device and dtype)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tuple(shape), generator=g, dtype=torch.float64) * scale
    return x.to(device=device, dtype=dtype)


def randint(low: int, high: int, shape, seed: int, device="cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, tuple(shape), generator=g).to(device)


class KernelLaunchCapture:
    """Stands in for a Triton kernel (``kernel[grid](*args)``): records the arguments of every
    launch into the list ``seen``, then launches. Set it on the kernel's module with
    ``monkeypatch.setattr(module, name, KernelLaunchCapture(getattr(module, name), seen))``."""

    def __init__(self, kernel, seen: list):
        self.kernel, self.seen = kernel, seen

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.seen.extend(list(args) + list(kwargs.values()))
            return self.kernel[grid](*args, **kwargs)
        return launch
