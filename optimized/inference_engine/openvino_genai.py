"""OpenVINO GenAI under the ``inference_engine`` contract (peer set "openvino": ``tox -e
peers-openvino``). The exported folder becomes an OpenVINO IR once, by optimum-intel's documented
exporter (``optimum-cli export openvino --weight-format fp32 --task text-generation-with-past``,
which also converts the tokenizer with openvino-tokenizers: the pipelines read it, the adapter
never uses it), into ``NAME.openvino`` beside the folder, reused while the stamp of the folder's
``config.json`` and ``model.safetensors`` (their SHA-256) matches. Every pipeline is compiled for
the CPU with ``INFERENCE_PRECISION_HINT=f32`` and ``KV_CACHE_PRECISION=f32``: on a CPU with
bf16 (AMX, AVX512-BF16) OpenVINO otherwise computes in bf16 and keeps the KV cache in u8.

Two registrations:

``openvino_genai``: ``ContinuousBatchingPipeline`` (a paged KV cache), prompts given as
``ov.Tensor`` ids through ``add_request`` and the pipeline stepped with ``step()`` until every
handle is done. The adapter translates only settings and ids: each request gets its own
``GenerationConfig(max_new_tokens, ignore_eos=True, logprobs=1)``, greedy ``do_sample=False``,
sampled ``do_sample=True`` with ``temperature``, ``top_p`` and ``rng_seed`` = the request's seed
(``top_k`` left at its default, no truncation); the logprobs are the handle's
``generated_log_probs`` (measured: the log-softmax of the raw logits, before temperature). The
``SchedulerConfig``: ``enable_prefix_caching`` = ``params.prefix_caching``; a chunked-prefill
budget b is ``dynamic_split_fuse=True, max_num_batched_tokens=b``, none is
``dynamic_split_fuse=False`` with a budget of :data:`WHOLE_BUDGET`; ``num_kv_blocks`` =
:data:`KV_BLOCKS` (the plugin sets the block size: no "kv_pool"). Speculation: "draft" is the
``draft_model`` property (the draft folder converted the same way), "ngram" ``prompt_lookup=True``
with ``max_ngram_size`` = :data:`NGRAM`; γ is ``num_assistant_tokens``. One pipeline per
setting, kept across calls (its prefix cache lives on). ``serve``: arrivals (each
``add_request`` before the pipeline's ``step`` of its index); no forks, no counts.

``openvino_genai_llm``: ``LLMPipeline``, one ``generate`` per request with an ``ov.Tensor`` of
ids; its ``EncodedResults`` give a sequence's summed log-probability (``scores``), not one per
token, so it declares no logprobs. Greedy and sampled, the same ``GenerationConfig``; speculation
through the same properties.
"""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
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

#: Compile properties of every pipeline: float32 compute and KV cache (see the module docstring).
PRECISION = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
#: KV blocks of a ContinuousBatchingPipeline (blocks of the plugin's size: 32 tokens on the CPU).
KV_BLOCKS = 512
#: Token budget of a step without chunked prefill (every prompt of the laws fits whole).
WHOLE_BUDGET = 4096
#: n-gram order of the prompt lookup (the small world's prompts are short).
NGRAM = 2
#: Seconds one call may step before it fails (RuntimeError), never hangs.
TIMEOUT_S = 300.0
#: The suffix of a converted folder, beside the exported one.
SUFFIX = ".openvino"


def _stamp(folder: Path) -> str:
    h = hashlib.sha256()
    for name in ("config.json", "model.safetensors"):
        h.update((folder / name).read_bytes())
    return h.hexdigest()


def converted(folder) -> Path:
    """The OpenVINO IR of ``folder`` (``FOLDER.openvino``), converted by optimum-cli unless the
    stamp kept there matches the folder's. Raises RuntimeError with the exporter's last words."""
    src = Path(folder)
    out = src.with_name(src.name + SUFFIX)
    stamp = _stamp(src)
    if (out / "stamp").is_file() and (out / "stamp").read_text() == stamp:
        return out
    tmp = Path(tempfile.mkdtemp(prefix=src.name + SUFFIX + "-", dir=src.parent))
    try:
        run = subprocess.run([sys.executable, "-m", "optimum.commands.optimum_cli", "export", "openvino",
                              "--model", str(src), "--weight-format", "fp32", "--task", "text-generation-with-past",
                              str(tmp / "ir")], capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"optimum-cli export openvino failed on {src}: {run.stderr.strip()[-2000:]}")
        (tmp / "ir" / "stamp").write_text(stamp)
        shutil.rmtree(out, ignore_errors=True)
        try:
            (tmp / "ir").rename(out)
        except OSError:                          # another process converted it meanwhile
            if not ((out / "stamp").is_file() and (out / "stamp").read_text() == stamp):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _config(r, params, spec: bool):
    """The request's ``GenerationConfig`` (the contract's settings, nothing else)."""
    import openvino_genai as ov_genai

    from inference_conformance.conformance.contracts.inference_engine import sampling_of

    t, p = sampling_of(r, params)
    c = ov_genai.GenerationConfig()
    c.max_new_tokens = r.max_new_tokens
    c.ignore_eos = True
    c.logprobs = 1
    if t == 0:
        c.do_sample = False
    else:
        c.do_sample, c.temperature, c.top_p = True, float(t), float(p)
        if r.seed is not None:
            c.rng_seed = int(r.seed)
    if spec:
        c.num_assistant_tokens = int(params.num_speculative_tokens)
        if params.speculative == "ngram":
            c.max_ngram_size = NGRAM
    return c


def _ids(prompt):
    import openvino as ov

    return ov.Tensor(np.array([list(prompt)], dtype=np.int64))


def _speculative(params) -> dict:
    """The pipeline properties of ``params.speculative``."""
    import openvino_genai as ov_genai

    if params.speculative == "draft":
        return {"draft_model": ov_genai.draft_model(str(converted(params.draft)), "CPU", **PRECISION)}
    if params.speculative == "ngram":
        return {"prompt_lookup": True}
    return {}


class OpenVINOContinuous:
    """openvino-genai 2026.4 ``ContinuousBatchingPipeline`` on the CPU, float32."""

    WHO = "openvino-genai's ContinuousBatchingPipeline"

    def __init__(self):
        self._pipes: dict = {}
        self._next_id = 0

    def capabilities(self) -> Capabilities:
        return Capabilities(dtype=torch.float32, batching=True, padding=(), prefix_caching=True, chunked_prefill=True,
                            speculative=("draft", "ngram"), seeded_sampling="request", top_p=True, logprobs=True,
                            batch_invariant=False, serving=("arrivals",), per_request_params=True)

    def pipeline(self, params):
        """The pipeline of ``params``' scheduler and speculation settings, built once."""
        key = (str(params.model), bool(params.prefix_caching), params.chunked_prefill, params.speculative,
               str(params.draft) if params.speculative == "draft" else None)
        if key not in self._pipes:
            import openvino_genai as ov_genai

            sc = ov_genai.SchedulerConfig()
            sc.num_kv_blocks = KV_BLOCKS
            sc.enable_prefix_caching = bool(params.prefix_caching)
            sc.dynamic_split_fuse = params.chunked_prefill is not None
            sc.max_num_batched_tokens = params.chunked_prefill or WHOLE_BUDGET
            self._pipes[key] = ov_genai.ContinuousBatchingPipeline(str(converted(params.model)), sc, "CPU",
                                                                  {**PRECISION, **_speculative(params)})
        return self._pipes[key]

    @torch.no_grad()
    def generate(self, requests, params) -> list[Completion]:
        validate(requests, params)
        refuse_unoffered(self.capabilities(), requests, params, self.WHO)
        check_vocab(requests, folder_vocab_size(params.model))
        return self._run(requests, params, [0] * len(requests))

    @torch.no_grad()
    def serve(self, schedule, params) -> dict:
        """The contract's ``serve``: each Arrival added before the pipeline's step of its index."""
        from inference_conformance.conformance.contracts.inference_engine import (
            Arrival,
            refuse_unserved,
            validate_serve,
        )

        validate_serve(schedule, params)
        refuse_unserved(self.capabilities().serving, schedule, params, self.WHO)
        arrivals = [e for e in schedule if isinstance(e, Arrival)]
        reqs = [e.request for e in arrivals]
        refuse_unoffered(self.capabilities(), reqs, params, self.WHO)
        check_vocab(reqs, folder_vocab_size(params.model))
        return dict(zip((e.id for e in arrivals), self._run(reqs, params, [e.step for e in arrivals])))

    def _run(self, requests, params, steps) -> list[Completion]:
        import openvino_genai as ov_genai

        pipe = self.pipeline(params)
        spec = params.speculative is not None
        order = sorted(range(len(requests)), key=lambda i: steps[i])
        handles: dict = {}
        step, deadline = 0, time.monotonic() + TIMEOUT_S
        while order or pipe.has_non_finished_requests():
            while order and steps[order[0]] <= step:
                i = order.pop(0)
                handles[i] = pipe.add_request(self._next_id, _ids(requests[i].prompt),
                                              _config(requests[i], params, spec))
                self._next_id += 1
            if pipe.has_non_finished_requests():
                pipe.step()
            step += 1
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.WHO} did not finish {len(requests)} requests in {TIMEOUT_S:g} s")
        out = []
        for i, r in enumerate(requests):
            status = handles[i].get_status()
            if status != ov_genai.GenerationStatus.FINISHED:
                raise RuntimeError(f"{self.WHO}: request {i} ended {status}")
            o = handles[i].read_all()[0]
            out.append(Completion(torch.tensor(list(o.generated_ids), dtype=torch.int64),
                                  torch.tensor(list(o.generated_log_probs), dtype=torch.float64)))
        return out


class OpenVINOLLM:
    """openvino-genai 2026.4 ``LLMPipeline`` on the CPU, float32: one ``generate`` per request."""

    WHO = "openvino-genai's LLMPipeline"

    def __init__(self):
        self._pipes: dict = {}

    def capabilities(self) -> Capabilities:
        return Capabilities(dtype=torch.float32, batching=True, speculative=("draft", "ngram"),
                            seeded_sampling="request", top_p=True, logprobs=False, batch_invariant=False,
                            per_request_params=True)

    def pipeline(self, params):
        key = (str(params.model), params.speculative, str(params.draft) if params.speculative == "draft" else None)
        if key not in self._pipes:
            import openvino_genai as ov_genai

            self._pipes[key] = ov_genai.LLMPipeline(str(converted(params.model)), "CPU",
                                                    **PRECISION, **_speculative(params))
        return self._pipes[key]

    @torch.no_grad()
    def generate(self, requests, params) -> list[Completion]:
        validate(requests, params)
        refuse_unoffered(self.capabilities(), requests, params, self.WHO)
        check_vocab(requests, folder_vocab_size(params.model))
        pipe = self.pipeline(params)
        spec = params.speculative is not None
        out = []
        for r in requests:
            res = pipe.generate(_ids(r.prompt), _config(r, params, spec))
            out.append(Completion(torch.tensor(list(res.tokens[0]), dtype=torch.int64), None))
        return out
