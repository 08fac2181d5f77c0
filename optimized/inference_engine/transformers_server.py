"""``transformers serve`` (transformers 5.24, ``pip install transformers[serving]``) as its users run
it: a process on 127.0.0.1 serving the exported folder, judged over HTTP by
:class:`.openai_server.OpenAIServer` under concurrent load (peer set "hf-serve", ``tox -e
peers-hf-serve``). Two registrations: ``transformers_server`` (each request its own
``generate()`` call) and ``transformers_server_cb`` (``--continuous-batching``: one
``ContinuousBatchingManager`` for every request, paged KV cache). The in-process engines of the
same library are :mod:`.hf` and :mod:`.hf_continuous`.

Its ``/v1/completions`` takes text prompts only and refuses fields outside OpenAI's schema
("prompt must be a string", "Unexpected fields in the request: {'ignore_eos'}"), and answers text
without logprobs ("logprobs" is among its accepted-but-unsupported fields): the client speaks the
text dialect (:mod:`.openai_protocol`), the ids' words in the suite's word-level vocabulary. The
adapter translates settings and ids only; what it cannot send per request is written into a
staging folder next to links to the weights, each change forced by the server's own behaviour:

* ``config.json`` and ``generation_config.json`` have no ``eos_token_id``: no request field stops
  the stop token from ending a completion (there is no ``ignore_eos``);
* ``generation_config.json`` says ``do_sample: true`` and ``top_k: 0``: the server sets
  ``do_sample`` only to turn it off (temperature 0) and otherwise keeps the folder's, so with the
  exported ``do_sample: false`` a temperature-1 request is answered greedily, and with no
  ``top_k`` it samples among the 50 likeliest tokens (``GenerationConfig``'s default), which the
  OpenAI protocol cannot switch off; a chat model's folder sets both the same way;
* the tokenizer's added tokens (``<pad>``, ``<bos>``, ``<eos>``, ``<unk>``) are not special, its
  config names no ``bos_token``/``eos_token``/``pad_token``/``unk_token`` and
  ``clean_up_tokenization_spaces`` is off: the server decodes with ``skip_special_tokens``, which
  would drop them from the answer's text (the ids could not be read back).

The model is read in float32 (``--dtype float32``) on the CPU (``--device cpu``). Prefix caching,
chunked prefill and speculation are not offered by the server (refused); seeds are accepted per
request (``seed``, applied with ``torch.manual_seed`` when the request is read), top-p too.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

from inference_conformance.conformance.contracts.inference_engine import Capabilities
from inference_conformance.optimized.inference_engine.openai_server import OpenAIServer
from inference_conformance.optimized.inference_engine.server_process import LaunchedServers, ServerProcess


def stage(folder) -> Path:
    """A copy of the exported ``folder`` the server is started on (module docstring): links to the
    weights, the configs without ``eos_token_id``, sampling by temperature with no top-k, the
    tokenizer with its added tokens not special. ValueError naming ``folder`` where it is not an
    exported folder (no ``config.json`` or ``tokenizer.json``)."""
    src = Path(folder)
    if not (src / "config.json").is_file() or not (src / "tokenizer.json").is_file():
        raise ValueError(f"folder must be an exported model folder (config.json, tokenizer.json), got {str(folder)!r}")
    out = Path(tempfile.mkdtemp(prefix="transformers-serve-"))
    (out / "model.safetensors").symlink_to(src.resolve() / "model.safetensors")
    config = json.loads((src / "config.json").read_text()) | {"eos_token_id": None}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    gen = {"bos_token_id": config.get("bos_token_id"), "pad_token_id": config.get("pad_token_id"),
           "eos_token_id": None, "do_sample": True, "top_k": 0}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))
    tok = json.loads((src / "tokenizer.json").read_text())
    for added in tok.get("added_tokens", []):
        added["special"] = False
    (out / "tokenizer.json").write_text(json.dumps(tok))
    tok_config = {}
    if (src / "tokenizer_config.json").is_file():
        tok_config = json.loads((src / "tokenizer_config.json").read_text())
    tok_config = {k: v for k, v in tok_config.items() if not k.endswith("_token")}   # no special ids to skip
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config | {"clean_up_tokenization_spaces": False}))
    return out


#: ``--continuous-batching``'s KV cache: blocks of 16 tokens, 512 of them (8192 tokens, 32 MiB for
#: the small world). Unset, the manager sizes its cache from the machine's memory (14 GB here: two
#: such servers at once were ended by the kernel's out-of-memory killer).
CB_BLOCK_SIZE, CB_NUM_BLOCKS = 16, 512


def serve_argv(folder, continuous_batching: bool) -> list[str]:
    """``python -m transformers.cli.transformers serve FOLDER`` on the CPU in float32."""
    argv = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(folder), "--device", "cpu",
            "--dtype", "float32", "--log-level", "warning"]
    cb = ["--continuous-batching", "--cb-block-size", str(CB_BLOCK_SIZE), "--cb-num-blocks", str(CB_NUM_BLOCKS)]
    return argv + (cb if continuous_batching else [])


class TransformersServer(LaunchedServers):
    """``transformers serve`` on a staged copy of the folder, one process per folder."""

    #: the distributions the run records beside ``uvicorn`` (the registration's ``needs``)
    packages = ("transformers", "fastapi")

    def __init__(self, continuous_batching: bool = False):
        super().__init__()
        self.continuous_batching = bool(continuous_batching)
        self.NAME = "transformers serve" + (" --continuous-batching" if self.continuous_batching else "")
        self._staged: dict[str, Path] = {}

    def launch(self, params) -> tuple[ServerProcess, OpenAIServer]:
        key = str(params.model)
        if key not in self._staged:
            self._staged[key] = stage(params.model)
        argv = serve_argv(self._staged[key], self.continuous_batching)
        proc = ServerProcess(argv, env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "warning"})
        return proc, OpenAIServer(proc.url, settings={"argv": argv[3:]}, dialect="text")

    def capabilities(self) -> Capabilities:
        """What the server takes per request (text prompts, temperature, top-p, seed; no logprobs);
        each server's probe answers are recorded in :meth:`environment`."""
        return Capabilities(dtype=torch.float32, batching=True, prefix_caching=False, chunked_prefill=False,
                            speculative=(), seeded_sampling="request", top_p=True, logprobs=False,
                            batch_invariant=False, serving=("arrivals",), per_request_params=True)
