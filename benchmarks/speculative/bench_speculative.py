"""Speculative decoding: the batched verifier's time against the reference's, token trees
scored in one forward (SD-10), and tokens per target call of each drafter (SD-14).

- ``test_bench_verify``: one ``verify`` call of B rounds, γ draft tokens, the small world's
  vocabulary (V = 294), the batched PyTorch verifier and the float64 reference in one run
  (``over_reference``); bytes per call = the probabilities read.
- ``test_bench_tree_one_forward_vs_branches`` (SD-10) and ``test_bench_tokens_per_call`` (SD-14).

The technique's other benchmarks: ``bench_speculative_experiments.py`` (SD-1's calibration and
SD-3's grammatical fraction, statistical experiments of the main job) and
``bench_speculative_wallclock.py`` (SD-9: wall-clock speedup against target-only decoding).
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.benchmarks.timing import median_seconds, paired_ratios, ratio_estimate
from inference_conformance.conformance import results

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: (B, γ) per device.
SIZES = {"cuda": ((1, 4), (64, 4), (256, 8)), "cpu": ((16, 4),)}
V = 294


def pytest_generate_tests(metafunc):
    from inference_conformance.conformance.device import current_device

    if metafunc.definition.name == "test_bench_verify":
        sizes = SIZES[current_device()]
        metafunc.parametrize("B,gamma", sizes, ids=[f"B{b}-g{g}" for b, g in sizes])


def test_bench_verify(benchmark, device, B, gamma):
    from inference_conformance.optimized.speculative import verify
    from inference_conformance.reference.speculative import verify as verify_ref

    g = torch.Generator().manual_seed(0)
    q = torch.softmax(torch.randn(B, gamma, V, generator=g, dtype=torch.float64), -1).float().to(device)
    p = torch.softmax(torch.randn(B, gamma + 1, V, generator=g, dtype=torch.float64), -1).float().to(device)
    tok = torch.multinomial(q.reshape(-1, V).double().cpu(), 1, generator=g).reshape(B, gamma).to(device)
    gen = torch.Generator(device=device).manual_seed(1)
    repeats = 3 if benchmark.disabled else 20

    def run():
        return verify(tok, q, p, generator=gen)

    t = median_seconds(run, device, repeats)
    t_ref = median_seconds(lambda: verify_ref(tok, q, p, generator=gen), device, 3)
    nbytes = (q.numel() + p.numel()) * q.element_size()
    results.bench_info(benchmark, technique="speculative", backend="torch", device=device, dtype="float32",
                       batch=B, gamma=gamma, vocab_size=V, bytes=nbytes, median_s=t, reference_median_s=t_ref,
                       over_reference=t / t_ref,
                       goal="verifying up to 8 tokens <= 1.15x a one-token target step (memory-bound)")
    benchmark.pedantic(run, rounds=repeats, warmup_rounds=0)


# ------------------------------------------------------------ SD-10 / SD-14: token trees
#: Tree widths per depth (children of every node of that depth) per device: N nodes, depth len(widths).
TREE_WIDTHS = {"cuda": ((4, 2, 2), (8, 4, 2, 1)), "cpu": ((2, 2, 1),)}


def _tree_of(widths):
    parents, frontier = [], [-1]
    for w in widths:
        nxt = []
        for u in frontier:
            for _ in range(w):
                parents.append(u)
                nxt.append(len(parents) - 1)
        frontier = nxt
    return parents


def _branches(parents):
    """Each root-to-leaf path (node lists) of the tree."""
    kids = {i for i in parents if i >= 0}
    out = []
    for leaf in (i for i in range(len(parents)) if i not in kids):
        path, j = [], leaf
        while j >= 0:
            path.append(j)
            j = parents[j]
        out.append(path[::-1])
    return out


@pytest.mark.claim("SD-10")
@pytest.mark.parametrize("widths", [w for ws in TREE_WIDTHS.values() for w in ws], ids=lambda w: "w" + "-".join(map(str, w)))
def test_bench_tree_one_forward_vs_branches(benchmark, device, widths):
    """A token tree of N nodes scored in one target forward (tree attention) against its
    root-to-leaf branches scored one forward each (about N / depth forwards), the shipped target
    in float32 after a 32-token prefix: the ratio branches / tree (the Triton kernel on a GPU,
    the reference core on a CPU, where the interpreter's time would be measured instead)."""
    from inference_conformance.conformance.device import current_device
    from inference_conformance.optimized.speculative_tree.engine import TreeCachedModel
    from inference_conformance.smallworld.checkpoints import load_model

    if widths not in TREE_WIDTHS[current_device()]:
        pytest.skip(f"tree widths {widths} are measured on the other device")
    parents = _tree_of(widths)
    branches = _branches(parents)
    model = load_model("target", torch.float32, device)
    m = TreeCachedModel(model, 1, 128)
    m.attention = "triton" if device == "cuda" else "torch"
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(4, 294, (1, 32), generator=g).to(device)
    tokens = torch.randint(4, 294, (1, len(parents)), generator=g).to(device)
    par = torch.tensor(parents, dtype=torch.int64)
    m.start(1)
    m.extend(prefix, torch.tensor([32]))
    back = torch.tensor([32])

    def tree():
        m.tree_forward(tokens, par)
        m.rollback(back)

    def one_by_one():
        for path in branches:
            m.extend(tokens[:, path], torch.tensor([len(path)]), check_ids=False)
            m.rollback(back)

    repeats = 3 if benchmark.disabled else 15
    ratios = paired_ratios(one_by_one, tree, device, repeats)
    est = ratio_estimate(ratios)
    t_tree = median_seconds(tree, device, repeats)
    results.bench_info(benchmark, technique="speculative", backend=m.attention, device=device, dtype="float32",
                       batch=1, nodes=len(parents), median_s=t_tree, what="branch forwards / one tree forward",
                       forwards=len(branches), ratio=round(est.estimate, 3))
    results.record("SD-10", measured=round(est.estimate, 3), unit=f"time of {len(branches)} branch forwards / one tree "
                   f"forward ({len(parents)} nodes, {device})", nodes=len(parents))
    benchmark.pedantic(tree, rounds=repeats, warmup_rounds=0)


#: Drafters of the tokens-per-call table, and new tokens per prompt per device.
TPC_DRAFTERS = ("chain", "tree", "heads", "self", "lookup")
TPC_TOKENS = {"cuda": 48, "cpu": 16}


@pytest.mark.claim("SD-14")
@pytest.mark.parametrize("drafter", TPC_DRAFTERS)
def test_bench_tokens_per_call(benchmark, device, drafter):
    """Greedy tree speculation on the small world (the shipped target, float32) from two prompts
    (free generation from <bos>, and a copy prompt): tokens per target call and wall-clock
    tokens/s for a draft chain (γ = 4), a top-k draft tree (2, 2, 1), Medusa-style heads (2),
    self-speculation (block 1 skipped, γ = 4) and prompt lookup (3-grams, 5 tokens)."""
    import time

    from inference_conformance.conformance.device import current_device
    from inference_conformance.optimized.drafter import (ChainDrafter, HeadsDrafter, SelfSpeculativeDrafter,
                                                         TopKTreeDrafter)
    from inference_conformance.reference.drafter import PromptLookupDrafter
    from inference_conformance.optimized.speculative_tree.engine import TreeSpeculativeEngine
    from inference_conformance.smallworld.checkpoints import load_model
    from inference_conformance.smallworld.data import encode, split
    from inference_conformance.smallworld.tokenizer import tokenizer

    target = load_model("target", torch.float32, device)
    draft = load_model("draft_good", torch.float32, device)
    if drafter == "heads":
        from inference_conformance.smallworld.heads import shipped_heads

        heads = shipped_heads().over(target)
    d = {"chain": lambda: ChainDrafter(draft, 4), "tree": lambda: TopKTreeDrafter(draft, (2, 2, 1)),
         "heads": lambda: HeadsDrafter(heads), "self": lambda: SelfSpeculativeDrafter((1,), 4),
         "lookup": lambda: PromptLookupDrafter(3, 5)}[drafter]()
    doc = encode(split("val", 1))[0]
    prompts = [torch.tensor([[tokenizer().bos_id]]), torch.tensor([doc[:-1] + doc[:4]])]
    n = TPC_TOKENS[current_device()]
    attention = "triton" if device == "cuda" else "torch"
    total = {"rounds": 0, "emitted": 0}
    t0 = time.perf_counter()
    for p in prompts:
        _, s = TreeSpeculativeEngine(target, d, max_seq_len=128, attention=attention).generate(p.to(device), n)
        total = {k: total[k] + s[k] for k in total}
    wall = time.perf_counter() - t0
    tpc = total["emitted"] / total["rounds"]
    results.bench_info(benchmark, technique="speculative", backend=attention, device=device, dtype="float32",
                       batch=1, drafter=drafter, tokens_per_call=round(tpc, 3), rounds=total["rounds"],
                       tokens_per_s=total["emitted"] / wall)
    results.record("SD-14", measured=round(tpc, 3), unit=f"tokens per target call, {drafter} (benchmark prompts)",
                   drafter=drafter, tokens_per_call=round(tpc, 3), rounds=total["rounds"])
    benchmark.pedantic(lambda: None, rounds=1, warmup_rounds=0)
