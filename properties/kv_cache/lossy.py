"""The bounds a lossy (quantized) KV cache is held to (KV-1, KV-2, KV-4, KV-10), derived from the
per-value error it declares (``Footprint.value_rel_error`` = ε: every value it hands to attention
within ε·|x| of what its layer computed) through the model. A lossy cache that declares no
per-value error, or one above what its declared storage can make (ε at most 2 x the relative
step of the coarsest format of its bits per value: ``value_error_cap`` of the contract), fails
(:func:`require_declared_bound`): it is never "unsupported".

The derivation (a measured-vs-derived bound, stated in the report): the float64 reference model
is run over the sequence with every key and value that attention reads, at every layer and every
position, multiplied by (1 + ε·s), s = ±1 drawn independently (the declared error at its full
size on every value), :data:`DRAWS` times. Per sequence and position, D_logits is the largest
deviation of a logit row over the draws, and per layer D_kv the largest deviation of what that
layer computes (its keys and values before the cache's rounding: they differ from the model's
because the layers below read rounded values). A correct cache is then held to

- values (KV-4), at every layer: |kv - kv_model| <= ε·|kv_model| + ε·2^-6·max|kv_model| (the
  format's own rounding, with e4m3's floor) + :data:`SAFETY`·D_kv(layer) + one rounding of the
  model's dtype;
- logits (KV-1; KV-10 its batched logits and the same sequences decoded alone):
  |logits - logits_float64| <= SAFETY·(D_logits + the model's own deviation in its dtype from
  float64), per row, plus 2^-40 of the row's largest logit;
- samples (KV-2): each token it sampled is one inverse-CDF sampling with the same uniform picks
  from some logits within that bound of the float64 model's over its own prefix
  (:func:`check_samples`).

SAFETY = 2 covers errors that a real format correlates where the draws do not; a cache whose
attention reads another layer's values, or its codes with the wrong scale or grid, is off by the
size of the values themselves, far outside it. Claims KV-1, KV-2, KV-4, KV-10.
"""
from __future__ import annotations

import torch

from inference_conformance.conformance import results
from inference_conformance.conformance.contracts.kv_cache import value_error_cap
from inference_conformance.conformance.tolerance import check_within
from inference_conformance.reference.transformer import CausalAttention

#: Draws of the simulated cache error; the bound's factor over the simulated deviation.
DRAWS = 8
SAFETY = 2.0
#: e4m3's smallest normal, relative to its range: the floor of a per-value bound near zero.
FLOOR = 2.0 ** -6


def require_declared_bound(fp, model_dtype: torch.dtype) -> None:
    """AssertionError for a lossy footprint without a per-value error (``value_rel_error``), or
    with one above what its declared storage can make (:func:`value_error_cap`, the model in
    ``model_dtype``): an undeclared or implausible bound is a failure of the cache's
    declaration, never "unsupported"."""
    assert not fp.lossy or fp.value_rel_error is not None, (
        f"a lossy KV cache must declare its per-value error (Footprint.value_rel_error: its format and scale "
        f"granularity imply it); this one declares none ({fp.why or 'no reason given'}), so nothing bounds what "
        "its attention reads")
    if fp.value_rel_error is None:
        return
    cap, why = value_error_cap(fp, model_dtype)
    assert fp.value_rel_error <= cap, (
        f"declared per-value error {fp.value_rel_error:g} EXCEEDS bound {cap:.3g} ({why}; {fp.why or 'no reason given'}) "
        "[rule: KV lossy declaration: value_rel_error <= ERROR_FACTOR x its storage format's relative step, "
        "conformance/contracts/kv_cache.py]: no rounding of those bytes errs that much")


class _Rounded(CausalAttention):
    """Causal attention over keys and values each multiplied by (1 + ε·s), s = ±1 drawn from
    ``gen``; ``kv[layer]`` keeps what the layer computed (before the simulated rounding)."""

    def __init__(self, eps: float, gen: torch.Generator):
        self.eps, self.gen, self.kv = eps, gen, []

    def _round(self, x):
        s = torch.randint(0, 2, x.shape, generator=self.gen).to(x) * 2 - 1
        return x * (1 + self.eps * s)

    def attend(self, layer, q, k, v):
        self.kv.append((k, v))
        return super().attend(layer, q, self._round(k), self._round(v))


@torch.no_grad()
def simulated_deviation(model64, tokens: torch.Tensor, eps: float, seed: int = 0):
    """(D_logits (n,), D_kv [per layer: float]): over :data:`DRAWS` runs of ``model64`` (float64)
    on ``tokens`` (1, n) with every key and value attention reads rounded by ±ε, the largest
    deviation per position of the logit row and per layer of the keys and values it computes."""
    exact = _Rounded(0.0, torch.Generator().manual_seed(seed))
    ref = model64(tokens, cache=exact)[0]                                          # (n, V)
    d_logits = torch.zeros(tokens.shape[1], dtype=torch.float64, device=ref.device)
    d_kv = [0.0] * len(exact.kv)
    for r in range(DRAWS):
        sim = _Rounded(eps, torch.Generator().manual_seed(seed * 1000 + r + 1))
        out = model64(tokens, cache=sim)[0]
        d_logits = torch.maximum(d_logits, (out - ref).abs().amax(dim=-1))
        for layer, ((k, v), (k0, v0)) in enumerate(zip(sim.kv, exact.kv)):
            d_kv[layer] = max(d_kv[layer], float((k - k0).abs().max()), float((v - v0).abs().max()))
    return d_logits, d_kv


def logits_bound(out_ref: torch.Tensor, out_pt: torch.Tensor | None, d_logits: torch.Tensor) -> torch.Tensor:
    """KV-1's bound for a lossy cache's logits (n, V) float64, per row: SAFETY·(D_logits + the
    model's own deviation in its dtype, ``out_pt`` vs ``out_ref``) + 2^-40 of the row's largest."""
    own = (out_pt.double() - out_ref.double()).abs().amax(dim=-1) if out_pt is not None else 0.0
    row = SAFETY * (d_logits + own) + 2.0 ** -40 * out_ref.double().abs().amax(dim=-1)
    return row[:, None].expand_as(out_ref).to(torch.float64)


def values_bound(kv_model: torch.Tensor, eps: float, d_kv_layer: float, dtype: torch.dtype) -> torch.Tensor:
    """KV-4's bound for one layer's cached values against ``kv_model`` (the model's own, in its
    dtype), elementwise float64: ε·|x| + ε·FLOOR·max|x| + SAFETY·D_kv + one rounding of ``dtype``."""
    x = kv_model.double().abs()
    peak = float(x.max()) if x.numel() else 0.0
    return (eps + torch.finfo(dtype).eps) * x + eps * FLOOR * peak + SAFETY * d_kv_layer


def rows_deviation(model64, rows: list, eps: float) -> torch.Tensor:
    """D_logits (Σ n_b,) of the sequences ``rows`` ((1, n_b) tokens each, in order)."""
    return torch.cat([simulated_deviation(model64, tokens, eps, b)[0] for b, tokens in enumerate(rows)])


def check_logits(out, out_ref, out_pt, model64, rows: list, fp, what: str, claim: str = "KV-1",
                 d: torch.Tensor | None = None) -> None:
    """KV-1 (or ``claim``: KV-10) for a lossy cache: ``out`` (Σ n_b, V), the engine's logits of
    the sequences ``rows`` ((1, n_b) tokens each, in order) within :func:`logits_bound` of
    ``out_ref`` (the float64 full forward; ``out_pt`` the model's own in its dtype; ``d`` their
    :func:`rows_deviation` when already computed). Records the ratio; AssertionError beyond."""
    d = rows_deviation(model64, rows, fp.value_rel_error) if d is None else d
    verdict = check_within(out, out_ref, logits_bound(out_ref, out_pt, d), what=what + " (lossy cache)",
                           rule=f"{claim} lossy: derived from the declared per-value error")
    record(claim, verdict.error, fp)
    verdict.check()


def _logit_shift_needed(probs: torch.Tensor, token: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The least a (in units of logit / temperature) by which every logit of a row moving at
    most a lets inverse-CDF sampling with the uniform ``u`` (B,) pick ``token`` (B,) from
    ``probs`` (B, V) float64: the normalized CDF below and at the token, C and C', move to at
    most C e^{±a} / (C e^{±a} + (1 - C) e^{∓a}); 0 where the exact probabilities pick it."""
    cdf = probs.cumsum(-1) / probs.sum(-1, keepdim=True)
    at = cdf.gather(1, token[:, None])[:, 0].clamp(0.0, 1.0)
    below = torch.where(token > 0, cdf.gather(1, (token - 1).clamp_min(0)[:, None])[:, 0], 0.0).clamp(0.0, 1.0)
    up = 0.5 * torch.log(u * (1 - at) / (at * (1 - u)))            # the token's upper CDF must reach u
    down = 0.5 * torch.log(below * (1 - u) / (u * (1 - below)))      # the CDF below it must stay under u
    return torch.nan_to_num(torch.stack([up, down, torch.zeros_like(up)]).amax(dim=0), nan=float("inf"))


@torch.no_grad()
def check_samples(out: torch.Tensor, S: int, model, model64, temperature: float, new_generator, fp) -> None:
    """KV-2 for a lossy cache: the tokens ``out`` (B, S + n) it sampled after prompts of S tokens,
    with generators ``new_generator()`` of the reference's seed (one uniform per row and step, as
    ``sample_next`` draws them), are each one the reference sampler could pick with the same
    uniform from logits within :func:`logits_bound` of the float64 model's over the cache's own
    prefix (teacher-forced: a token it may pick by rounding does not fail the steps after it).
    Records the largest ratio of the logit shift a token needs to the bound; AssertionError beyond."""
    B, total = out.shape
    gen = new_generator()
    u = torch.cat([torch.rand(B, 1, generator=gen, dtype=torch.float64, device=out.device)
                   for _ in range(total - S)], dim=1)                                  # (B, n)
    worst, where = 0.0, ""
    for b in range(B):
        tokens = out[b:b + 1]                                                          # (1, S + n)
        ref, pt = model64(tokens)[0][S - 1:total - 1], model(tokens)[0][S - 1:total - 1]       # (n, V)
        d = simulated_deviation(model64, tokens, fp.value_rel_error, b)[0][S - 1:total - 1]
        bound = logits_bound(ref, pt, d)[:, 0]                                         # (n,)
        probs = torch.softmax(ref.double() / temperature, dim=-1)
        need = _logit_shift_needed(probs, out[b, S:], u[b]) * temperature
        ratio = need / bound
        i = int(ratio.argmax())
        if float(ratio[i]) > worst or not where:
            worst, where = float(ratio[i]), (f"sequence {b}, step {i + 1}: token {int(out[b, S + i])} needs a logit "
                                             f"shift of {float(need[i]):.3g}, bound {float(bound[i]):.3g}")
    record("KV-2", worst, fp)
    assert worst <= 1.0, (
        f"tokens sampled with the lossy cache ({fp.why}) vs the reference sampler's with the same uniforms: "
        f"{worst:.3g} EXCEEDS bound 1 ({where}) [rule: KV-2 lossy: a token the reference could sample from "
        "logits within the bound derived from the declared per-value error]")


def record(claim: str, measured: float, fp) -> None:
    """The report's row: the worst ratio to the derived bound, and how it was derived."""
    results.record(claim, measured=measured, bound=1.0, unit="max |error| / derived bound",
                   rule=f"lossy cache ({fp.why}): per-value error {fp.value_rel_error:g} declared; bound derived "
                        f"through the float64 model by {DRAWS} draws of ±ε on every value read, x{SAFETY:g} "
                        "(properties/kv_cache/lossy.py)")
