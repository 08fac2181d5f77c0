"""Cases of the ``kv_cache`` laws (properties/kv_cache/laws.py): the drawn configuration
(:class:`Case`, :func:`cases`), the pinned boundary cases that the ``ci`` profile always reaches,
the test model, the token sequences, and the engine run and its oracle (the reference full
forward without a cache). Source: lecture 001 §2.2-2.3.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from inference_conformance.conformance import results
from inference_conformance.conformance.contracts.kv_cache import Footprint, held_bytes
from inference_conformance.conformance.laws import refusal
from inference_conformance.conformance.registry import InvalidCall
from inference_conformance.conformance.tolerance import assert_exact
from inference_conformance.properties.strategies import gqa_heads, randint, seeds
from inference_conformance.reference.transformer import Transformer, TransformerConfig, init_weights, layer_kv, sample_next

DTYPES = (torch.float64, torch.float32, torch.bfloat16)
#: Head dims the laws draw: RoPE needs them even; 6, 10 and 14 are not powers of two.
HEAD_DIMS = (2, 4, 6, 8, 10, 14)
CAPACITY_SLACK = 3  # max_seq_len = longest sequence + this: unwritten NaN slots always exist


def examples(n: int):
    """A law's ``max_examples``: ``n`` drawn examples under the ci and dev profiles (the
    interpreter is slow); the thorough profile's share (1/30 of its examples per law) when it
    asks for more. A function of the profile's number, read when the law runs."""
    return lambda profile: max(n, profile // 30)


@dataclass(frozen=True)
class Case:
    """One drawn configuration: model shape, seed, prompt lengths (one per sequence), steps."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    seed: int
    prompt_lens: tuple
    steps: int
    vocab: int = 37
    max_seq_len: int = 64

    def cfg(self) -> TransformerConfig:
        d_model = 16
        return TransformerConfig(vocab_size=self.vocab, d_model=d_model, n_layers=self.n_layers,
                                 n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, d_ff=24,
                                 max_seq_len=self.max_seq_len, head_dim=self.head_dim)


@st.composite
def cases(draw, min_batch: int = 1, max_batch: int = 4, max_prompt: int = 24, max_steps: int = 4):
    n_heads, n_kv = draw(gqa_heads(max_kv=3, max_group=3))
    B = draw(st.integers(min_batch, max_batch))
    return Case(n_layers=draw(st.integers(1, 2)), n_heads=n_heads, n_kv_heads=n_kv,
                head_dim=draw(st.sampled_from(HEAD_DIMS)), seed=draw(seeds),
                prompt_lens=tuple(draw(st.lists(st.integers(1, max_prompt), min_size=B, max_size=B))),
                steps=draw(st.integers(1, max_steps)))


#: A batch with different prompt lengths, GQA group 3 and a non-power-of-two head dim.
PINNED = Case(n_layers=2, n_heads=3, n_kv_heads=1, head_dim=6, seed=7, prompt_lens=(5, 2, 7), steps=3)
#: A prompt of exactly one tile of 16 (a prefill that drops the tile's last token) and a batch of
#: five (a per-row position or RoPE offset wrong from row 4 on): both reach the ``ci`` profile.
PINNED_TILE = Case(n_layers=1, n_heads=2, n_kv_heads=1, head_dim=4, seed=13, prompt_lens=(16,), steps=2)
PINNED_B5 = Case(n_layers=1, n_heads=2, n_kv_heads=1, head_dim=4, seed=17, prompt_lens=(1, 1, 1, 1, 2), steps=2)


def model_for(cfg: TransformerConfig, seed: int, dtype: torch.dtype, device) -> Transformer:
    """The test model: reference weights from ``seed`` with std d_model^-1/2, in ``dtype``."""
    return init_weights(Transformer(cfg), seed, std=cfg.d_model ** -0.5).to(device=device, dtype=dtype).eval()


def sequences(case: Case, device):
    """Full token sequences (B, max S + T) from the case's seed, and the padded prompt batch
    (B, max S) whose padding holds other random ids (which must change nothing)."""
    B, S = len(case.prompt_lens), max(case.prompt_lens)
    full = randint(0, case.vocab, (B, S + case.steps), case.seed, device)       # (B, S + T)
    pad = randint(0, case.vocab, (B, S), case.seed + 1, device)                 # (B, S)
    lens = torch.tensor(case.prompt_lens, dtype=torch.int64, device=device)     # (B,)
    is_prompt = torch.arange(S, device=device)[None, :] < lens[:, None]
    prompt = torch.where(is_prompt, full[:, :S], pad)                           # (B, S)
    return full, prompt, lens


def open_engine(impl, model, max_batch: int, max_seq_len: int, *, run=None, exact: bool = True):
    """``impl.new_engine(model, max_batch, max_seq_len)``; with ``exact`` (a law that needs the
    model's own values back), an engine whose footprint is lossy (a quantized cache) is refused:
    the example is discarded inside a law (``run``), the test ends "unsupported: differs by
    design" outside one, never a pass."""
    engine = impl.new_engine(model, max_batch=max_batch, max_seq_len=max_seq_len)
    fp = footprint_of(engine)
    if exact and fp.lossy:
        from inference_conformance.properties.kv_cache.lossy import require_declared_bound

        require_declared_bound(fp, next(model.parameters()).dtype)  # undeclared bound fails, never "unsupported"
        with refusal(run, getattr(impl, "name", "the engine")):
            raise NotImplementedError(f"differs by design: {fp.why}: a lossy cache does not give the model's logits "
                                      "exactly (KV-1, KV-2 and KV-10 hold them to the bound its declared per-value "
                                      "error implies, KV-4 its values at every layer)")
    return engine


def run_engine(impl, model, case: Case, device, *, run=None, exact: bool = True):
    """Prefill the padded prompts, then decode each row's continuation; return the engine and,
    per row b, logits (S_b + T, V): prefill positions < S_b, then one row per decode step.
    ``run``, ``exact``: as :func:`open_engine`."""
    full, prompt, lens = sequences(case, device)
    B, T = len(case.prompt_lens), case.steps
    engine = open_engine(impl, model, B + 1, max(case.prompt_lens) + T + CAPACITY_SLACK, run=run, exact=exact)
    pre = engine.prefill(prompt, lens)                                          # (B, S, V)
    steps = []
    for i in range(T):
        nxt = full[torch.arange(B, device=device), lens + i]                    # (B,)
        steps.append(engine.decode(nxt))                                        # (B, V)
    per_row = [torch.cat([pre[b, :n]] + [s[b:b + 1] for s in steps]) for b, n in enumerate(case.prompt_lens)]
    return engine, per_row


def engine_sizes(case: Case) -> tuple[int, int]:
    """(max_batch, max_seq_len) :func:`run_engine` builds its engine with."""
    return len(case.prompt_lens) + 1, max(case.prompt_lens) + case.steps + CAPACITY_SLACK


def footprint_of(engine) -> Footprint:
    """The layout an engine declares (``footprint()``), ``exact`` when it declares none."""
    declare = getattr(engine, "footprint", None)
    return declare() if callable(declare) else Footprint()


def check_footprint(engine, case: Case, dtype: torch.dtype) -> Footprint:
    """KV-4 on what the engine holds, after :func:`run_engine` of ``case``: the law measures the
    bytes of every tensor the engine reaches (the model's weights left out,
    :func:`inference_conformance.conformance.contracts.kv_cache.held_bytes`); the engine's ``cache_bytes()`` must
    equal them, and they must be exactly the declared layout's slots × 2·L·Hkv·D·bytes per value
    (+ its scales); a ``bytes_bound`` format (a packing not modelled: group scales can outweigh
    4-bit values at small shapes) only has its figure recorded. Records the ratio of the
    measured bytes to the exact formula (Σ lengths slots): 1 for ``exact``; a padded or reserved
    layout "differs by design" with that figure. Returns the footprint."""
    cfg = case.cfg()
    fp = footprint_of(engine)
    measured = held_bytes(engine, skip=(torch.nn.Module,))
    assert_exact(torch.tensor(engine.cache_bytes()), torch.tensor(measured),
                 what="cache_bytes() vs the bytes of the tensors the engine holds (measured)")
    B = len(case.prompt_lens)
    max_batch, max_seq_len = engine_sizes(case)
    n_tokens = sum(case.prompt_lens) + B * case.steps
    value_bytes = torch.empty((), dtype=dtype).element_size()
    per_slot = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.hd * (fp.bytes_per_value or value_bytes)
    overhead = fp.overhead_bytes * cfg.n_layers
    slots = {"exact": [n_tokens], "padded": [B * (max(case.prompt_lens) + case.steps)],
             "reserved": [B * max_seq_len, max_batch * max_seq_len]}[fp.layout]
    # a reserved cache holds its batch's rows or every row of max_batch: the one it matches
    slot = next((n for n in slots if per_slot * n + overhead == measured), slots[0])
    expected = per_slot * slot + overhead
    exact = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.hd * value_bytes * n_tokens
    # a packing the law does not model (bytes_bound) has its figure only: the law's value check
    # then refuses it ("unsupported"), so it is never a pass
    if not fp.bytes_bound:
        assert_exact(torch.tensor(measured), torch.tensor(expected),
                     what=f"bytes held vs the {fp.layout} layout: {slot} slots x {per_slot} bytes + {overhead}")
    design = fp.layout != "exact" or fp.bytes_per_value is not None or fp.bytes_bound
    results.record("KV-4", measured=round(measured / exact, 3), bound=round(expected / exact, 3),
                   unit="x the exact formula's bytes (held / 2·L·Hkv·D·bytes·Σ lengths)",
                   rule=f"differs by design: {fp.why or fp.layout}" if design else "exact: held bytes = formula",
                   what=f"{fp.layout} layout: {measured} bytes held for {n_tokens} cached tokens ({exact} exact)")
    return fp


def full_forward(model, case: Case, device):
    """The oracle: per row, the reference full forward (no cache) over its S_b + T tokens."""
    full, _, _ = sequences(case, device)
    with torch.no_grad():
        return [model(full[b:b + 1, :n + case.steps])[0] for b, n in enumerate(case.prompt_lens)]


def _tiny_model(device):
    """A tiny float32 reference model: V = 19, 2 layers, 3 query heads over 1 KV head, D = 4."""
    cfg = TransformerConfig(vocab_size=19, d_model=12, n_layers=2, n_heads=3, n_kv_heads=1, d_ff=16,
                            max_seq_len=16, head_dim=4)
    return model_for(cfg, 0, torch.float32, device)


def invalid_calls(device) -> list[InvalidCall]:
    """The kv_cache contract's invalid calls, with the argument each message must name.
    ``prefill`` and ``decode`` go to an engine the implementation builds (max_batch 3,
    max_seq_len 6) holding two sequences of lengths 3 and 1; a rejected call must leave its
    lengths, cache bytes and cached K/V as they were."""
    def t(x, **kw):
        return torch.tensor(x, device=device, **kw)

    def engine(impl):
        e = impl.new_engine(_tiny_model(device), max_batch=3, max_seq_len=6)
        e.prefill(t([[1, 2, 3], [4, 0, 0]]), t([3, 1]))
        return e

    def full(impl):
        e = engine(impl)
        for _ in range(3):                                  # the first sequence reaches 6 tokens
            e.decode(t([5, 6]))
        return e

    def state(e):
        return (e.lengths(), e.cache_bytes(), *e.kv(0, 0), *e.kv(1, 1))

    ok = t([[1, 2]])
    prefill = [  # (what, (tokens, lengths), raises, argument)
        ("tokens-not-a-tensor", ([[1, 2]], t([2])), TypeError, "tokens"),
        ("int32-tokens", (t([[1, 2]], dtype=torch.int32), t([2])), TypeError, "tokens"),
        ("float-tokens", (t([[1.0, 2.0]]), t([2])), TypeError, "tokens"),
        ("tokens-1-d", (t([1, 2]), t([2])), ValueError, "tokens"),
        ("lengths-not-a-tensor", (ok, [2]), TypeError, "lengths"),
        ("float-lengths", (ok, t([2.0])), TypeError, "lengths"),
        ("lengths-shape", (ok, t([2, 2])), ValueError, "lengths"),
        ("length-0", (ok, t([0])), ValueError, "lengths"),
        ("length-above-s", (ok, t([3])), ValueError, "lengths"),
        ("token-id-v", (t([[1, 19]]), t([2])), ValueError, "tokens"),
        ("token-id-negative", (t([[-1, 2]]), t([2])), ValueError, "tokens"),
        ("batch-above-max-batch", (torch.zeros(4, 2, dtype=torch.int64, device=device), t([2] * 4)), ValueError,
         ("tokens", "max_batch")),
        ("length-above-max-seq-len", (torch.zeros(1, 7, dtype=torch.int64, device=device), t([7])), ValueError,
         ("tokens", "max_seq_len")),
        ("tokens-on-another-device", (ok.to("meta"), t([2])), ValueError, "tokens"),
    ]
    out = [InvalidCall(f"prefill-{what}", args, raises=(exc,), argument=argument, function="prefill", on=engine,
                       state=state) for what, args, exc, argument in prefill]
    decode = [  # (what, next_tokens, raises, argument)
        ("next-tokens-not-a-tensor", [1, 2], TypeError, "next_tokens"),
        ("int32-next-tokens", t([1, 2], dtype=torch.int32), TypeError, "next_tokens"),
        ("next-tokens-shape", t([1, 2, 3]), ValueError, "next_tokens"),
        ("next-token-id-v", t([1, 19]), ValueError, "next_tokens"),
    ]
    out += [InvalidCall(f"decode-{what}", (tokens,), raises=(exc,), argument=argument, function="decode", on=engine,
                        state=state) for what, tokens, exc, argument in decode]
    out += [
        InvalidCall("decode-past-max-seq-len", (t([5, 6]),), raises=(ValueError,), argument=("next_tokens", "max_seq_len"),
                    function="decode", on=full, state=state),
        # the contract names no argument for this one
        InvalidCall("decode-before-prefill", (t([1, 2]),), raises=(RuntimeError,), function="decode",
                    on=lambda impl: impl.new_engine(_tiny_model(device), max_batch=3, max_seq_len=6)),
        InvalidCall("new-engine-max-batch-0", raises=(ValueError,), argument="max_batch",
                    args=lambda impl: (_tiny_model(device),), kwargs={"max_batch": 0, "max_seq_len": 6}),
        InvalidCall("new-engine-max-seq-len-above-the-model", raises=(ValueError,), argument="max_seq_len",
                    args=lambda impl: (_tiny_model(device),), kwargs={"max_batch": 1, "max_seq_len": 17}),
    ]
    return out


def where_worst(out: torch.Tensor, out_ref: torch.Tensor, case: Case) -> str:
    """Which sequence and position the row of the largest error is, in logits concatenated as
    (Σ(S_b + T), V): "sequence b, prompt position t" or "sequence b, decode step s"."""
    err = torch.nan_to_num((out.double().cpu() - out_ref.double().cpu()).abs(), nan=float("inf"))
    row = int(err.amax(dim=1).argmax())
    for b, n in enumerate(case.prompt_lens):
        if row < n + case.steps:
            return (f"worst row: sequence {b}, prompt position {row}" if row < n
                    else f"worst row: sequence {b}, decode step {row - n + 1} of {case.steps}")
        row -= n + case.steps
    return "worst row: none"


def engine_generate(impl, model, prompt, n: int, temperature: float, gen: torch.Generator, run=None):
    """generate() of the reference, with the engine's cache: same sampler, same random numbers.
    Returns (tokens (B, S + n), the engine's footprint); a lossy engine is not refused here."""
    B, S = prompt.shape
    engine = open_engine(impl, model, B, S + n, run=run, exact=False)
    lens = torch.full((B,), S, dtype=torch.int64, device=prompt.device)
    logits = engine.prefill(prompt, lens)[:, -1]                                # (B, V)
    tokens = [prompt]
    for i in range(n):
        nxt = sample_next(logits, temperature, gen)                             # (B,)
        tokens.append(nxt[:, None])
        if i + 1 < n:
            logits = engine.decode(nxt)
    return torch.cat(tokens, dim=1), footprint_of(engine)                      # (B, S + n)


def reference_kv(model, tokens):
    """Per layer, the reference model's keys (after RoPE) and values for ``tokens`` (1, n):
    [(k (K, n, H), v (K, n, H))]."""
    return [(k[0], v[0]) for k, v in layer_kv(model, tokens)]


def formula_bytes(cfg: TransformerConfig, dtype: torch.dtype, tokens: int) -> int:
    """Lecture 001 §2.3: 2 (k and v) × layers × KV heads × head dim × bytes per value × tokens."""
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.hd * torch.empty((), dtype=dtype).element_size() * tokens


#: Llama's KV heads and head dim (8 × 128): the append kernel tiles T in blocks of
#: 4096 // 1024 = 4 tokens, so a 9-token prompt spans three blocks (at the drawn shapes, one).
LLAMA_KV_SHAPE = Case(n_layers=1, n_heads=8, n_kv_heads=8, head_dim=128, seed=5, prompt_lens=(9, 6), steps=2)


LLAMA_SHAPES = {
    # name: (layers, query heads, KV heads, head dim, lecture figure in KiB per token)
    "Llama-2-7B": (32, 32, 32, 128, 512),
    "Llama-3-8B": (32, 32, 8, 128, 128),
}


def prefill_then_decode_calls(impl, model, prompt, lens, nexts):
    """Prefill then one decode per row of ``nexts`` (T, B); returns the logits of every call."""
    engine = impl.new_engine(model, max_batch=prompt.shape[0], max_seq_len=prompt.shape[1] + len(nexts) + 1)
    out = [engine.prefill(prompt, lens)]
    out += [engine.decode(nxt) for nxt in nexts]
    return out


def decode_case(engine, case: Case, device):
    """Prefill ``case``'s padded prompts on ``engine`` and decode its steps; per row, the logits
    (S_b + T, V) concatenated over the rows, as :func:`full_forward` gives them."""
    full, prompt, lens = sequences(case, device)
    pre = engine.prefill(prompt, lens)                                          # (B, S, V)
    steps = [engine.decode(full[torch.arange(len(lens), device=device), lens + i]) for i in range(case.steps)]
    return torch.cat([torch.cat([pre[b, :n]] + [s[b:b + 1] for s in steps]) for b, n in enumerate(case.prompt_lens)])
