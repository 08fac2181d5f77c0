"""onnxruntime-genai under the ``inference_engine`` contract (peer set "engines": ``tox -e
peers-engines``). The exported folder becomes an ONNX model once per process through
onnxruntime-genai's own model builder (``python -m onnxruntime_genai.models.builder -p fp32 -e
cpu``). The adapter translates only settings and ids: onnxruntime-genai wants a stop id inside
the vocabulary, so the stop token is moved from ``<eos>`` to ``<pad>`` (id 0) in
``genai_config.json``, an id the small world's models never emit (were it emitted, the output
would come back short and fail the laws, never pass them); greedy is ``do_sample=False,
top_k=1``; sampling is ``do_sample=True`` with ``temperature``, ``top_p`` and ``top_k`` = the
vocabulary (no truncation), seeded per request with ``random_seed``; logprobs are the log-softmax
of ``get_logits()`` before each token.

What the library offers, declared and used: batching (a greedy call of several requests is one
generator with the ``batch_size`` search option and a padded 2-D ``append_tokens``, on the side
``params.padding`` names, right by default, with the ``pad_token_id`` of ``genai_config.json``,
id 0, which the small world's prompts never hold: the library takes both sides without an error,
and EN-2 finds its left-padded rows wrong: tests/test_outside_ort_genai.py); n-gram (prompt lookup)
speculation, ``set_speculative_options(ngram_size=2, max_draft_tokens=γ)`` (one request per
generator: the library speculates at batch size 1 only; no logits while it speculates, so no
logprobs; its ``get_speculative_stats()`` give the counts) and draft-model speculation (the
draft folder built the same way, its decoder block as ``model.draft`` of the target's
``genai_config.json``, its files in ``draft/``; ``max_draft_tokens`` = γ). A sampled call runs one
generator per request: the library seeds a generator (``random_seed``), not a row of one, and
the contract's seeds are per request. Not adapted yet: ``og.Engine`` (continuous batching, with
per-turn seeds and cached-prompt counts), so no prefix caching, chunked prefill or ``serve``.
"""
from __future__ import annotations

import json
import shutil
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
    folder_vocab_size,
    refuse_unoffered,
    validate,
)

STOP_ID = 0


class OrtGenAI:
    """onnxruntime-genai 0.18 on the CPU, float32."""

    #: n-gram order of the prompt lookup (matches the last token: the small world's prompts are short)
    NGRAM = 2

    def __init__(self):
        self._models: dict = {}
        self._built: dict = {}

    def capabilities(self) -> Capabilities:
        return Capabilities(dtype=torch.float32, batching=True, padding=("left", "right"),
                            speculative=("draft", "ngram"), seeded_sampling="request", top_p=True, logprobs=True,
                            batch_invariant=False)

    def _build(self, folder) -> Path:
        """The folder's ONNX model, built once by the library's model builder, stop id moved."""
        key = str(folder)
        if key not in self._built:
            out = Path(tempfile.mkdtemp(prefix="ort-genai-")) / "model"
            subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", key, "-o", str(out),
                            "-p", "fp32", "-e", "cpu"], check=True, capture_output=True, text=True)
            cfg_path = out / "genai_config.json"
            cfg = json.loads(cfg_path.read_text())
            cfg["model"]["eos_token_id"] = STOP_ID
            cfg_path.write_text(json.dumps(cfg))
            self._built[key] = out
        return self._built[key]

    def model(self, folder, draft=None):
        """(og.Model, pad id) of ``folder``; with ``draft``, the target and the draft in one
        configuration (the draft's decoder block as ``model.draft``, its files in ``draft/``)."""
        key = (str(folder), None if draft is None else str(draft))
        if key not in self._models:
            import onnxruntime_genai as og

            out = self._build(folder)
            if draft is not None:
                both = Path(tempfile.mkdtemp(prefix="ort-genai-")) / "model"
                shutil.copytree(out, both)
                (both / "draft").mkdir()
                d = self._build(draft)
                for f in d.iterdir():
                    if f.name.endswith((".onnx", ".data")):
                        shutil.copy(f, both / "draft" / f.name)
                cfg = json.loads((both / "genai_config.json").read_text())
                block = json.loads((d / "genai_config.json").read_text())["model"]["decoder"]
                cfg["model"]["draft"] = dict(block, filename="draft/" + block["filename"])
                (both / "genai_config.json").write_text(json.dumps(cfg))
                out = both
            cfg = json.loads((out / "genai_config.json").read_text())
            self._models[key] = (og.Model(str(out)), int(cfg["model"]["pad_token_id"]))
        return self._models[key]

    @torch.no_grad()
    def generate(self, requests, params) -> list[Completion]:
        validate(requests, params)
        refuse_unoffered(self.capabilities(), requests, params, "onnxruntime-genai")
        model, pad = self.model(params.model, params.draft if params.speculative == "draft" else None)
        V = folder_vocab_size(params.model)
        check_vocab(requests, V)
        if len(requests) > 1 and params.temperature == 0 and params.speculative is None:
            return self._batch(model, pad, requests, params.padding or "right")
        return [self._one(model, r, params, V) for r in requests]

    def _batch(self, model, pad: int, requests, side: str) -> list[Completion]:
        """Greedy requests as one generator: rows padded with ``pad`` on ``side``."""
        import onnxruntime_genai as og

        T, n = max(len(r.prompt) for r in requests), max(r.max_new_tokens for r in requests)
        rows = [[pad] * (T - len(r.prompt)) + list(r.prompt) if side == "left" else list(r.prompt) + [pad] * (T - len(r.prompt))
                for r in requests]
        gp = og.GeneratorParams(model)
        gp.set_search_options(max_length=T + n, do_sample=False, top_k=1, batch_size=len(rows))
        gen = og.Generator(model, gp)
        gen.append_tokens(np.array(rows, dtype=np.int32))
        toks, lps = [], []
        while len(toks) < n and not gen.is_done():
            logits = torch.from_numpy(np.array(gen.get_logits()).reshape(len(rows), -1)).double()     # (B, V)
            gen.generate_next_token()
            t = torch.from_numpy(np.array(gen.get_next_tokens()).astype(np.int64))                # (B,)
            toks.append(t)
            lps.append(torch.log_softmax(logits, -1)[torch.arange(len(rows)), t])
        tokens, logprobs = torch.stack(toks, 1), torch.stack(lps, 1)                                # (B, n)
        return [Completion(tokens[i, :r.max_new_tokens].clone(), logprobs[i, :r.max_new_tokens].clone())
                for i, r in enumerate(requests)]

    def _one(self, model, r, params, V: int) -> Completion:
        import onnxruntime_genai as og

        gp = og.GeneratorParams(model)
        opts = dict(max_length=len(r.prompt) + r.max_new_tokens)
        if params.temperature == 0:
            opts.update(do_sample=False, top_k=1)
        else:
            opts.update(do_sample=True, temperature=float(params.temperature), top_p=float(params.top_p), top_k=V)
            if r.seed is not None:
                opts["random_seed"] = int(r.seed)
        gp.set_search_options(**opts)
        spec = params.speculative is not None
        if spec:
            gp.set_speculative_options(max_draft_tokens=int(params.num_speculative_tokens),
                                       **({"ngram_size": self.NGRAM} if params.speculative == "ngram" else {}))
        gen = og.Generator(model, gp)
        gen.append_tokens(np.array([list(r.prompt)], dtype=np.int32))
        toks, lps = [], []
        while len(toks) < r.max_new_tokens and not gen.is_done():
            logits = None if spec else torch.from_numpy(np.array(gen.get_logits()).reshape(-1)).double()
            gen.generate_next_token()
            t = int(gen.get_next_tokens()[0])
            toks.append(t)
            if logits is not None:
                lps.append(float(torch.log_softmax(logits, -1)[t]))
        tokens = torch.tensor(toks, dtype=torch.int64)
        if not spec:
            return Completion(tokens, torch.tensor(lps, dtype=torch.float64))
        st = gen.get_speculative_stats()
        return Completion(tokens, None, target_calls=int(st["target_forward_passes"]),
                          drafted=int(st["draft_tokens_proposed"]), accepted=int(st["draft_tokens_accepted"]))
