"""mistral.rs (the ``mistralrs`` Python package, 0.9.x) under the ``inference_engine`` contract (peer
set "mistralrs": ``tox -e peers-mistralrs``). mistral.rs loads the exported folder itself
(``Which.Plain``, ``Architecture.Llama``, ``ModelDType.F32``) on the CPU; the adapter translates only
settings and ids, with three workarounds of the Python API, each forced by mistral.rs's own words:

* its prompts are text only (``CompletionRequest.prompt`` / ``ChatCompletionRequest.messages``: "argument
  'prompt': 'list' object cannot be converted to 'PyString'"), so ids become the suite's token
  strings joined by spaces (the folder's word-level ``tokenizer.json`` with a whitespace
  pre-tokenizer); every prompt is re-tokenized by mistral.rs (``tokenize_text``) and refused unless
  it gives the same ids back;
* it refuses a ``tokenizer.json`` without a byte-level or byte-fallback decoder ("can't determine
  decoder type: None"), so a staging folder holds a copy whose decoder is
  ``Sequence[ByteFallback, WordPiece]`` (the word-level vocabulary has no byte tokens and no "##"
  pieces: the ids are unchanged) next to links to ``config.json`` and ``model.safetensors``; the
  folder's ``generation_config.json`` (``do_sample: false``, written for transformers) is left out,
  as mistral.rs lets it override every request's temperature (greedy tokens at T = 3);
* logprobs come only from chat completions, and chat completions only with a chat template
  ("Received messages for a model which does not have a chat template"), so the staging folder
  holds the identity template (the one user message's content, nothing added).

mistral.rs keeps the KV cache in float16 on the CPU whatever the model's dtype ("Using f16 KV
cache on CPU (set MISTRALRS_CPU_KV_F32=1 for f32)"): the adapter asks for float32 and sets
``MISTRALRS_CPU_KV_F32=1`` before it builds a Runner, so that the cache is float32 too (with
float16 keys and values its logprobs were 2.8e-3 off the float64 reference at 37 tokens, 19 times
the float32 bound; 5e-7 with it: ``tests/test_outside_mistralrs.py``).

Each request is one ``send_chat_completion_request`` (``ignore_eos=True``, ``max_tokens``,
``temperature`` 0 for greedy, else its temperature and ``top_p``, ``logprobs=True``), sent in turn:
the ``Runner`` is not re-entrant ("Already borrowed" from a second thread), so a call's requests run
one after another and each has its own sampling parameters. The chosen tokens come back as strings
(``Logprobs.content[i].token``) and are mapped to ids through the vocabulary; their logprobs are
mistral.rs's. Sampling is unseeded: ``Runner(seed=...)`` is refused on the CPU ("cannot seed the
CPU rng with set_seed"), so a sampled request with a seed is refused (NotImplementedError), and
unseeded sampled requests are accepted.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

from inference_conformance.conformance.contracts.inference_engine import (
    Capabilities,
    Completion,
    check_vocab,
    refuse_unoffered,
    sampling_of,
    validate,
)

DECODER = {"type": "Sequence", "decoders": [{"type": "ByteFallback"},
                                             {"type": "WordPiece", "prefix": "##", "cleanup": False}]}
TEMPLATE = "{{ messages[0]['content'] }}"


def stage(folder) -> Path:
    """A folder mistral.rs loads: links to the weights and config, the tokenizer with a decoder it
    accepts, the identity chat template; no generation_config.json."""
    src = Path(folder)
    out = Path(tempfile.mkdtemp(prefix="mistralrs-"))
    for name in ("config.json", "model.safetensors"):
        (out / name).symlink_to(src.resolve() / name)
    tok = json.loads((src / "tokenizer.json").read_text())
    if tok["model"].get("type") != "WordLevel":
        raise NotImplementedError(f"the mistral.rs adapter maps ids through a word-level vocabulary, not "
                                  f"{tok['model'].get('type')!r}")
    tok["decoder"] = DECODER
    (out / "tokenizer.json").write_text(json.dumps(tok))
    (out / "template.jinja").write_text(TEMPLATE)
    return out


class MistralRS:
    """mistral.rs's ``Runner`` on the CPU, float32, one request at a time."""

    def __init__(self):
        self._runners: dict = {}

    def capabilities(self) -> Capabilities:
        return Capabilities(dtype=torch.float32, batching=True, seeded_sampling="none", top_p=True, logprobs=True,
                            batch_invariant=False, per_request_params=True)

    def runner(self, folder):
        key = str(folder)
        if key not in self._runners:
            from mistralrs import Architecture, ModelDType, Runner, Which

            os.environ["MISTRALRS_CPU_KV_F32"] = "1"     # read when the Runner is built (module docstring)
            staged = stage(folder)
            vocab = json.loads((staged / "tokenizer.json").read_text())["model"]["vocab"]
            run = Runner(which=Which.Plain(model_id=str(staged), arch=Architecture.Llama, dtype=ModelDType.F32),
                         token_source="none", jinja_explicit=str(staged / "template.jinja"))
            self._runners[key] = (run, vocab, {i: w for w, i in vocab.items()})
        return self._runners[key]

    def generate(self, requests, params) -> list[Completion]:
        from mistralrs import ChatCompletionRequest

        validate(requests, params)
        refuse_unoffered(self.capabilities(), requests, params, "mistral.rs")
        if any(r.seed is not None and sampling_of(r, params)[0] > 0 for r in requests):
            raise NotImplementedError("mistral.rs samples unseeded on the CPU (Runner(seed=...): \"cannot seed the CPU rng "
                                      "with set_seed\"); a seeded sampled request is refused")
        run, stoi, itos = self.runner(params.model)
        check_vocab(requests, len(stoi))
        out = []
        for i, r in enumerate(requests):
            text = " ".join(itos[t] for t in r.prompt)
            back = list(run.tokenize_text(text, False, False))
            if back != list(r.prompt):
                raise NotImplementedError(f"mistral.rs takes text prompts only; requests[{i}].prompt does not survive "
                                          f"the round trip through text ({list(r.prompt)} -> {back})")
            temperature, top_p = sampling_of(r, params)
            kw = dict(temperature=0.0) if temperature == 0 else dict(temperature=float(temperature),
                                                                     top_p=float(top_p))
            res = run.send_chat_completion_request(ChatCompletionRequest(
                messages=[{"role": "user", "content": text}], model="default", max_tokens=r.max_new_tokens,
                ignore_eos=True, logprobs=True, **kw))
            if res.usage.prompt_tokens != len(r.prompt):
                raise RuntimeError(f"mistral.rs read {res.usage.prompt_tokens} prompt tokens for requests[{i}], "
                                   f"not {len(r.prompt)}")
            content = res.choices[0].logprobs.content
            tokens = torch.tensor([stoi[c.token] for c in content], dtype=torch.int64)
            logprobs = torch.tensor([c.logprob for c in content], dtype=torch.float64)
            out.append(Completion(tokens, logprobs))
        return out
