"""Attention calls with the contract's options (claim FA-8: ``window``, ``softcap``, ``sinks``):
the drawn and pinned cases, the sinks of a case, the call (an option the implementation lacks is
a refusal: "unsupported", never a pass), the check against the float64 reference with the same
options; FA-8's law is in ``laws.py``.

The classes the pinned cases reach (``COVERAGE``'s "FA-8: ..." classes): windows shorter than a
key tile (W = 1, 5), crossing tile edges (W = 40, 47, 100 against tiles of 16, 32, 64), longer
than Tk, windows that hide whole key tiles (Tk - W >= 64: the kernels skip them), soft-caps
below the largest logit (the cap reshapes the softmax; tanh is monotone, so no cap moves a
row's argmax key, but one of 0.5 flattens a row the uncapped softmax puts on one key), caps with
a window, and sinks above every row's largest logit (the sink takes most of the mass: a sink
dropped or counted twice moves the output by about its own weight).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from inference_conformance.conformance.contracts.attention import accepts_options, window_mask
from inference_conformance.conformance.laws import Run, refusal
from inference_conformance.conformance.tolerance import assert_close
from inference_conformance.properties import strategies
from inference_conformance.properties.attention.cases import Case, cases, logit_profile
from inference_conformance.reference import attention as ref


@dataclass(frozen=True)
class FCase(Case):
    """An attention call with options: ``window`` (int or None), ``softcap`` (float or None) and
    ``sinks``: None, "mixed" (N(0, 2²) per query head) or "dominant" (each head's sink 3 to 5
    above the largest logit any of its rows sees: the sink takes most of every row's mass)."""

    window: int | None = None
    softcap: float | None = None
    sinks: str | None = None


def make_sinks(case: FCase, q, k, seed: int):
    """The (Hq,) sinks of ``case`` (float64 for float64 q, else float32; None without sinks)."""
    if case.sinks is None:
        return None
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    noise = strategies.randn((case.Hq,), seed + 3)
    if case.sinks == "mixed":
        return (2 * noise).to(q.device, dt)
    s = _scores(q, k, case)                                                   # (B, Hq, Tq, Tk)
    top = s.amax(dim=(0, 2, 3)).cpu()                                         # (Hq,)
    return (top + 4 + noise.clamp(-1, 1)).to(q.device, dt)


def _scores(q, k, case: FCase) -> torch.Tensor:
    """float64 scores after the cap and the mask (-inf where hidden), (B, Hq, Tq, Tk)."""
    group = case.Hq // case.Hkv
    s = (q.double() @ k.double().repeat_interleave(group, dim=1).transpose(-1, -2)) * case.scale
    if case.softcap is not None:
        s = case.softcap * torch.tanh(s / case.softcap)
    if case.causal:
        s = s.masked_fill(~window_mask(case.Tq, case.Tk, case.window, q.device), -math.inf)
    return s


def options(case: FCase, sinks) -> dict:
    """The keyword options of the call (only those the case sets)."""
    kw = {"window": case.window, "softcap": case.softcap, "sinks": sinks}
    return {name: value for name, value in kw.items() if value is not None}


def feature_profile(q, k, case: FCase, sinks, num_splits=None) -> dict:
    """One call as the coverage table's FA-8 classes see it: sizes, mask, scale, dtype, the
    options, the uncapped logits' ``max_logit`` and ``sink_margin`` (the smallest, over heads,
    of the sink minus the largest logit a row of the head sees; -1 without sinks)."""
    margin = -1.0
    if sinks is not None:
        margin = float((sinks.double().cpu() - _scores(q, k, case).amax(dim=(0, 2, 3)).cpu()).min())
    return dict(B=case.B, Hq=case.Hq, Hkv=case.Hkv, Tq=case.Tq, Tk=case.Tk, D=case.D, causal=case.causal,
                scale=float(case.scale), dtype=q.dtype, num_splits=num_splits, window=case.window,
                softcap=case.softcap, sinks=case.sinks, sink_margin=margin,
                max_logit=logit_profile(q, k, case.causal, case.scale)["max_logit"])


def call_options(impl, q, k, v, case: FCase, sinks, *, run: Run | None = None, **kw):
    """Call ``impl`` with the case's options. An option the implementation's ``attention`` does
    not take (:func:`accepts_options`) is a refusal, as a NotImplementedError is: inside a law
    the example is discarded, elsewhere the test is "unsupported"; never a pass."""
    opts = options(case, sinks)
    if run is not None:
        run.observe(feature_profile(q, k, case, sinks, kw.get("num_splits")))
    name = getattr(impl, "name", impl)
    with refusal(run, f"{name} refuses {sorted(opts)} ({q.dtype}, D={case.D})"):
        lacking = sorted(set(opts) - accepts_options(impl))
        if lacking:
            raise NotImplementedError(f"{name}'s attention takes no {', '.join(lacking)} keyword")
        return impl(q, k, v, causal=case.causal, scale=case.scale, **opts, **kw)


def check_options(out, q, k, v, case: FCase, sinks, what: str = "attention output with options"):
    """The tolerance policy: ``out`` against the float64 reference with the same options."""
    assert out.shape == q.shape and out.dtype == q.dtype, (tuple(out.shape), out.dtype)
    out_ref = ref.attention_naive(q, k, v, causal=case.causal, scale=case.scale, dtype=torch.float64,
                                  **options(case, sinks))
    return assert_close(out, out_ref, what=f"{what} ({', '.join(sorted(options(case, sinks)))})")


@st.composite
def feature_cases(draw, bounded: bool | None = None):
    """Calls with at least one option: the shapes of FA-3's :func:`cases` (up to 200 keys), a
    window of 1..Tk + 8 (tile-sized ones and their neighbours favoured; causal then), a cap of
    0.5..50 (logits of "large" cases reach 1e2..1e4), mixed or dominant sinks."""
    base = draw(cases(max_len=200, bounded=bounded))
    use = draw(st.sampled_from(["window", "softcap", "sinks", "window+softcap", "window+sinks", "all"]))
    window = softcap = sinks = None
    if "window" in use or use == "all":
        near = [1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65]
        window = draw(st.one_of(st.sampled_from(near), st.integers(1, base.Tk + 8)))
        Tq = min(base.Tq, base.Tk)
        base = dataclasses.replace(base, causal=True, Tq=Tq)
    if "softcap" in use or use == "all":
        softcap = draw(st.sampled_from([0.5, 2.0, 5.0, 20.0, 50.0]))
    if "sinks" in use or use == "all":
        sinks = draw(st.sampled_from(["mixed", "dominant"]))
    return FCase(**dataclasses.asdict(base), window=window, softcap=softcap, sinks=sinks)


def _c(B, Hq, Hkv, Tq, Tk, D, scale=0.25, magnitude="normal", amp=1.0, *, causal=True, **opts) -> FCase:
    return FCase(B, Hq, Hkv, Tq, Tk, D, causal, scale, magnitude, amp, **opts)


#: The pinned cases: windows shorter than a tile (W = 1), crossing 32-key tile edges and hiding
#: whole key tiles (W = 40 of Tk = 200; W = 47 of 161 with a cap), a decode step over 1,100 keys
#: (the split-KV path of "triton") with dominant sinks; caps below the largest logit (0.5 on
#: normal logits, 5 on large integer ones: the uncapped softmax is one-hot, the capped one is
#: not); sinks mixed over GQA with a window longer than Tk (W = 300), and all three options.
PINNED_CASES = (
    _c(1, 2, 1, 20, 20, 16, window=1),
    _c(1, 2, 1, 20, 200, 16, window=40),
    _c(2, 2, 1, 33, 161, 24, 0.25, "large", 12.0, window=47, softcap=20.0),
    _c(1, 4, 1, 1, 1100, 16, window=100, sinks="dominant"),
    _c(1, 2, 1, 17, 33, 16, scale=1.0, softcap=0.5, causal=False),
    _c(1, 2, 1, 5, 129, 16, 0.25, "large", 12.0, softcap=5.0),
    _c(1, 6, 2, 5, 37, 16, sinks="mixed", window=300),
    _c(1, 2, 1, 20, 90, 16, 0.25, "large", 12.0, sinks="dominant", window=21, softcap=20.0),
)
PINNED = tuple(dict(case=c, seed=100 + i) for i, c in enumerate(PINNED_CASES))

