"""One ``propose`` of every drafter (``drafter``, SD-12, SD-14): seconds per call, every drafter in
one run, beside the reference.

Each row times one call of the drafter on the committed tokens of a copy prompt (the first
validation document without its end, then its first 4 tokens again) with the shipped target in
float32 on the device and its final hidden state at the last token (for heads). ``nodes``: the
nodes it proposed; ``over_reference``: the time over the reference drafter's (prompt lookup) in
the same run. With ``--impl drafter=module:attr`` the rows ``impl``, ``impl2``, ... time outside
drafters. Figures only: no speed is asserted (a drafter's worth is its tokens per target call,
measured by SD-14's law; its cost here).
"""
from __future__ import annotations

import pytest
import torch

from inference_conformance.benchmarks.timing import median_seconds, rounds
from inference_conformance.conformance import results
from inference_conformance.conformance.bench_rows import bench_backends, bench_implementation, outside_info, outside_refusals

#: The suite's drafters timed in every run.
BUILTINS = ("reference", "draft_chain", "draft_tree", "heads", "self_speculation", "vllm_ngram")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _drafter(backend: str, device: str):
    return bench_implementation("drafter", backend, device)


def _inputs(device: str):
    """(context ids, hidden (d_model,), target) on ``device``: a copy prompt, float32 target."""
    from inference_conformance.properties.speculative.sd14_cases import copy_prompts
    from inference_conformance.smallworld.checkpoints import load_model
    from inference_conformance.smallworld.heads import hidden_states

    target = load_model("target", torch.float32, device)
    prompt = copy_prompts(1)[0].to(device)
    return prompt[0].tolist(), hidden_states(target, prompt)[0, -1], target


@pytest.mark.parametrize("backend", bench_backends("drafter", BUILTINS))
def test_bench_drafter(benchmark, device, backend):
    drafter, reference = _drafter(backend, device), _drafter("reference", device)
    context, hidden, target = _inputs(device)
    repeats = 3 if benchmark.disabled else 10
    with outside_refusals("drafter", backend):
        parents, tokens = drafter.propose(list(context), hidden, target)
        t = median_seconds(lambda: drafter.propose(list(context), hidden, target), device, repeats)
    t_ref = median_seconds(lambda: reference.propose(list(context), hidden, target), device, repeats)
    results.bench_info(benchmark, technique="drafter", backend=backend, device=device, dtype="float32",
                       context=len(context), nodes=len(tokens), what="one propose on a copy prompt", median_s=t,
                       reference_median_s=t_ref, over_reference=t / t_ref, **outside_info("drafter", backend))
    benchmark.pedantic(lambda: drafter.propose(list(context), hidden, target), rounds=rounds(benchmark, t, repeats),
                       warmup_rounds=0)
