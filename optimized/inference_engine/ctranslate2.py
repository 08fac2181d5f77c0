"""CTranslate2's ``Generator`` under the ``inference_engine`` contract (peer set "engines":
``tox -e peers-engines``). The exported folder is converted once per process by CTranslate2's own
``TransformersConverter`` (float32); the adapter translates only settings and ids: ids become the
suite's token strings (the folder's word-level ``tokenizer.json``) and back; greedy is
``sampling_topk=1``; sampling is ``sampling_topk=0`` (the full vocabulary) with
``sampling_temperature`` and ``sampling_topp``, seeded by ``ctranslate2.set_random_seed`` once per
call ("batch" seeding); the stop token is removed with ``end_token=[]``; the prompt is forwarded
whole (``include_prompt_in_result=False``); logprobs are the log-softmax of
``return_logits_vocab``'s raw logits. One batch per call, padded by CTranslate2 itself.
"""
from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

import numpy as np
import torch

from inference_conformance.conformance.contracts.inference_engine import (
    Capabilities,
    Completion,
    check_vocab,
    refuse_unoffered,
    validate,
)


class CT2Generate:
    """CTranslate2 4.x ``Generator`` on the CPU, float32, one intra-op thread."""

    def __init__(self):
        self._generators: dict = {}
        self._vocab: dict = {}

    def capabilities(self) -> Capabilities:
        return Capabilities(dtype=torch.float32, batching=True, seeded_sampling="batch", top_p=True,
                            logprobs=True, batch_invariant=False)

    def generator(self, folder):
        key = str(folder)
        if key not in self._generators:
            import ctranslate2
            from ctranslate2.converters import TransformersConverter

            out = Path(tempfile.mkdtemp(prefix="ct2-")) / "model"
            TransformersConverter(key).convert(str(out), quantization="float32", force=True)
            self._generators[key] = ctranslate2.Generator(str(out), device="cpu", compute_type="float32",
                                                          intra_threads=1)
            vocab = json.loads((Path(key) / "tokenizer.json").read_text())["model"]["vocab"]
            self._vocab[key] = (vocab, {i: w for w, i in vocab.items()})
        return self._generators[key], self._vocab[key]

    @torch.no_grad()
    def generate(self, requests, params) -> list[Completion]:
        import ctranslate2

        validate(requests, params)
        refuse_unoffered(self.capabilities(), requests, params, "CTranslate2")
        gen, (stoi, itos) = self.generator(params.model)
        check_vocab(requests, len(stoi))
        n = max(r.max_new_tokens for r in requests)
        kw = dict(max_length=n, end_token=[], include_prompt_in_result=False, return_logits_vocab=True)
        if params.temperature == 0:
            kw.update(sampling_topk=1)
        else:
            kw.update(sampling_topk=0, sampling_topp=float(params.top_p), sampling_temperature=float(params.temperature))
            seeds = ",".join(str(r.seed) for r in requests)
            ctranslate2.set_random_seed(int(hashlib.sha256(seeds.encode()).hexdigest()[:8], 16))
        results = gen.generate_batch([[itos[t] for t in r.prompt] for r in requests], **kw)
        out = []
        for r, res in zip(requests, results):
            k = r.max_new_tokens
            t = torch.tensor([stoi[w] for w in res.sequences[0][:k]], dtype=torch.int64)
            logits = torch.from_numpy(np.array(res.logits[0])).double()                  # (steps, V)
            lp = torch.log_softmax(logits[-len(res.sequences[0]):][:k], -1)
            out.append(Completion(t, lp[torch.arange(k), t]))
        return out
