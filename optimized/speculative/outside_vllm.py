"""vLLM's rejection sampler under the ``speculative`` contract (``optimized/paged_attention/outside_vllm.py``
holds the other vLLM adapters, :func:`inference_conformance.optimized.vllm_shared.vllm_module` the import
of vLLM): ``vllm.v1.sample.rejection_sampler.rejection_sample`` with flattened draft tokens and probabilities, the target as logits
(log-probabilities; its softmax
is in float32), the bonus token drawn beforehand by vLLM's ``random_sample``, one
``torch.Generator`` per request in ``SamplingMetadata.generators``. Its Triton kernels run
interpreted on a CPU. The environment: ``requirements/peers-vllm.txt`` (``tox -e peers-vllm``).
"""
from __future__ import annotations

import sys

import torch

from inference_conformance.conformance.contracts.speculative import PAD
from inference_conformance.conformance.contracts.speculative import validate as validate_verify
from inference_conformance.optimized.vllm_shared import vllm_module


def _sampling_metadata(B: int, generators: dict, greedy: bool, device):
    md = vllm_module("vllm.v1.sample.metadata")
    return md.SamplingMetadata(
        temperature=torch.full((B,), 0.0 if greedy else 1.0, dtype=torch.float32, device=device),
        all_greedy=greedy, all_random=not greedy, top_p=None, top_k=None, generators=generators,
        max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(B, device=device), presence_penalties=torch.zeros(B, device=device),
        repetition_penalties=torch.ones(B, device=device), output_token_ids=[[] for _ in range(B)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=None)


def _rejection(draft_tokens, draft_probs, target_probs, generator, *, greedy: bool):
    s = validate_verify(draft_tokens, draft_probs, target_probs, generator)
    rs = vllm_module("vllm.v1.sample.rejection_sampler")
    sampler = vllm_module("vllm.v1.sample.ops.topk_topp_sampler")
    dev = draft_tokens.device
    B, g, V = s.B, s.gamma, s.V
    # one generator per request, seeded from the contract's generator (vLLM's seeded requests)
    seeds = torch.randint(0, 2**62, (B,), generator=generator, device=dev).tolist()
    gens = {} if greedy else {i: torch.Generator(device=dev).manual_seed(int(x)) for i, x in enumerate(seeds)}
    p32 = target_probs.to(torch.float32)
    with torch.no_grad():
        logits = p32.log()                                                          # (B, γ+1, V); log 0 = -inf
        if greedy:
            bonus = logits[:, g].argmax(-1)
        else:
            bonus = sampler.random_sample(p32[:, g].contiguous(), gens)           # vLLM's sampler
        tokens = rs.rejection_sample(
            draft_tokens.reshape(B * g).contiguous(), [g] * B, g,
            torch.arange(1, B + 1, dtype=torch.int32, device=dev) * g,
            None if greedy else draft_probs.to(torch.float32).reshape(B * g, V).contiguous(),
            logits[:, :g].reshape(B * g, V).contiguous(), bonus.reshape(B, 1).to(torch.int64).contiguous(),
            _sampling_metadata(B, gens, greedy, dev))
    tokens = tokens.to(torch.int64)
    placeholder = rs.PLACEHOLDER_TOKEN_ID
    emitted = (tokens != placeholder).sum(1)                                        # accepted + 1
    tokens = torch.where(tokens == placeholder, torch.full_like(tokens, PAD), tokens)
    return tokens, (emitted - 1).clamp(min=0)


def rejection_sample(draft_tokens, draft_probs, target_probs, *, generator):
    """The speculative contract through vLLM's ``rejection_sample`` (sampled requests, claim
    SD-1): draft_tokens (B, γ) int64; draft_probs (B, γ, V); target_probs (B, γ+1, V) -> tokens
    (B, γ+1) int64 (−1 padding) and num_accepted (B,) int64. The target goes in as log-probabilities
    (vLLM takes logits and its softmax is in float32: probabilities of other dtypes are rounded
    to float32); each request gets its own ``torch.Generator`` seeded from ``generator``; the bonus
    token is drawn by vLLM's ``random_sample`` from target_probs[:, γ]. Raises TypeError /
    ValueError as the contract's ``validate``."""
    return _rejection(draft_tokens, draft_probs, target_probs, generator, greedy=False)


def rejection_greedy(draft_tokens, draft_probs, target_probs, *, generator):
    """vLLM's ``rejection_sample`` for greedy requests (temperature 0): a draft token is accepted
    iff it is the target's argmax, the first mismatch emits that argmax, the bonus is the argmax
    of target_probs[:, γ]. Shapes as :func:`rejection_sample`; the generator is not used
    (greedy is deterministic). Not the speculative contract's sampling rule (SD-1): the greedy
    equality it promises is claim SD-7; raises TypeError / ValueError as ``validate``."""
    return _rejection(draft_tokens, draft_probs, target_probs, generator, greedy=True)


def speculative_registrations():
    """The speculative adapter ``vllm_triton_rejection`` (vLLM's rejection sampler, sampled requests;
    its Triton kernels interpreted on a CPU). The greedy path, :func:`rejection_greedy`, follows
    another rule than the contract's and is checked by SD-7 instead."""
    from inference_conformance.conformance.registry import builtin

    return (builtin("speculative", "vllm_triton_rejection", rejection_sample, needs="vllm", adapter=True,
                    kernel_modules=(sys.modules[__name__],)),)
