"""FA-8 in the paged kernels: the attention contract's options (``window``, ``softcap``,
``sinks``) through ``paged_attention`` (decode, every query at its sequence's last position) and
``paged_prefill`` (the mixed batch, each chunk's query at its position after the cached prefix)
equal dense float64 attention with the same options over the contiguous K/V the pages were cut
from. An implementation whose function lacks an option's keyword refuses it ("unsupported",
never a pass). Pinned cases only (they run in every profile), which reach the contract's
"FA-8 paged: ..." coverage classes, the dense FA-8 classes on paged calls (each law requires
them): a window of one key, shorter than a block, crossing several blocks, hiding whole blocks,
at least a sequence's length; caps below the largest logit and with a window; sinks with GQA,
mixed and dominant, with several splits (the merge counts them once). Zoo: sinks dropped in the
paged merge, a window of one key read as no window, a chunk's window measured from the chunk's start.
"""
from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from hypothesis import note
from hypothesis import strategies as st

from inference_conformance.conformance.contracts.attention import accepts_options, window_mask
from inference_conformance.conformance.contracts.paged_attention import COVERAGE
from inference_conformance.conformance.laws import Kills, Law, refusal
from inference_conformance.conformance.tolerance import assert_close
from inference_conformance.properties import strategies as S
from inference_conformance.properties.paged_attention.cases import (
    PagedCase,
    PrefillCase,
    make_inputs,
    make_prefill_inputs,
)
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
    noise = S.randn((q.shape[1],), seed + 3)
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


def _call(run, fn, args, scale, opts: Options, sinks, what):
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


def _check(out, q, k, v, loc, opts, sinks, scale, what):
    assert isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == q.dtype, (type(out), out.shape)
    out_ref = _dense(q, k, v, loc, opts, sinks, scale, torch.float64)
    out_pt = _dense(q, k, v, loc, opts, sinks, scale, None) if q.dtype in (torch.float16, torch.bfloat16) else None
    assert_close(out, out_ref, out_pt=out_pt, what=f"{what} with {opts}")


def law_paged_options_match_dense(run, device, dtype, case, opts, seed):
    """FA-8 (decode): ``paged_attention`` with the options equals dense float64 attention of each
    sequence's last token over its contiguous K/V with the same options."""
    note(f"{case}, {opts}")
    inp = make_inputs(case, seed, dtype, device)
    loc = list(range(case.B + 1))
    sinks = make_sinks(opts, inp.q, inp.k, loc, case.scale, seed)
    run.observe(options_profile(inp.q, inp.k, loc, opts, sinks, case.scale, case.block_size))
    out = _call(run, run.impl.paged_attention, inp.args(), case.scale, opts, sinks, "paged_attention")
    _check(out, inp.q, inp.k, inp.v, loc, opts, sinks, case.scale, "paged decode")


def law_prefill_options_match_dense(run, device, dtype, case, opts, seed):
    """FA-8 (mixed batch): ``paged_prefill`` with the options equals dense float64 causal attention
    of each chunk over its sequence's contiguous K/V with the same options."""
    note(f"{case}, {opts}")
    inp = make_prefill_inputs(case, seed, dtype, device)
    loc = inp.query_start_loc.tolist()
    sinks = make_sinks(opts, inp.q, inp.k, loc, case.scale, seed)
    run.observe(options_profile(inp.q, inp.k, loc, opts, sinks, case.scale, case.block_size))
    out = _call(run, run.impl.paged_prefill, inp.args(), case.scale, opts, sinks, "paged_prefill")
    _check(out, inp.q, inp.k, inp.v, loc, opts, sinks, case.scale, "mixed batch")


#: Decode: a window shorter than a block of 7 (W = 5), one crossing blocks and longer than a short
#: sequence (W = 40 over 130 and 9 tokens), a cap below the largest logit, a window of one key with
#: sinks mixed over GQA, and dominant sinks over 200 tokens in three splits with a window and a cap.
DECODE_PINNED = (
    dict(case=PagedCase((50, 130, 9), 4, 2, 16, 7, 0.25), opts=Options(window=5), seed=1),
    dict(case=PagedCase((130, 9), 2, 1, 16, 16, 0.25), opts=Options(window=40), seed=2),
    dict(case=PagedCase((33, 65), 2, 1, 16, 5, 1.0), opts=Options(softcap=0.5), seed=3),
    dict(case=PagedCase((17, 40), 6, 2, 16, 16, 0.25), opts=Options(window=1, sinks="mixed"), seed=4),
    dict(case=PagedCase((200,), 4, 2, 16, 16, 0.25, magnitude="large", amp=12.0),
         opts=Options(window=70, softcap=20.0, sinks="dominant"), seed=5),
)
#: Mixed batch: chunks after cached prefixes with a decode token between them, windows of 1, 13
#: (crossing blocks of 5) and longer than every sequence, a cap, mixed and dominant sinks.
PREFILL_PINNED = (
    dict(case=PrefillCase((60, 9, 100), (20, 1, 30), 4, 2, 16, 5, 0.25), opts=Options(window=13), seed=1),
    dict(case=PrefillCase((40, 30), (16, 1), 2, 1, 16, 16, 0.25), opts=Options(window=1, sinks="mixed"), seed=2),
    dict(case=PrefillCase((60, 9, 100), (20, 1, 30), 4, 2, 16, 5, 0.25),
         opts=Options(window=500, softcap=2.0, sinks="dominant"), seed=3),
)

def _pinned(examples) -> dict:
    """The strategies of a pinned-only law (Hypothesis runs only the examples: ``explicit_only``)."""
    return {name: st.sampled_from([e[name] for e in examples]) for name in ("case", "opts", "seed")}


FA8_PAGED = Law(claim="FA-8", technique="paged_attention", body=law_paged_options_match_dense,
                given=_pinned(DECODE_PINNED), examples=DECODE_PINNED, explicit_only=True, dtypes=(torch.float64, torch.bfloat16),
                kills=(Kills(("paged_sinks_dropped_in_merge", "paged_window_of_one_ignored"), (torch.float64,)),),
                coverage=COVERAGE, require_coverage=True)
FA8_PREFILL = Law(claim="FA-8", technique="paged_attention", body=law_prefill_options_match_dense,
                  given=_pinned(PREFILL_PINNED), examples=PREFILL_PINNED, explicit_only=True, dtypes=(torch.float64, torch.bfloat16),
                  kills=(Kills(("prefill_window_from_chunk_start",), (torch.float64,)),),
                  coverage=COVERAGE, require_coverage=True)

test_fa8_paged_options_match_dense = FA8_PAGED.conformance_test("test_fa8_paged_options_match_dense")
(test_fa8_paged_zoo_rejected,) = FA8_PAGED.make_zoo_tests("test_fa8_paged_zoo_rejected")
test_fa8_prefill_options_match_dense = FA8_PREFILL.conformance_test("test_fa8_prefill_options_match_dense")
(test_fa8_prefill_zoo_rejected,) = FA8_PREFILL.make_zoo_tests("test_fa8_prefill_zoo_rejected")


@pytest.mark.claim("FA-8")
def test_fa8_paged_zoo_entries_are_right_without_the_option():
    """Each paged FA-8 zoo entry equals the reference when its option is off (the bug is the
    option's), and the law's comparison rejects it with the option on."""
    from inference_conformance.properties.paged_attention import zoo
    from inference_conformance.reference import paged_attention as rp

    case, opts = DECODE_PINNED[4]["case"], DECODE_PINNED[4]["opts"]
    inp = make_inputs(case, 5, torch.float64, "cpu")
    assert_close(zoo.paged_sinks_dropped_in_merge(*inp.args(), scale=case.scale),
                 rp.paged_attention(*inp.args(), scale=case.scale), what="sinks off")
    sinks = make_sinks(opts, inp.q, inp.k, list(range(case.B + 1)), case.scale, 5)
    with pytest.raises(AssertionError):
        _check(zoo.paged_sinks_dropped_in_merge(*inp.args(), scale=case.scale, window=opts.window,
                                                softcap=opts.softcap, sinks=sinks),
               inp.q, inp.k, inp.v, list(range(case.B + 1)), opts, sinks, case.scale, "zoo")
    pcase = PREFILL_PINNED[0]["case"]
    pin = make_prefill_inputs(pcase, 1, torch.float64, "cpu")
    assert_close(zoo.prefill_window_from_chunk_start(*pin.args(), scale=pcase.scale),
                 rp.paged_prefill(*pin.args(), scale=pcase.scale), what="window off")


@pytest.mark.claim("FA-8")
@pytest.mark.suite_own("the suite's paged kernel's tile skipping (its internals)")
def test_fa8_paged_decode_never_reads_the_tokens_a_window_hides(device):
    """The Triton decode kernel starts at each sequence's first visible token: NaN values in the
    tokens before the window (which a kernel that read and masked them would multiply by a zero
    weight into NaN) leave the output equal to the dense reference's."""
    pa = pytest.importorskip("inference_conformance.optimized.paged_attention")
    case, opts = PagedCase((130, 70), 2, 1, 16, 16, 0.25), Options(window=40)
    inp = make_inputs(case, 9, torch.float32, device)
    for b, n in enumerate(case.lens):
        for t in range(n - opts.window):                  # token t of sequence b: slot t % 16 of its block
            inp.v_cache[int(inp.block_table[b, t // 16]), t % 16] = float("nan")
    out = pa.paged_attention(*inp.args(), scale=case.scale, window=opts.window, num_splits=3)
    assert not torch.isnan(out).any(), "a token the window hides was read"
    _check(out, inp.q, inp.k, [vb.nan_to_num() for vb in inp.v], list(range(case.B + 1)), opts, None, case.scale,
           "paged decode with NaN before the window")


@pytest.mark.claim("FA-8")
@pytest.mark.suite_own("the paged FA-8 laws' coverage requirement, on the reference and a zoo entry")
def test_fa8_paged_coverage_requirement_sees_a_missing_class():
    """Without its window of one key the decode law misses that class (the requirement fails
    naming it) and passes ``paged_window_of_one_ignored``: the pin is what rejects it."""
    from inference_conformance.conformance import registry

    without = FA8_PAGED.with_examples(tuple(e for e in DECODE_PINNED if e["opts"].window != 1))
    reference = next(i for i in registry.builtins("paged_attention", "cpu") if i.name == "reference")
    run = without(reference, "cpu", torch.float64)
    assert without.missing_classes(run) == ["FA-8 paged: window of one key (W = 1)"], without.missing_classes(run)
    with pytest.raises(AssertionError, match="window of one key"):
        without.check_coverage(run)
    without(next(i for i in registry.zoo("paged_attention") if i.name == "paged_window_of_one_ignored"), "cpu", torch.float64)
