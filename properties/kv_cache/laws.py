"""The laws of the ``kv_cache`` contract (conformance/contracts/kv_cache.py), over every registered
engine, with the bug zoo (properties/kv_cache/zoo.py) that each law must reject.

- KV-1: prefill of S tokens + T one-token decode steps gives the logits of one full forward
  over the S + T tokens (the no-cache reference), per sequence, in float64, float32, bfloat16;
  also past positions 64 and 128, up to a full cache, and after a second prefill on the same
  engine.
- KV-2: with generators of the same seed, generation with the cache samples exactly the tokens
  of generation without it (temperature > 0).
- KV-4: the engine holds exactly 2 × layers × KV heads × head dim × bytes per value bytes per
  token slot, measured from its tensors (never self-reported), for the slots its declared
  layout holds (exact: the cached tokens; padded: the batch's rectangle; reserved: the capacity;
  the report shows the ratio to the cached tokens' bytes: "differs by design"), and what it
  holds are the model's keys and values (in bfloat16 past position 256 too), or within the
  declared bound of a quantized format at every layer. A lossy (quantized) cache must declare
  its per-value error (else it fails KV-1 and KV-4); KV-1 holds its logits to the bound derived
  from it (properties/kv_cache/lossy.py), KV-10 its batched and lone logits, KV-2 its samples
  (each a token the reference sampler could pick, with the same uniform, from logits within that
  bound); a declared error above what its storage's format can make fails every law.
- KV-10: a sequence's logits do not depend on its batch-mates, their lengths or the padding.

Each law is declared once (:class:`inference_conformance.conformance.laws.Law`, technique "kv_cache": an
implementation is an engine factory, ``impl.new_engine(model, max_batch, max_seq_len)``) with the
names of its conformance test over the registry and of its zoo tests; the plugin collects them. The cases a
law's examples run must reach the boundary classes of the contract's ``COVERAGE`` that name it.

The test models are the reference transformer initialised with std = d_model^-1/2 (instead of the
reference's 0.02) so that attention is far from uniform and a wrong position or a missing token
changes the logits well above float32 rounding (the cases, the model and the oracle:
properties/kv_cache/cases.py). Source: lecture 001 §2.2-2.3.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st

from inference_conformance.conformance.contracts.kv_cache import COVERAGE
from inference_conformance.conformance.laws import Kills, Law
from inference_conformance.conformance.tolerance import HALF_DTYPES, assert_close, assert_exact, check_within, model_rule
from inference_conformance.properties.kv_cache import lossy
from inference_conformance.properties.kv_cache.cases import (
    CAPACITY_SLACK, DTYPES, LLAMA_KV_SHAPE, PINNED, PINNED_B5, PINNED_TILE, Case, cases,
    check_footprint, decode_case, footprint_of, engine_generate, examples, formula_bytes,
    full_forward, model_for, open_engine, reference_kv, run_engine, sequences,
    where_worst,
)
from inference_conformance.properties.strategies import generator, randint
from inference_conformance.reference.transformer import generate

TECH = "kv_cache"
#: The laws that need no 16-bit model: float64 and float32.
FLOAT_DTYPES = (torch.float64, torch.float32)
#: Every zoo test runs its law in float64 (rounding cannot hide a bug there).
ZOO_DTYPE = (torch.float64,)
#: tiny tensors: one intra-op thread is fastest and avoids OpenMP spin-waits between xdist workers
pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---------------------------------------------------------------------------------------- KV-1
def law_prefill_then_decode_equals_full_forward(run, device, dtype, case):
    """KV-1: prefill of the padded prompts, then one-token decode steps, gives per sequence the
    logits of the reference full forward (float64 model), by the model's tolerance rule."""
    run.observe(case)
    cfg = case.cfg()
    model = model_for(cfg, case.seed, dtype, device)
    engine, per_row = run_engine(run.impl, model, case, device, run=run, exact=False)
    fp = footprint_of(engine)
    lossy.require_declared_bound(fp, dtype)
    out = torch.cat(per_row)                                                    # (Σ(S_b + T), V)
    model64 = model_for(cfg, case.seed, torch.float64, device)
    out_ref = torch.cat(full_forward(model64, case, device))
    out_pt = torch.cat(full_forward(model, case, device)) if dtype in HALF_DTYPES or fp.lossy else None
    what = f"prefill + decode logits vs full forward ({where_worst(out, out_ref, case)})"
    if not fp.lossy:
        assert_close(out, out_ref, out_pt=out_pt, rule=model_rule(dtype), what=what)
        return
    full, _, _ = sequences(case, device)
    rows = [full[b:b + 1, :n + case.steps] for b, n in enumerate(case.prompt_lens)]
    lossy.check_logits(out, out_ref, out_pt, model64, rows, fp, what)


KV1_KILLS = ("drop_oldest", "no_rope_offset", "reads_past_length", "shared_positions", "pads_cached",
             "drops_layer_update")

#: KV-1's law: drawn configurations and the pinned boundary cases (a batch with different
#: lengths, GQA group 3 and head dim 6; one full tile of 16; a batch of five).
KV1 = Law(
    claim="KV-1", technique=TECH, body=law_prefill_then_decode_equals_full_forward,
    given={"case": cases()},
    examples=(dict(case=PINNED), dict(case=PINNED_TILE), dict(case=PINNED_B5)),
    dtypes=DTYPES, kills=(Kills(KV1_KILLS, ZOO_DTYPE),),
    coverage=COVERAGE, require_coverage=True, max_examples=examples(8),
    test="test_prefill_then_decode_equals_full_forward",
    zoo_tests=("test_prefill_then_decode_rejects",))






def law_same_seed_same_tokens(run, device, dtype, case, temperature):
    """KV-2: with generators of the same seed, the engine's generation samples exactly the
    tokens of the reference's generate() without a cache."""
    run.observe(case)
    cfg = case.cfg()
    model = model_for(cfg, case.seed, dtype, device)
    S = case.prompt_lens[0]
    prompt = randint(0, case.vocab, (len(case.prompt_lens), S), case.seed, device)   # (B, S)
    out, fp = engine_generate(run.impl, model, prompt, case.steps, temperature, generator(case.seed + 11, device), run)
    if fp.lossy:
        lossy.require_declared_bound(fp, dtype)
        lossy.check_samples(out, S, model, model_for(cfg, case.seed, torch.float64, device), temperature,
                            lambda: generator(case.seed + 11, device), fp)
        return
    out_ref, _ = generate(model, prompt, case.steps, temperature, generator(case.seed + 11, device))
    assert_exact(out, out_ref, what="tokens sampled with the cache vs without")


KV2 = Law(
    claim="KV-2", technique=TECH, body=law_same_seed_same_tokens,
    given={"case": cases(max_steps=8), "temperature": st.floats(0.25, 2.0)},
    examples=(dict(case=Case(n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, seed=3, prompt_lens=(4, 4), steps=6),
                   temperature=1.0),),
    dtypes=FLOAT_DTYPES, kills=(Kills(("reads_past_length", "drop_oldest", "no_rope_offset"), ZOO_DTYPE),),
    max_examples=examples(6),
    test="test_same_seed_same_tokens",
    zoo_tests=("test_same_seed_same_tokens_rejects",))



def law_cache_holds_exactly_the_tokens(run, device, dtype, case):
    """KV-4: the engine's lengths; the bytes it holds, measured from its tensors, equal its
    cache_bytes() and exactly 2·L·Hkv·D·bytes per slot of its declared layout (exact, padded,
    reserved; the ratio to Σ lengths slots is recorded); the bytes of its kv() views are exactly
    2·L·Hkv·D·bytes per cached token, and the cached K and V are the model's (float64 model),
    or within the declared number format's bound for a quantized cache."""
    run.observe(case)
    cfg = case.cfg()
    model = model_for(cfg, case.seed, dtype, device)
    engine, _ = run_engine(run.impl, model, case, device, run=run, exact=False)
    expected_lens = torch.tensor(case.prompt_lens, dtype=torch.int64) + case.steps
    assert_exact(engine.lengths().cpu(), expected_lens, what="lengths()")
    n_tokens = int(expected_lens.sum())
    fp = check_footprint(engine, case, dtype)
    full, _, _ = sequences(case, device)
    model64 = model_for(cfg, case.seed, torch.float64, device)
    held, outs, refs, pts, lossy_out, lossy_model, bounds = 0, [], [], [], [], [], []
    lossy.require_declared_bound(fp, dtype)
    for b, n in enumerate(expected_lens.tolist()):
        ref = reference_kv(model64, full[b:b + 1, :n])
        pt = reference_kv(model, full[b:b + 1, :n]) if dtype in HALF_DTYPES or fp.lossy else None
        for layer in range(cfg.n_layers):
            k, v = engine.kv(layer, b)                                          # (Hkv, n, D) each
            assert_exact(torch.tensor(tuple(k.shape) + tuple(v.shape)),
                         torch.tensor((cfg.n_kv_heads, n, cfg.hd) * 2), what=f"kv({layer}, {b}) shapes")
            held += k.numel() * k.element_size() + v.numel() * v.element_size()
            outs += [k.flatten(), v.flatten()]
            refs += [ref[layer][0].flatten(), ref[layer][1].flatten()]
            if pt is not None:
                pts += [pt[layer][0].flatten(), pt[layer][1].flatten()]
            if fp.value_rel_error is not None:
                d_kv = lossy.simulated_deviation(model64, full[b:b + 1, :n], fp.value_rel_error, b)[1]
                lossy_out += [k.flatten(), v.flatten()]
                lossy_model += [pt[layer][0].flatten(), pt[layer][1].flatten()]
                bounds += [lossy.values_bound(pt[layer][0].flatten(), fp.value_rel_error, d_kv[layer], dtype),
                           lossy.values_bound(pt[layer][1].flatten(), fp.value_rel_error, d_kv[layer], dtype)]
    assert_exact(torch.tensor(held), torch.tensor(n_tokens * formula_bytes(cfg, dtype, 1)),
                 what="bytes of kv() views vs formula")
    out, out_ref = torch.cat(outs), torch.cat(refs)
    if fp.value_rel_error is None:
        assert_close(out, out_ref, out_pt=torch.cat(pts) if pts else None,
                     rule=model_rule(dtype), what="cached K and V vs the model's")
    else:
        verdict = check_within(torch.cat(lossy_out), torch.cat(lossy_model), torch.cat(bounds),
                               what=f"cached K and V at every layer vs the model's ({fp.why})",
                               rule="KV-4 lossy: the declared per-value error, derived through the layers below")
        lossy.record("KV-4", verdict.error, fp)
        verdict.check()


KV4 = Law(
    claim="KV-4", technique=TECH, body=law_cache_holds_exactly_the_tokens,
    given={"case": cases()}, examples=(dict(case=PINNED), dict(case=LLAMA_KV_SHAPE)),
    dtypes=DTYPES,
    kills=(Kills(("drop_oldest", "no_rope_offset", "shared_positions", "pads_cached", "append_no_block_offset",
                  "under_reports_bytes", "drops_layer_update"), ZOO_DTYPE),),
    coverage=COVERAGE, require_coverage=True, max_examples=examples(6),
    test="test_cache_holds_exactly_the_tokens",
    zoo_tests=("test_cache_holds_exactly_the_tokens_rejects",))



# --------------------------------------------------------------------------------------- KV-10
def law_batch_mates_change_nothing(run, device, dtype, case):
    """KV-10: each sequence's logits in a padded batch equal those of its own tokens decoded
    alone (in 16 bits: both judged against the float64 model)."""
    run.observe(case)
    impl = run.impl
    cfg = case.cfg()
    model = model_for(cfg, case.seed, dtype, device)
    engine, batched = run_engine(impl, model, case, device, run=run, exact=False)
    fp = footprint_of(engine)
    lossy.require_declared_bound(fp, dtype)
    full, _, _ = sequences(case, device)
    model64 = model_for(cfg, case.seed, torch.float64, device) if dtype in HALF_DTYPES or fp.lossy else None
    outs, alones, refs, pts = [], [], [], []
    for b, n in enumerate(case.prompt_lens):
        # row b's own tokens, alone in a batch of one, without padding
        engine = impl.new_engine(model, max_batch=1, max_seq_len=n + case.steps + CAPACITY_SLACK)
        pre = engine.prefill(full[b:b + 1, :n], torch.tensor([n], device=device))
        steps = [engine.decode(full[b:b + 1, n + i]) for i in range(case.steps)]
        alones.append(torch.cat([pre[0]] + steps))                              # (n + T, V)
        outs.append(batched[b])
        if model64 is not None:
            with torch.no_grad():
                refs.append(model64(full[b:b + 1, :n + case.steps])[0])
                pts.append(model(full[b:b + 1, :n + case.steps])[0])       # reference model, 16-bit
    out, alone = torch.cat(outs), torch.cat(alones)
    if fp.lossy:
        # both within the bound the declared per-value error implies, against the float64 model
        rows = [full[b:b + 1, :n + case.steps] for b, n in enumerate(case.prompt_lens)]
        d = lossy.rows_deviation(model64, rows, fp.value_rel_error)
        for what, got in (("batched logits", out), ("logits decoded alone", alone)):
            lossy.check_logits(got, torch.cat(refs), torch.cat(pts), model64, rows, fp, f"{what} vs float64",
                               claim="KV-10", d=d)
    elif dtype in HALF_DTYPES:
        # 16-bit batched and alone calls may round differently; both are judged against float64,
        # with the reference model's own 16-bit error (never the engine's) setting the bound
        for what, got in (("batched logits", out), ("logits decoded alone", alone)):
            assert_close(got, torch.cat(refs), out_pt=torch.cat(pts), rule=model_rule(dtype),
                         what=f"{what} vs float64 (reference model in {dtype} as out_pt)")
    else:
        assert_close(out, alone, what="batched logits vs the same sequences decoded alone")


KV10 = Law(
    claim="KV-10", technique=TECH, body=law_batch_mates_change_nothing,
    given={"case": cases(min_batch=2)}, examples=(dict(case=PINNED),),
    dtypes=DTYPES, kills=(Kills(("shared_positions", "pads_cached"), ZOO_DTYPE),),
    coverage=COVERAGE, require_coverage=True, max_examples=examples(5),
    test="test_batch_mates_change_nothing",
    zoo_tests=("test_batch_mates_change_nothing_rejects",))






# ---------------------------------------------- long sequences and a reused engine (KV-1)
LONG = Case(n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, seed=11, prompt_lens=(70, 3), steps=62,
            max_seq_len=160)


def law_long_sequences(run, device, dtype):
    """KV-1 past positions 64 and 128 (RoPE tables, cache tiles and index arithmetic that only
    break at length): a 70-token and a 3-token prompt decoded for 62 steps, to position 131."""
    law_prefill_then_decode_equals_full_forward(run, device, dtype, LONG)


#: KV-1 on the one long case (no drawn arguments).
KV1_LONG = Law(claim="KV-1", technique=TECH, body=law_long_sequences, dtypes=FLOAT_DTYPES,
               kills=(Kills(("rope_off_after_64", "rope_off_after_64_declared_lossy", "drop_oldest",
                              "no_rope_offset"), ZOO_DTYPE),),
               coverage=COVERAGE, require_coverage=True,
    test="test_long_sequences_past_64_and_128_positions",
    zoo_tests=("test_long_sequences_rejects",))


#: Positions past 256: bfloat16 holds integers exactly only up to 256 (257 rounds to 256), so a
#: position or RoPE angle that passes through the model's 16-bit dtype shows only here.
PAST_256 = Case(n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, seed=19, prompt_lens=(257, 3), steps=3,
                max_seq_len=272)


def law_bfloat16_cache_past_256_positions(run, device):
    """KV-4 in bfloat16 with a 257-token prompt decoded to position 259: the cached K and V
    equal the model's (positions are integers, never rounded to the model's dtype)."""
    law_cache_holds_exactly_the_tokens(run, device, torch.bfloat16, PAST_256)


#: KV-4 on the one case past position 256, in bfloat16 (no dtype parameter).
KV4_PAST_256 = Law(claim="KV-4", technique=TECH, body=law_bfloat16_cache_past_256_positions, params=("device",),
                   kills=(Kills(("positions_in_model_dtype",)),), coverage=COVERAGE, require_coverage=True,
    test="test_bfloat16_cache_past_256_positions",
    zoo_tests=("test_bfloat16_cache_past_256_positions_rejects",))



def law_a_second_prefill_forgets_the_first(run, device, dtype):
    """One engine, two batches: after a prefill (and decodes) of other sequences, a new prefill
    starts fresh (the contract: a prefill forgets all earlier sequences)."""
    first = Case(n_layers=2, n_heads=3, n_kv_heads=1, head_dim=6, seed=5, prompt_lens=(9, 4, 6), steps=5)
    second = PINNED
    cfg = second.cfg()
    assert first.cfg() == cfg
    model = model_for(cfg, second.seed, dtype, device)
    engine = open_engine(run.impl, model, 4, 32, run=run)
    decode_case(engine, first, device)
    out = decode_case(engine, second, device)
    out_ref = torch.cat(full_forward(model_for(cfg, second.seed, torch.float64, device), second, device))
    assert_close(out, out_ref, what="logits after a second prefill on the same engine")
    assert_exact(engine.lengths(), torch.tensor([n + second.steps for n in second.prompt_lens]),
                 what="lengths after the second prefill")


KV1_REPREFILL = Law(claim="KV-1", technique=TECH, body=law_a_second_prefill_forgets_the_first, dtypes=FLOAT_DTYPES,
                    kills=(Kills(("stale_after_reprefill",), ZOO_DTYPE),),
    test="test_a_second_prefill_forgets_the_first",
    zoo_tests=("test_a_second_prefill_rejects",))



def law_decode_to_full_capacity(run, device, dtype):
    """The longest sequence fills the cache exactly (its last token goes to slot max_seq_len - 1)
    and the logits after it are still the full forward's."""
    case = PINNED
    cfg = case.cfg()
    model = model_for(cfg, case.seed, dtype, device)
    engine = open_engine(run.impl, model, len(case.prompt_lens), max(case.prompt_lens) + case.steps, run=run)
    out = decode_case(engine, case, device)
    out_ref = torch.cat(full_forward(model_for(cfg, case.seed, torch.float64, device), case, device))
    assert_close(out, out_ref, what="logits up to a full cache")


#: KV-1 up to a full cache (no zoo entry fails only here).
KV1_FULL = Law(claim="KV-1", technique=TECH, body=law_decode_to_full_capacity, dtypes=FLOAT_DTYPES,
    test="test_decode_to_full_capacity")

