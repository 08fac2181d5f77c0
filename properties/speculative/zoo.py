"""Known-bad speculative verifiers (the bug zoo): each is a realistic mistake in the modified
rejection sampling of speculative decoding, and the SD-1 laws (``properties/speculative/test_speculative.py``)
must reject every one under the ``ci`` profile.

All follow the ``speculative`` contract's signature, validate like a correct verifier, compute in
float64 and take their randomness from ``generator``, so that only the bug makes them wrong.
"""
from __future__ import annotations

import torch

from inference_conformance.conformance.contracts.speculative import PAD, validate


def _verify(draft_tokens, draft_probs, target_probs, generator, *, accept_scale=1.0, q_over_p=False,
            late=False, resample_p=False, continue_after=False, drop_bonus=False, unnormalised=False,
            fp16=False, guard_q=0.0, unnormalised_below=0.0, residual_mix=0.0, bonus_mix=0.0):
    validate(draft_tokens, draft_probs, target_probs, generator)
    B, gamma = draft_tokens.shape
    V = draft_probs.shape[-1]
    dev = draft_tokens.device
    q = draft_probs.to(torch.float64)
    p = target_probs.to(torch.float64)
    x = draft_tokens[..., None]
    q_x = q.gather(-1, x)[..., 0]
    p_x = p[:, :gamma].gather(-1, x)[..., 0]
    u = torch.rand((B, gamma), generator=generator, dtype=torch.float64, device=dev)
    if q_over_p:
        ratio = torch.where(p_x > 0, q_x / p_x.clamp_min(1e-300), torch.zeros_like(p_x)).clamp(max=1.0)
    else:
        ratio = (p_x / q_x).clamp(max=1.0)
    if guard_q:                     # "avoid dividing by zero": a tiny q(x) counts as no acceptance
        ratio = torch.where(q_x > guard_q, ratio, torch.zeros_like(ratio))
    if fp16:
        p16, q16 = p_x.to(torch.float16), q_x.to(torch.float16).clamp_min(6e-8)
        ratio = (p16 / q16).clamp(max=1.0).to(torch.float64)
    ok = u < accept_scale * ratio
    q_pad = torch.cat([q, q.new_zeros(B, 1, V)], dim=1)
    v = torch.rand((B, gamma + 1), generator=generator, dtype=torch.float64, device=dev)

    def draw(n, i=None):
        """The last token for rows whose first rejection is at n (n = γ: the bonus)."""
        idx = n.view(B, 1, 1).expand(B, 1, V)
        p_n = p.gather(1, idx)[:, 0]
        w = p_n if resample_p else (p_n - q_pad.gather(1, idx)[:, 0]).clamp_min(0.0)
        w = torch.where(w.sum(-1, keepdim=True) <= 0, p_n, w)
        if residual_mix or bonus_mix:   # a fraction of the draw from q, on the right support
            bonus = (n == gamma)[:, None]
            toward = torch.where(bonus, q[:, gamma - 1], q_pad.gather(1, idx)[:, 0]) * (w > 0)
            m = torch.where(bonus, bonus_mix, residual_mix) * (toward.sum(-1, keepdim=True) > 0)
            w = (1 - m) * w / w.sum(-1, keepdim=True) + m * toward / toward.sum(-1, keepdim=True).clamp_min(1e-300)
        if unnormalised or unnormalised_below:  # inverse CDF against the raw residual: mass past its sum falls on V-1
            uu = v[:, 0] if i is None else v[:, i]
            cum = w.cumsum(-1)
            raw = torch.searchsorted(cum, uu[:, None].contiguous(), right=True)[:, 0].clamp(max=V - 1)
            if unnormalised:
                return raw
            return torch.where(w.sum(-1) < unnormalised_below, raw, torch.multinomial(w, 1, generator=generator)[:, 0])
        return torch.multinomial(w, 1, generator=generator)[:, 0]

    pos = torch.arange(gamma + 1, device=dev)
    draft_pad = torch.cat([draft_tokens, draft_tokens.new_full((B, 1), PAD)], dim=1)
    if continue_after:
        # a rejected position gets its correction, and verification goes on with the next draft token
        tokens = draft_pad.clone()
        for i in range(gamma):
            fix = draw(torch.full((B,), i, dtype=torch.int64, device=dev), i)
            tokens[:, i] = torch.where(ok[:, i], draft_tokens[:, i], fix)
        tokens[:, gamma] = draw(torch.full((B,), gamma, dtype=torch.int64, device=dev), gamma)
        return tokens, ok.to(torch.int64).sum(-1)
    n = ok.to(torch.int64).cumprod(-1).sum(-1)
    if late:
        # the rejected draft token is kept, and the correction is drawn one position later
        n = torch.where(n < gamma, n + 1, n)
    last = draw(n)
    tokens = torch.where(pos < n[:, None], draft_pad, torch.full_like(draft_pad, PAD))
    tokens = torch.where(pos == n[:, None], last[:, None], tokens)
    if drop_bonus:
        tokens[:, gamma] = PAD
    return tokens, n


def late_rejection(draft_tokens, draft_probs, target_probs, *, generator):
    """A rejection handled one step late: the rejected draft token is kept (counted accepted)
    and the correction is drawn at the next position."""
    return _verify(draft_tokens, draft_probs, target_probs, generator, late=True)


def resample_from_p(draft_tokens, draft_probs, target_probs, *, generator):
    """After a rejection, resamples from p instead of the residual norm(max(0, p − q))."""
    return _verify(draft_tokens, draft_probs, target_probs, generator, resample_p=True)


def accept_q_over_p(draft_tokens, draft_probs, target_probs, *, generator):
    """Accepts with min(1, q/p) (the ratio inverted)."""
    return _verify(draft_tokens, draft_probs, target_probs, generator, q_over_p=True)


def continue_after_rejection(draft_tokens, draft_probs, target_probs, *, generator):
    """Replaces a rejected token by its correction and goes on verifying the next draft tokens
    (which were drafted after the rejected one) instead of stopping."""
    return _verify(draft_tokens, draft_probs, target_probs, generator, continue_after=True)


def drops_bonus_token(draft_tokens, draft_probs, target_probs, *, generator):
    """When all γ draft tokens are accepted, emits no bonus token."""
    return _verify(draft_tokens, draft_probs, target_probs, generator, drop_bonus=True)


def unnormalised_residual(draft_tokens, draft_probs, target_probs, *, generator):
    """Samples the correction by inverse CDF against max(0, p − q) without dividing by its sum
    (the mass past the sum falls on the last token)."""
    return _verify(draft_tokens, draft_probs, target_probs, generator, unnormalised=True)


def residual_toward_q(draft_tokens, draft_probs, target_probs, *, generator):
    """Draws the correction from the residual norm(max(0, p − q)) mixed 3% toward q on the
    residual's support ("smoothing" the residual with the draft): a bias of a few percent with no
    impossible outcome, which only the G-tests can see."""
    return _verify(draft_tokens, draft_probs, target_probs, generator, residual_mix=0.03)


def bonus_from_q(draft_tokens, draft_probs, target_probs, *, generator):
    """Draws the bonus token from p[γ] mixed 3% toward the draft's last row q[γ−1] (on p[γ]'s
    support): 3% of bonus draws read the wrong model's distribution, no outcome impossible."""
    return _verify(draft_tokens, draft_probs, target_probs, generator, bonus_mix=0.03)


def acceptance_times_097(draft_tokens, draft_probs, target_probs, *, generator):
    """Accepts with probability 0.97 · min(1, p/q): a slightly biased acceptance (the negative
    control that sizes the statistical law's batch)."""
    return _verify(draft_tokens, draft_probs, target_probs, generator, accept_scale=0.97)


# ------------------------------------------------------------------ known-bad engines
from inference_conformance.optimized.speculative.engine import SpeculativeEngine  # noqa: E402


class ForgetsRollback(SpeculativeEngine):
    """Never rolls its caches back: after a rejection the target's and the draft's caches keep
    the rejected draft tokens' keys and values, and the next tokens are written after them."""

    def _rollback(self, model, new_lengths):
        pass


class ForgetsDraftRollback(SpeculativeEngine):
    """Rolls the target's cache back but not the draft's: the draft keeps conditioning on
    rejected tokens. The output stays right (any draft is a valid draft; SD-1 and SD-7 cannot
    see it), only SD-8's check of the caches does."""

    def _rollback(self, model, new_lengths):
        if model is self.target:
            model.rollback(new_lengths)


class Bfloat16DraftSampling(SpeculativeEngine):
    """Samples each draft token from a bfloat16 softmax of the draft's logits while the q it
    passes to ``verify`` is the float32 softmax: the draft tokens do not follow q."""

    def _draft_sample(self, logits, q, generator):
        from inference_conformance.reference.speculative import process_logits

        q16 = process_logits(logits.to(torch.bfloat16), self.temperature, self.top_k, self.top_p)
        return torch.multinomial(q16.float(), 1, generator=generator)[:, 0]


class Bfloat16DraftQ(SpeculativeEngine):
    """The reverse: samples each draft token from the float32 softmax but passes ``verify`` the
    q of a bfloat16 softmax of the same logits."""

    def _q_for_verify(self, logits, q):
        from inference_conformance.reference.speculative import process_logits

        q16 = process_logits(logits.to(torch.bfloat16), self.temperature, self.top_k, self.top_p).float()
        return q16 / q16.sum(-1, keepdim=True)


#: The known-bad engines, each shown rejected in ``properties/speculative/test_speculative_engine.py``.
ENGINE_ZOO = {"forgets_rollback": ForgetsRollback, "forgets_draft_rollback": ForgetsDraftRollback,
              "bfloat16_draft_sampling": Bfloat16DraftSampling, "bfloat16_draft_q": Bfloat16DraftQ}


# ------------------------------------------------ verifiers seen only by the deterministic laws
def guarded_division(draft_tokens, draft_probs, target_probs, *, generator):
    """Guards the division p/q against q(x) near 0 by accepting with probability 0 where
    q(x) <= 1e-9: a draft token of q(x) = 1e-12 against p(x) ~ 1, which must always be accepted,
    is always rejected."""
    return _verify(draft_tokens, draft_probs, target_probs, generator, guard_q=1e-9)


def tiny_residual_unnormalised(draft_tokens, draft_probs, target_probs, *, generator):
    """Skips normalising the residual max(0, p − q) when its sum is below 1e-6 ("it is about zero
    anyway") and draws from it by inverse CDF: after rejecting a token with p(x) = 0 and a tiny
    q(x), the whole mass of the residual is tiny and the draw lands on the last token, which p
    never emits."""
    return _verify(draft_tokens, draft_probs, target_probs, generator, unnormalised_below=1e-6)


def accept_fp16(draft_tokens, draft_probs, target_probs, *, generator):
    """Computes the acceptance ratio min(1, p/q) in float16: probabilities below float16's
    smallest subnormal flush to zero, so p/q = 1 at tiny magnitudes is always rejected."""
    return _verify(draft_tokens, draft_probs, target_probs, generator, fp16=True)


def row0_probs(draft_tokens, draft_probs, target_probs, *, generator):
    """Indexes the probabilities without the row stride: every row is judged with row 0's q and
    p (and its own draft tokens)."""
    validate(draft_tokens, draft_probs, target_probs, generator)
    return _verify(draft_tokens, draft_probs[:1].expand_as(draft_probs).contiguous(),
                   target_probs[:1].expand_as(target_probs).contiguous(), generator)


def long_gamma_bonus(draft_tokens, draft_probs, target_probs, *, generator):
    """For γ >= 4 draws the bonus token from p at the last draft position instead of p[γ]."""
    p = target_probs
    if draft_tokens.shape[1] >= 4:
        p = target_probs.clone()
        p[:, -1] = target_probs[:, -2]
    validate(draft_tokens, draft_probs, target_probs, generator)
    return _verify(draft_tokens, draft_probs, p, generator)


def small_batch_from_p(draft_tokens, draft_probs, target_probs, *, generator):
    """A small-batch fast path (B <= 8) that resamples a rejection from p instead of the
    residual norm(max(0, p − q))."""
    return _verify(draft_tokens, draft_probs, target_probs, generator,
                   resample_p=draft_tokens.shape[0] <= 8)


def implementations():
    """The known-bad speculative implementations (the bug zoo): each law's ``kills`` names those it
    must reject."""
    from inference_conformance.conformance.registry import known_bad

    return (
        known_bad("speculative", "late_rejection", late_rejection),
        known_bad("speculative", "resample_from_p", resample_from_p),
        known_bad("speculative", "accept_q_over_p", accept_q_over_p),
        known_bad("speculative", "continue_after_rejection", continue_after_rejection),
        known_bad("speculative", "drops_bonus_token", drops_bonus_token),
        known_bad("speculative", "unnormalised_residual", unnormalised_residual),
        known_bad("speculative", "acceptance_times_097", acceptance_times_097),
        known_bad("speculative", "residual_toward_q", residual_toward_q,
                  bug="The correction drawn from the residual mixed 3% toward q (on its support)"),
        known_bad("speculative", "bonus_from_q", bonus_from_q,
                  bug="The bonus token drawn from q[γ−1] 3% of the time (on p[γ]'s support)"),
        known_bad("speculative", "accept_fp16", accept_fp16),
        known_bad("speculative", "row0_probs", row0_probs),
        known_bad("speculative", "long_gamma_bonus", long_gamma_bonus),
        known_bad("speculative", "small_batch_from_p", small_batch_from_p),
        known_bad("speculative", "guarded_division", guarded_division),
        known_bad("speculative", "tiny_residual_unnormalised", tiny_residual_unnormalised),
    )
