"""The transformers adapters (optimized/kv_cache/outside_transformers.py, optimized/speculative/outside_transformers.py) and the storage
bridge
(optimized/kv_cache/storage.py): each cache class's layout as the bridge sees it, the measured
footprint (inference_conformance.conformance.contracts.kv_cache.held_bytes), and the findings of the kv_cache laws on
transformers, each a minimal reproduction pinned to the version it was seen on (5.24.0).

Skipped without transformers (the peer environment, requirements/peers-hf.txt, has it).
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.conformance.contracts.kv_cache import Footprint, held_bytes
from inference_conformance.conformance.tolerance import assert_exact

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: the version the findings below were seen on
SEEN_ON = "5.24.0"


def _config(n_layers=1):
    return transformers.LlamaConfig(vocab_size=10, hidden_size=8, intermediate_size=8, num_hidden_layers=n_layers,
                                    num_attention_heads=2, num_key_value_heads=1, head_dim=4)


def _padded_run(impl):
    """The laws' padded batch on a tiny model: prompts of 5, 2 and 7 tokens, 3 decode steps."""
    from inference_conformance.properties.kv_cache.cases import PINNED, model_for, run_engine

    model = model_for(PINNED.cfg(), PINNED.seed, torch.float32, "cpu")
    engine, _ = run_engine(impl, model, PINNED, "cpu", exact=False)
    return engine


def test_held_bytes_counts_each_storage_once_and_leaves_bookkeeping_out():
    """Views of one tensor count once; int64 and bool tensors (lengths, masks) and skipped types
    do not count; nested lists, dicts and attributes are walked."""
    class Holder:
        pass

    base = torch.zeros(4, 8)                                   # 128 bytes
    h = Holder()
    h.a, h.b = base, base[1:3]                                 # a view: the same storage
    h.nested = {"x": [torch.zeros(2, dtype=torch.float16)]}    # 4 bytes
    h.lengths, h.mask = torch.zeros(5, dtype=torch.int64), torch.ones(5, dtype=torch.bool)
    h.model = torch.nn.Linear(3, 3)
    assert_exact(torch.tensor(held_bytes(h, skip=(torch.nn.Module,))), torch.tensor(132), what="held bytes")
    assert_exact(torch.tensor(held_bytes(h)), torch.tensor(132 + 4 * 12), what="held bytes with the model's weights")


def test_footprint_rejects_an_unknown_layout():
    with pytest.raises(ValueError, match="layout"):
        Footprint("compressed")
    with pytest.raises(ValueError, match="bytes_per_value"):
        Footprint("padded", bytes_per_value=0)


@pytest.mark.parametrize("name,layout,slots", [
    ("HF_DYNAMIC", "padded", 3 * 10),                 # B × (longest prompt 7 + 3 steps)
    ("HF_STATIC", "reserved", 3 * 13),                # B × max_seq_len (7 + 3 + slack 3)
    ("HF_SLIDING_WINDOW", "padded", 3 * 10),
    ("HF_STATIC_SLIDING_WINDOW", "reserved", 3 * 13),
])
def test_cache_classes_hold_their_layout(name, layout, slots):
    """What each class holds on the laws' padded batch, measured: the slots of its layout × 96
    bytes (2 × 2 layers × 1 KV head × 6 × 4 bytes), against 23 cached tokens (2208 bytes)."""
    from inference_conformance.optimized.kv_cache import outside_transformers as hf

    engine = _padded_run(getattr(hf, name))
    assert engine.footprint().layout == layout
    assert_exact(torch.tensor(engine.cache_bytes()), torch.tensor(96 * slots), what=f"{name} bytes held")


def test_storage_layouts_are_translated_not_recomputed():
    """The bridge hands transformers' own Cache.update the model's k, v: after a prefill the
    DynamicCache's tensors are exactly the k, v of the padded forward (RoPE applied by the
    model), with the padding columns held too (layer 0; deeper layers' padding columns are
    unspecified: the bridge's mask keeps padding queries off other padding)."""
    from inference_conformance.optimized.kv_cache import outside_transformers as hf
    from inference_conformance.properties.kv_cache.cases import PINNED, model_for, sequences
    from inference_conformance.reference.transformer import layer_kv

    model = model_for(PINNED.cfg(), PINNED.seed, torch.float64, "cpu")
    engine = hf.HF_DYNAMIC.new_engine(model, 4, 20)
    _, prompt, lens = sequences(PINNED, "cpu")
    engine.prefill(prompt, lens)
    kv = layer_kv(model, prompt)                               # the padded batch, no cache
    first = engine.storage.cache.layers[0]                           # layer 0: a function of the token alone
    assert_exact(first.keys, kv[0][0], what="layer 0 keys held by DynamicCache, padding columns included")
    assert_exact(first.values, kv[0][1], what="layer 0 values held by DynamicCache, padding columns included")
    for layer in range(PINNED.n_layers):                       # deeper: the prompt columns of each row
        held = engine.storage.cache.layers[layer]
        for b, n in enumerate(PINNED.prompt_lens):
            assert_exact(held.keys[b, :, :n], kv[layer][0][b, :, :n], what=f"layer {layer} row {b} keys")
            assert_exact(held.values[b, :, :n], kv[layer][1][b, :, :n], what=f"layer {layer} row {b} values")


def test_fp8_cache_saturates_past_the_first_update():
    """Finding (transformers 5.24.0, QuantizedCache("fp8")): Fp8QuantizedLayer calibrates one
    float32 scale per tensor on the first update (a prompt) and freezes it; a later key larger
    than the prompt's largest saturates at float8_e4m3fn's 448 × scale. Here a prompt of 0.5s
    then a key of 2.0: the cache returns 0.5 (75% error; e4m3 rounding alone is within 6.25%).
    expectations/hf_quantized_fp8.toml lists the laws this fails."""
    cache = transformers.QuantizedCache("fp8", _config())
    prompt = torch.full((1, 1, 2, 4), 0.5)
    cache.update(prompt, prompt, 0)
    k, _ = cache.update(torch.full((1, 1, 1, 4), 2.0), torch.full((1, 1, 1, 4), 2.0), 0)
    if transformers.__version__ != SEEN_ON and float(k[0, 0, -1, 0]) == 2.0:
        pytest.skip(f"fixed in transformers {transformers.__version__} (seen on {SEEN_ON})")
    assert_exact(k[0, 0, -1], torch.full((4,), 0.5), what="the decoded key read back: saturated at the prompt's max")


def test_offloaded_cache_raises_on_a_cpu_only_build():
    """Finding (transformers 5.24.0): DynamicCache(offloading=True) calls
    torch.cuda.default_stream in every update, so on a CPU-only build of torch it raises
    AssertionError ("Torch not compiled with CUDA enabled") instead of refusing at construction;
    the adapter hf_offloaded is therefore registered for CUDA only."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA build: offloading runs")
    cache = transformers.DynamicCache(offloading=True)
    k = torch.zeros(1, 1, 2, 4)
    with pytest.raises(AssertionError, match="CUDA"):
        cache.update(k, k, 0)


def test_assisted_verify_follows_the_contract_on_a_certain_case():
    """hf_assisted (transformers' _speculative_sampling): a draft token the target gives
    probability 1 is accepted, and the bonus token then comes from the target's last row;
    equal generators give equal results."""
    from inference_conformance.optimized.speculative.outside_transformers import assisted_verify

    V = 4
    draft_tokens = torch.tensor([[2, 1]])
    q = torch.full((1, 2, V), 0.25, dtype=torch.float64)
    p = torch.zeros(1, 3, V, dtype=torch.float64)
    p[0, 0, 2] = p[0, 1, 1] = p[0, 2, 3] = 1.0
    a = assisted_verify(draft_tokens, q, p, generator=torch.Generator().manual_seed(3))
    b = assisted_verify(draft_tokens, q, p, generator=torch.Generator().manual_seed(3))
    assert_exact(a[0], torch.tensor([[2, 1, 3]]), what="tokens")
    assert_exact(a[1], torch.tensor([2]), what="num_accepted")
    assert_exact(a[0], b[0], what="tokens from equal generators")
