"""Known-bad attention implementations (the bug zoo): each one is a classic kernel bug, and the
laws in ``properties/attention/test_attention.py`` must reject every one they list in ``kills``.

All follow the attention contract's signature and compute in float64 for float64 inputs and
float32 otherwise, so that only the bug (not rounding) makes them wrong.
"""
from __future__ import annotations

import math

import torch

from inference_conformance.conformance.contracts.attention import causal_mask, validate, window_mask
from inference_conformance.properties.attention.isolations import isolations  # noqa: F401 - the diagnosis reads it here
from inference_conformance.reference.attention import masked_attention, softmax_textbook


def _attend(q, k, v, *, causal, scale, head_map=None, mask=None, subtract_max=True, keys=None):
    shape = validate(q, k, v, causal, scale)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    heads = [head_map(h, shape.Hq, shape.Hkv) if head_map else h // shape.group for h in range(shape.Hq)]
    idx = torch.tensor(heads, device=q.device)
    kf, vf = k.to(acc)[:, idx], v.to(acc)[:, idx]                       # (B, Hq, Tk, D)
    if keys is not None:
        kf, vf = kf[:, :, :keys], vf[:, :, :keys]
    m = (mask or causal_mask)(shape.Tq, shape.Tk, q.device)[:, : kf.shape[2]] if causal else None
    out = masked_attention(q.to(acc), kf, vf, scale=scale, mask=m,
                           softmax_fn=None if subtract_max else softmax_textbook)
    return out.to(q.dtype)


def no_max_subtract(q, k, v, *, causal, scale):
    """Softmax without subtracting the row maximum: exp overflows for logits past ~88 (float32)
    or ~709 (float64) and the output turns to nan."""
    return _attend(q, k, v, causal=causal, scale=scale, subtract_max=False)


def _top_left(Tq, Tk, device):
    return torch.arange(Tk, device=device)[None, :] <= torch.arange(Tq, device=device)[:, None]


def top_left_causal(q, k, v, *, causal, scale):
    """Causal mask aligned top-left (j <= i, torch's is_causal), wrong whenever Tq < Tk."""
    return _attend(q, k, v, causal=causal, scale=scale, mask=_top_left)


def top_left_causal_in_large_batches(q, k, v, *, causal, scale):
    """Right alone and in batches of up to 4; from B = 5 on a prefill (Tq > 1) takes another
    kernel path whose causal mask is aligned top-left (j <= i): wrong wherever 1 < Tq < Tk in a
    batch of 5 or more (a path chosen by the batch, which batch invariance sees too)."""
    big = q.dim() == 4 and q.shape[0] >= 5 and q.shape[2] > 1
    return _attend(q, k, v, causal=causal, scale=scale, mask=_top_left if big else None)


def _chunk_diagonal_off_by_one(Tq, Tk, device):
    m = causal_mask(Tq, Tk, device)
    if 1 < Tq < Tk:   # a chunk after a cached prefix: j < i + (Tk - Tq), the diagonal masked
        m = torch.arange(Tk, device=device)[None, :] < torch.arange(Tq, device=device)[:, None] + (Tk - Tq)
    return m


def chunk_diagonal_off_by_one(q, k, v, *, causal, scale):
    """Causal mask right for decode (Tq = 1) and Tq = Tk, but for a chunk after a cached prefix
    (1 < Tq < Tk) written ``j < i + (Tk - Tq)``: each query misses its own key."""
    return _attend(q, k, v, causal=causal, scale=scale, mask=_chunk_diagonal_off_by_one)


def _prefix_offset_clamped(Tq, Tk, device):
    off = min(Tk - Tq, 128)
    return torch.arange(Tk, device=device)[None, :] <= torch.arange(Tq, device=device)[:, None] + off


def prefix_offset_clamped_to_tile(q, k, v, *, causal, scale):
    """The causal offset Tk - Tq clamped to one key tile (128): right while the cached prefix is
    within a tile, every query blind to the keys past it beyond."""
    return _attend(q, k, v, causal=causal, scale=scale, mask=_prefix_offset_clamped)


def gqa_modulo(q, k, v, *, causal, scale):
    """Query head h reads KV head h % Hkv instead of h // (Hq // Hkv)."""
    return _attend(q, k, v, causal=causal, scale=scale, head_map=lambda h, hq, hkv: h % hkv)


def drops_last_key(q, k, v, *, causal, scale):
    """An off-by-one tail: the loop over keys stops one short (the last key is never read)."""
    Tk = k.shape[2] if isinstance(k, torch.Tensor) and k.dim() == 4 else None
    return _attend(q, k, v, causal=causal, scale=scale, keys=max(1, Tk - 1) if Tk else None)


def ignores_scale(q, k, v, *, causal, scale):
    """Uses the default 1/sqrt(D) whatever ``scale`` says."""
    return _attend(q, k, v, causal=causal, scale=1.0 / math.sqrt(q.shape[-1]))


def split_no_rescale(q, k, v, *, causal, scale, num_splits: int = 4):
    """Split-KV decoding whose merge weights each split's normalised output by its sum l_s but
    forgets to rescale the sums to a common maximum (exp(m_s - m)): wrong whenever the splits'
    maxima differ."""
    shape = validate(q, k, v, causal, scale)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    kf = k.to(acc).repeat_interleave(shape.group, dim=1)
    vf = v.to(acc).repeat_interleave(shape.group, dim=1)
    s = (q.to(acc) @ kf.transpose(-1, -2)) * scale                      # (B, Hq, Tq, Tk)
    if causal:
        s = s.masked_fill(~causal_mask(shape.Tq, shape.Tk, q.device), -math.inf)
    num = torch.zeros(q.shape, dtype=acc, device=q.device)
    den = torch.zeros(q.shape[:-1], dtype=acc, device=q.device)
    n = min(num_splits, shape.Tk)
    bounds = torch.linspace(0, shape.Tk, n + 1).round().long().tolist()
    for j0, j1 in zip(bounds[:-1], bounds[1:]):
        sj = s[..., j0:j1]
        m = sj.max(dim=-1, keepdim=True).values
        m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
        e = torch.exp(sj - m)
        l = e.sum(dim=-1)                                               # in units of exp(m_s)
        o = (e @ vf[:, :, j0:j1]) / l.clamp_min(1e-300)[..., None]
        num += l[..., None] * o                                         # BUG: no exp(m_s - m)
        den += l
    return (num / den[..., None]).to(q.dtype)


# ------------------------------------------------------------------- bugs only 16 bits show
def scaled_two_percent(q, k, v, *, causal, scale):
    """Every output 2% too large (a normaliser that misses part of the row sum, or a stale
    rescale factor): 2.6 to 5 ulps of each bfloat16 element, within twice the naive bfloat16
    error at the output's maximum (what the field's 2x rule allows)."""
    return (_attend(q, k, v, causal=causal, scale=scale).to(torch.float64) * 1.02).to(q.dtype)


#: Keys per tile of :func:`accumulates_in_16bit`.
ACC16_BLOCK_N = 64


def accumulates_in_16bit(q, k, v, *, causal, scale):
    """An online softmax (FlashAttention's loop) whose running max m, sum l and accumulator acc
    are kept in the inputs' dtype between key tiles (each tile computed in float32): exact for
    float32 and float64 inputs, but 16-bit inputs lose about an ulp per tile, so the error grows
    with the number of tiles (Tk / 64) and passes the field's 2x rule up to Tk = 4096."""
    shape = validate(q, k, v, causal, scale)
    dt = q.dtype
    kf = k.repeat_interleave(shape.group, dim=1).to(torch.float32)            # (B, Hq, Tk, D)
    vf = v.repeat_interleave(shape.group, dim=1).to(torch.float32)
    s_all = (q.to(torch.float32) @ kf.transpose(-1, -2)) * scale              # (B, Hq, Tq, Tk)
    if causal:
        s_all = s_all.masked_fill(~causal_mask(shape.Tq, shape.Tk, q.device), -math.inf)
    m = torch.full(q.shape[:-1] + (1,), -math.inf, dtype=dt, device=q.device)
    l = torch.zeros(q.shape[:-1] + (1,), dtype=dt, device=q.device)
    acc = torch.zeros(q.shape, dtype=dt, device=q.device)
    for j in range(0, shape.Tk, ACC16_BLOCK_N):
        s = s_all[..., j:j + ACC16_BLOCK_N]
        m_new = torch.maximum(m.float(), s.max(dim=-1, keepdim=True).values)
        m_safe = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
        alpha, p = torch.exp(m.float() - m_safe), torch.exp(s - m_safe)
        l = (l.float() * alpha + p.sum(dim=-1, keepdim=True)).to(dt)          # BUG: kept in 16 bits
        acc = (acc.float() * alpha + p @ vf[:, :, j:j + ACC16_BLOCK_N]).to(dt)
        m = m_new.to(dt)
    return (acc.float() / l.float()).to(dt)


# ------------------------------------------------------- bugs at a boundary class of the shapes
def split_batch_stride_zero(q, k, v, *, causal, scale, num_splits: int = 2):
    """A split-KV kernel whose merge writes every sequence at batch stride 0: each sequence's
    merged output lands on sequence 0's rows (the last one written wins) and the other
    sequences' rows are never written (here: zeros). Right whenever B = 1."""
    validate(q, k, v, causal, scale)
    full = _attend(q, k, v, causal=causal, scale=scale)                   # (B, Hq, Tq, D)
    out = torch.zeros_like(full)
    out[0] = full[-1]                                                    # BUG: out + 0 * stride_ob
    return out


#: Tile size of :func:`diagonal_tile_unmasked`.
DIAG_TILE = 32


def _diag_unmasked_mask(Tq, Tk, device):
    """The causal mask with the diagonal tile left unmasked when the tile divides Tk exactly
    (the kernel's "every tile is whole" fast path forgets that the diagonal tile is partial)."""
    m = causal_mask(Tq, Tk, device)
    if Tk % DIAG_TILE:
        return m
    row = torch.arange(Tq, device=device)[:, None] + (Tk - Tq)          # the row's last visible key
    col = torch.arange(Tk, device=device)[None, :]
    return m | (col // DIAG_TILE == row // DIAG_TILE)


def diagonal_tile_unmasked(q, k, v, *, causal, scale):
    """Causal attention whose kernel skips the mask on the diagonal tile when the tile (32)
    divides the length exactly: Tq = Tk = 64 lets row 0 see keys 0..31."""
    return _attend(q, k, v, causal=causal, scale=scale, mask=_diag_unmasked_mask)


def sdpa_is_causal_always(q, k, v, *, causal, scale):
    """The torch backend before its fix: ``scaled_dot_product_attention(is_causal=True)``
    whenever Tq == Tk, whatever the scale. PyTorch's CPU kernel then returns NaN for a negative
    scale (float64, float32; torch 2.11 and 2.13) and wrong values in bfloat16."""
    import torch.nn.functional as F

    shape = validate(q, k, v, causal, scale)
    kf = k.repeat_interleave(shape.group, dim=1)
    vf = v.repeat_interleave(shape.group, dim=1)
    if causal and shape.Tq == shape.Tk:
        return F.scaled_dot_product_attention(q, kf, vf, is_causal=True, scale=float(scale))
    mask = causal_mask(shape.Tq, shape.Tk, q.device) if causal else None
    return F.scaled_dot_product_attention(q, kf, vf, attn_mask=mask, scale=float(scale))


def scale_rounded_to_float32(q, k, v, *, causal, scale):
    """The scale rounded to float32 before use, as a compiled Triton kernel does with a Python
    float argument: invisible in 16-bit and float32, ~1e-8 relative in float64."""
    return _attend(q, k, v, causal=causal, scale=float(torch.tensor(float(scale), dtype=torch.float32)))


#: Keys per tile of :func:`stale_running_max`.
STALE_BLOCK_N = 64


def stale_running_max(q, k, v, *, causal, scale):
    """An online softmax whose running max m is set by the first key tile (64 keys) and never
    updated after it: right while every later tile's logits stay within ~88 (float32) or ~709
    (float64) of the first tile's max; exp overflows to inf (and the output to nan) when a
    large logit arrives after the first 64 keys."""
    shape = validate(q, k, v, causal, scale)
    acc_dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    kf = k.to(acc_dt).repeat_interleave(shape.group, dim=1)
    vf = v.to(acc_dt).repeat_interleave(shape.group, dim=1)
    s_all = (q.to(acc_dt) @ kf.transpose(-1, -2)) * scale                   # (B, Hq, Tq, Tk)
    if causal:
        s_all = s_all.masked_fill(~causal_mask(shape.Tq, shape.Tk, q.device), -math.inf)
    m = torch.full(q.shape[:-1] + (1,), -math.inf, dtype=acc_dt, device=q.device)
    l = torch.zeros(q.shape[:-1] + (1,), dtype=acc_dt, device=q.device)
    acc = torch.zeros(q.shape, dtype=acc_dt, device=q.device)
    for j in range(0, shape.Tk, STALE_BLOCK_N):
        s = s_all[..., j:j + STALE_BLOCK_N]
        m_new = torch.maximum(m, s.max(dim=-1, keepdim=True).values) if j == 0 else m   # BUG
        m_safe = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
        alpha, p = torch.exp(m - m_safe), torch.exp(s - m_safe)
        l = l * alpha + p.sum(dim=-1, keepdim=True)
        acc = acc * alpha + p @ vf[:, :, j:j + STALE_BLOCK_N]
        m = m_new
    return (acc / l).to(q.dtype)


def scale_folded_in_16bit(q, k, v, *, causal, scale):
    """For 16-bit inputs the scale is folded into q in q's dtype (q * scale rounded to bfloat16
    or float16) and the scores computed with scale 1: exact for a power-of-two scale, but
    otherwise each q element is off by up to half a 16-bit ulp, which moves the logits by
    ~2^-9 |q||k| (bfloat16) where the contract scales them in float32."""
    if q.dtype in (torch.float16, torch.bfloat16):
        return _attend(q * scale, k, v, causal=causal, scale=1.0)
    return _attend(q, k, v, causal=causal, scale=scale)


def nan_rows_zeroed(q, k, v, *, causal, scale):
    """A "safe softmax": a row whose scores are all NaN (a NaN query, or a NaN key it sees)
    comes out 0 instead of NaN (what PyTorch's CPU SDPA does for a NaN query row)."""
    from inference_conformance.reference.attention import attention as attention_ref

    return torch.nan_to_num(attention_ref(q, k, v, causal=causal, scale=scale), nan=0.0)


def additive_mask_leaks_nan(q, k, v, *, causal, scale):
    """The causal mask added as -inf to the scores instead of selecting them: NaN + (-inf) is
    NaN, so a NaN in a key the mask hides reaches rows that cannot see it."""
    shape = validate(q, k, v, causal, scale)
    kf = k.to(torch.float64).repeat_interleave(shape.group, dim=1)
    vf = v.to(torch.float64).repeat_interleave(shape.group, dim=1)
    s = (q.to(torch.float64) @ kf.transpose(-1, -2)) * scale
    if causal:
        s = s + torch.where(causal_mask(shape.Tq, shape.Tk, q.device), 0.0, float("-inf")).to(s.dtype)
    return (torch.softmax(s, dim=-1) @ vf).to(q.dtype)


# ------------------------------------------- FA-8: the options (window, softcap, sinks) wrong
#: Tiles of :func:`window_skips_wrong_tile` (the interpreter's 16 x 32).
WIN_BLOCK_M, WIN_BLOCK_N = 16, 32


def _options_attend(q, k, v, *, causal, scale, window, softcap, sinks, mask=None, cap=None, splits=1):
    """Attention with the contract's options in float64 (float32 for other inputs), with the
    bug's ``mask`` (Tq, Tk) or capped ``cap(s, mask)`` scores, or, with ``splits`` > 1, the
    sinks joined to every split's softmax before a correct merge. Returns q's dtype."""
    shape = validate(q, k, v, causal, scale, window, softcap, sinks)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    kf = k.to(acc).repeat_interleave(shape.group, dim=1)
    vf = v.to(acc).repeat_interleave(shape.group, dim=1)
    s = (q.to(acc) @ kf.transpose(-1, -2)) * scale                      # (B, Hq, Tq, Tk)
    if mask is None:
        mask = window_mask(shape.Tq, shape.Tk, window, q.device) if causal else torch.ones_like(s, dtype=torch.bool)
    if cap is not None:
        s = cap(s, mask)
    elif softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~mask, -math.inf)
    sink = (sinks.to(acc)[None, :, None, None] if sinks is not None
            else torch.full((1, shape.Hq, 1, 1), -math.inf, dtype=acc, device=q.device))
    bounds = torch.linspace(0, shape.Tk, min(splits, shape.Tk) + 1).round().long().tolist()
    parts = []
    for j0, j1 in zip(bounds[:-1], bounds[1:]):     # each split's softmax over its keys and the sink
        sj = s[..., j0:j1]
        lse = torch.logaddexp(torch.logsumexp(sj, dim=-1, keepdim=True), sink)   # (B, Hq, Tq, 1)
        parts.append((torch.exp(sj - lse) @ vf[:, :, j0:j1], lse))
    lses = torch.stack([lse for _, lse in parts])
    w = torch.exp(lses - torch.logsumexp(lses, dim=0))                  # the merge's exact weights
    return sum(w[i] * o for i, (o, _) in enumerate(parts)).to(q.dtype)


def _tile_late_window(Tq, Tk, window, device):
    """The window mask with each query tile's first key tile rounded up instead of down: keys
    of the window in the tile before the rounded start are skipped (off by one tile)."""
    m = window_mask(Tq, Tk, window, device)
    if window is None:
        return m
    row0 = (torch.arange(Tq, device=device) // WIN_BLOCK_M) * WIN_BLOCK_M       # the tile's first row
    first = (row0 + (Tk - Tq) - window + 1).clamp_min(0)
    lo = -(-first // WIN_BLOCK_N) * WIN_BLOCK_N                                  # BUG: ceil, not floor
    return m & (torch.arange(Tk, device=device)[None, :] >= lo[:, None])


def window_skips_wrong_tile(q, k, v, *, causal, scale, window=None, softcap=None, sinks=None):
    """A window kernel that starts each query tile at the key tile after the one holding its
    first visible key (cdiv instead of floor, tiles 16 x 32): right when the window starts on a
    tile edge, blind to up to 31 visible keys otherwise."""
    m = _tile_late_window(q.shape[2], k.shape[2], window, q.device) if causal else None
    return _options_attend(q, k, v, causal=causal, scale=scale, window=window, softcap=softcap, sinks=sinks, mask=m)


def softcap_after_max(q, k, v, *, causal, scale, window=None, softcap=None, sinks=None):
    """The cap applied after the row maximum is subtracted: c·tanh((s − m)/c) instead of
    c·tanh(s/c) − max: the far keys saturate at −c and keep weight exp(−c)."""
    def cap(s, mask):
        if softcap is None:
            return s
        m = s.masked_fill(~mask, -math.inf).amax(dim=-1, keepdim=True)
        return softcap * torch.tanh((s - m) / softcap)
    return _options_attend(q, k, v, causal=causal, scale=scale, window=window, softcap=softcap, sinks=sinks, cap=cap)


def sinks_dropped_in_merge(q, k, v, *, causal, scale, window=None, softcap=None, sinks=None):
    """A split-KV merge that forgets the sinks: right without sinks, every row's denominator
    short of exp(sink) with them."""
    validate(q, k, v, causal, scale, window, softcap, sinks)
    return _options_attend(q, k, v, causal=causal, scale=scale, window=window, softcap=softcap, sinks=None)


def sinks_once_per_split(q, k, v, *, causal, scale, window=None, softcap=None, sinks=None):
    """Split-KV (2 splits) whose partials each put the sink in their own softmax: the merged
    denominator counts exp(sink) twice."""
    return _options_attend(q, k, v, causal=causal, scale=scale, window=window, softcap=softcap, sinks=sinks,
                           splits=2)


def implementations():
    """The known-bad attention implementations (the bug zoo): each law's ``kills`` names those it
    must reject."""
    from inference_conformance.conformance.registry import known_bad

    return (
        known_bad("attention", "no_max_subtract", no_max_subtract),
        known_bad("attention", "nan_rows_zeroed", nan_rows_zeroed),
        known_bad("attention", "additive_mask_leaks_nan", additive_mask_leaks_nan),
        known_bad("attention", "top_left_causal", top_left_causal),
        known_bad("attention", "top_left_causal_in_large_batches", top_left_causal_in_large_batches,
                  bug="from B = 5 on, a prefill's (Tq > 1) causal mask aligned top-left"),
        known_bad("attention", "chunk_diagonal_off_by_one", chunk_diagonal_off_by_one),
        known_bad("attention", "prefix_offset_clamped_to_tile", prefix_offset_clamped_to_tile),
        known_bad("attention", "gqa_modulo", gqa_modulo),
        known_bad("attention", "drops_last_key", drops_last_key),
        known_bad("attention", "ignores_scale", ignores_scale),
        known_bad("attention", "split_no_rescale", split_no_rescale),
        known_bad("attention", "scaled_two_percent", scaled_two_percent),
        known_bad("attention", "accumulates_in_16bit", accumulates_in_16bit),
        known_bad("attention", "split_batch_stride_zero", split_batch_stride_zero),
        known_bad("attention", "diagonal_tile_unmasked", diagonal_tile_unmasked),
        known_bad("attention", "sdpa_is_causal_always", sdpa_is_causal_always),
        known_bad("attention", "scale_rounded_to_float32", scale_rounded_to_float32),
        known_bad("attention", "stale_running_max", stale_running_max),
        known_bad("attention", "scale_folded_in_16bit", scale_folded_in_16bit),
        known_bad("attention", "window_skips_wrong_tile", window_skips_wrong_tile),
        known_bad("attention", "softcap_after_max", softcap_after_max),
        known_bad("attention", "sinks_dropped_in_merge", sinks_dropped_in_merge),
        known_bad("attention", "sinks_once_per_split", sinks_once_per_split),
    )
