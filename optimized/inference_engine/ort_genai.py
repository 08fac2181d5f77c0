"""onnxruntime-genai under the ``inference_engine`` contract (peer set "engines": ``tox -e
peers-engines``). The exported folder becomes an ONNX model once per process through
onnxruntime-genai's own model builder (``python -m onnxruntime_genai.models.builder -p fp32 -e
cpu``). The adapter translates only settings and ids: onnxruntime-genai wants a stop id inside
the vocabulary, so the stop token is moved from ``<eos>`` to ``<pad>`` (id 0) in
``genai_config.json``, an id the small world's models never emit (were it emitted, the output
would come back short and fail the laws, never pass them); greedy is ``do_sample=False,
top_k=1``; sampling is ``do_sample=True`` with ``temperature``, ``top_p`` and ``top_k`` = the
vocabulary (no truncation), seeded per request with ``random_seed``; logprobs are the log-softmax
of ``get_logits()`` before each token. One request at a time (no batching declared).
"""
from __future__ import annotations

import json
import subprocess
import sys
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

STOP_ID = 0


class OrtGenAI:
    """onnxruntime-genai 0.18 on the CPU, float32."""

    def __init__(self):
        self._models: dict = {}

    def capabilities(self) -> Capabilities:
        return Capabilities(dtype=torch.float32, batching=False, seeded_sampling="request", top_p=True,
                            logprobs=True, batch_invariant=False)

    def model(self, folder):
        key = str(folder)
        if key not in self._models:
            import onnxruntime_genai as og

            out = Path(tempfile.mkdtemp(prefix="ort-genai-")) / "model"
            subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", key, "-o", str(out),
                            "-p", "fp32", "-e", "cpu"], check=True, capture_output=True, text=True)
            cfg_path = out / "genai_config.json"
            cfg = json.loads(cfg_path.read_text())
            cfg["model"]["eos_token_id"] = STOP_ID
            cfg_path.write_text(json.dumps(cfg))
            self._models[key] = og.Model(str(out))
        return self._models[key]

    @torch.no_grad()
    def generate(self, requests, params) -> list[Completion]:
        import onnxruntime_genai as og

        validate(requests, params)
        refuse_unoffered(self.capabilities(), requests, params, "onnxruntime-genai")
        model = self.model(params.model)
        V = json.loads((Path(params.model) / "config.json").read_text())["vocab_size"]
        check_vocab(requests, V)
        out = []
        for r in requests:
            gp = og.GeneratorParams(model)
            opts = dict(max_length=len(r.prompt) + r.max_new_tokens)
            if params.temperature == 0:
                opts.update(do_sample=False, top_k=1)
            else:
                opts.update(do_sample=True, temperature=float(params.temperature), top_p=float(params.top_p), top_k=V)
                if r.seed is not None:
                    opts["random_seed"] = int(r.seed)
            gp.set_search_options(**opts)
            gen = og.Generator(model, gp)
            gen.append_tokens([list(r.prompt)])
            toks, lps = [], []
            while len(toks) < r.max_new_tokens and not gen.is_done():
                logits = torch.from_numpy(np.array(gen.get_logits()).reshape(-1)).double()
                gen.generate_next_token()
                t = int(gen.get_next_tokens()[0])
                toks.append(t)
                lps.append(float(torch.log_softmax(logits, -1)[t]))
            out.append(Completion(torch.tensor(toks, dtype=torch.int64), torch.tensor(lps, dtype=torch.float64)))
        return out
