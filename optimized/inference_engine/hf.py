"""transformers' ``generate`` under the ``inference_engine`` contract: ``LlamaForCausalLM`` read from the
exported folder in float32, token ids in, no tokenizer. The adapter translates only settings,
padding and ids: a batch is left-padded with ``<pad>`` and its attention mask; the stop token is
removed (``eos_token_id`` None in the generation config: the contract generates exactly
``max_new_tokens``); greedy is ``do_sample=False``; sampling is ``do_sample=True`` with
``temperature``, ``top_p`` and ``top_k=0``, seeded through ``torch.manual_seed`` once per call
(transformers samples from the global generator: "batch" seeding, the caller's generator state
restored); logprobs from ``output_logits`` (raw logits). Speculative methods: "draft" is assisted
generation with the draft folder as ``assistant_model``, "ngram" prompt lookup
(``prompt_lookup_num_tokens``); transformers runs both one sequence at a time, so the adapter
sends a speculative batch request by request.

Registrations (``peer="hf"``: they run in ``tox -e peers-hf``): ``hf_dynamic`` (the default
DynamicCache, with the speculative methods), ``hf_static`` (``cache_implementation="static"``),
``hf_nocache`` (``use_cache=False``).
"""
from __future__ import annotations

import hashlib

import torch

from inference_conformance.conformance.contracts.inference_engine import (
    Capabilities,
    Completion,
    check_vocab,
    refuse_unoffered,
    validate,
)

PAD_ID = 0


class HFGenerate:
    """One transformers configuration (``cache``: "dynamic", "static" or "none")."""

    def __init__(self, cache: str = "dynamic"):
        self.cache = cache
        self._models: dict = {}

    def capabilities(self) -> Capabilities:
        spec = ("draft", "ngram") if self.cache == "dynamic" else ()
        return Capabilities(dtype=torch.float32, batching=True, padding=("left",), speculative=spec,
                            seeded_sampling="batch", top_p=True, logprobs=True, batch_invariant=False)

    def model(self, folder):
        if str(folder) not in self._models:
            from transformers import LlamaForCausalLM

            m = LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
            m.generation_config.eos_token_id = None
            m.generation_config.pad_token_id = PAD_ID
            self._models[str(folder)] = m
        return self._models[str(folder)]

    def _kwargs(self, params, n: int) -> dict:
        kw = dict(max_new_tokens=n, min_new_tokens=None, eos_token_id=None, pad_token_id=PAD_ID,
                  return_dict_in_generate=True, output_logits=True)
        if params.temperature == 0:
            kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kw.update(do_sample=True, temperature=float(params.temperature), top_p=float(params.top_p), top_k=0)
        if self.cache == "static":
            kw["cache_implementation"] = "static"
        elif self.cache == "none":
            kw["use_cache"] = False
        if params.speculative == "draft":
            kw.update(assistant_model=self.model(params.draft), num_assistant_tokens=params.num_speculative_tokens,
                      num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)
        elif params.speculative == "ngram":
            kw["prompt_lookup_num_tokens"] = params.num_speculative_tokens
        return kw

    def _run(self, model, prompts: list, params) -> tuple:
        """Left-padded ids (B, S) and their attention mask (B, S)."""
        n = max(len(p) for p in prompts)
        ids = torch.tensor([[PAD_ID] * (n - len(p)) + list(p) for p in prompts])               # (B, S) left-padded
        mask = torch.tensor([[0] * (n - len(p)) + [1] * len(p) for p in prompts])
        return ids, mask

    @torch.no_grad()
    def generate(self, requests, params) -> list[Completion]:
        validate(requests, params)
        refuse_unoffered(self.capabilities(), requests, params, f"transformers ({self.cache} cache)")
        model = self.model(params.model)
        check_vocab(requests, model.config.vocab_size)
        groups = [[i] for i in range(len(requests))] if params.speculative else [list(range(len(requests)))]
        seeds = ",".join(str(r.seed) for r in requests)
        out: list = [None] * len(requests)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(hashlib.sha256(seeds.encode()).hexdigest()[:12], 16))
            for group in groups:
                ids, mask = self._run(model, [requests[i].prompt for i in group], params)
                calls = []                                                  # the target's forward passes
                hook = model.register_forward_hook(lambda *_: calls.append(1))
                try:
                    k_max = max(requests[i].max_new_tokens for i in group)
                    res = model.generate(input_ids=ids, attention_mask=mask, **self._kwargs(params, k_max))
                finally:
                    hook.remove()
                new = res.sequences[:, ids.shape[1]:]                                           # (B, n)
                lp = torch.log_softmax(torch.stack(res.logits, 1).double(), -1)                # (B, n, V)
                for row, i in enumerate(group):
                    k = requests[i].max_new_tokens
                    t = new[row, :k].clone()
                    # speculation runs one request at a time: its pass count is the request's
                    spec = dict(target_calls=len(calls), accepted=k - len(calls)) if params.speculative else {}
                    out[i] = Completion(t, lp[row, torch.arange(k), t], **spec)
        return out


def registrations():
    from inference_conformance.conformance.registry import builtin

    return (
        builtin("inference_engine", "hf_dynamic", HFGenerate("dynamic"), needs="transformers", adapter=True, peer="hf"),
        builtin("inference_engine", "hf_static", HFGenerate("static"), needs="transformers", adapter=True, peer="hf"),
        builtin("inference_engine", "hf_nocache", HFGenerate("none"), needs="transformers", adapter=True, peer="hf"),
    )
