"""Paged calls with the attention contract's options (claim FA-8: ``window``, ``softcap``,
``sinks``) for the laws of ``laws/options.py``: the options of a call, the sinks of a case, dense
attention with the options over each sequence's contiguous K/V, what a call's options reach (its
coverage profile), the call (an option the implementation lacks is a refusal) and the check.
"""
from __future__ import annotations

import dataclasses
import inspect

import torch

from inference_conformance.conformance.contracts.attention import accepts_options, window_mask
from inference_conformance.conformance.laws import refusal
from inference_conformance.conformance.tolerance import assert_close
from inference_conformance.properties import strategies
from inference_conformance.reference import attention as ref


@dataclasses.dataclass(frozen=True)
class Options:
    """FA-8's options of a call: ``sinks`` None, "mixed" (N(0, 2²) per head) or "dominant" (3 to
    5 above the largest logit any row of the head sees)."""

    window: int | None = None
    softcap: float | None = None
    sinks: str | None = None


def _rows(q, loc, b):
    """Sequence b's query rows as (1, Hq, r, D)."""
    return q[loc[b]:loc[b + 1]].transpose(0, 1)[None]


def _dense(q, k, v, loc, opts: Options, sinks, scale, dtype):
    """Dense attention of each sequence's query rows (the last of its tokens) over its contiguous
    K/V with the options, (N, Hq, D)."""
    kw = dict(window=opts.window, softcap=opts.softcap, sinks=sinks)
    return torch.cat([ref.attention_naive(_rows(q, loc, b), k[b], v[b], causal=True, scale=scale, dtype=dtype,
                                          **kw)[0].transpose(0, 1) for b in range(len(k))])


def make_sinks(opts: Options, q, k, loc, scale, seed):
    """The (Hq,) sinks of ``opts`` (float64 for float64 q, else float32; None without sinks)."""
    if opts.sinks is None:
        return None
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    noise = strategies.randn((q.shape[1],), seed + 3)
    if opts.sinks == "mixed":
        return (2 * noise).to(q.device, dt)
    top = torch.full((q.shape[1],), -torch.inf, dtype=torch.float64)
    for b in range(len(k)):
        qb, kb = _rows(q, loc, b).double(), k[b].double()
        s = (qb @ kb.repeat_interleave(qb.shape[1] // kb.shape[1], dim=1).transpose(-1, -2)) * scale
        if opts.softcap is not None:
            s = opts.softcap * torch.tanh(s / opts.softcap)
        top = torch.maximum(top, s.amax(dim=(0, 2, 3)).cpu())
    return (top + 4 + noise.clamp(-1, 1)).to(q.device, dt)


def options_profile(q, k, loc, opts: Options, sinks, scale, block_size) -> dict:
    """One call as the contract's "FA-8 paged" classes see it: the sequences' lengths and query
    tokens, heads, block size, options, ``max_logit`` (largest uncapped |logit| a query sees) and
    ``sink_margin`` (smallest, over heads, of the sink minus the head's largest capped visible logit)."""
    top, head_top = 0.0, torch.full((q.shape[1],), -torch.inf, dtype=torch.float64)
    for b in range(len(k)):
        qb, kb = _rows(q, loc, b).double(), k[b].double()
        s = (qb @ kb.repeat_interleave(qb.shape[1] // kb.shape[1], dim=1).transpose(-1, -2)) * scale
        hidden = ~window_mask(s.shape[-2], s.shape[-1], opts.window, s.device)
        top = max(top, float(s.masked_fill(hidden, 0).abs().max()))
        capped = opts.softcap * torch.tanh(s / opts.softcap) if opts.softcap is not None else s
        head_top = torch.maximum(head_top, capped.masked_fill(hidden, -torch.inf).amax(dim=(0, 2, 3)).cpu())
    return dict(lens=tuple(kb.shape[2] for kb in k), qlens=tuple(loc[b + 1] - loc[b] for b in range(len(k))),
                Hq=q.shape[1], Hkv=k[0].shape[1], block_size=block_size, window=opts.window,
                softcap=opts.softcap, sinks=opts.sinks, max_logit=top,
                sink_margin=-1.0 if sinks is None else float((sinks.double().cpu() - head_top).min()))


def call_with_options(run, fn, args, scale, opts: Options, sinks, what):
    """``fn(*args)`` with the options (and 3 splits where it takes ``num_splits``); an option it
    lacks is a refusal."""
    kw = {k: v for k, v in dict(window=opts.window, softcap=opts.softcap, sinks=sinks).items() if v is not None}
    name = run.impl.name
    with refusal(run, f"{name} refuses {sorted(kw)} in {what}"):
        lacking = sorted(set(kw) - accepts_options(fn))
        if lacking:
            raise NotImplementedError(f"{name}'s {what} takes no {', '.join(lacking)} keyword")
        try:
            takes_splits = "num_splits" in inspect.signature(fn).parameters
        except (TypeError, ValueError):
            takes_splits = False
        return fn(*args, scale=scale, **kw, **({"num_splits": 3} if takes_splits else {}))


def check_with_options(out, q, k, v, loc, opts, sinks, scale, what):
    """``out`` equals dense attention with the options (float64 reference; the 16-bit rule for
    16-bit inputs)."""
    assert isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == q.dtype, (type(out), out.shape)
    out_ref = _dense(q, k, v, loc, opts, sinks, scale, torch.float64)
    out_pt = _dense(q, k, v, loc, opts, sinks, scale, None) if q.dtype in (torch.float16, torch.bfloat16) else None
    assert_close(out, out_ref, out_pt=out_pt, what=f"{what} with {opts}")
