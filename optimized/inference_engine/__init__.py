"""The ``inference_engine`` contract's built-ins: the float64 reference (``reference``, the engine of
:mod:`inference_conformance.reference.inference_engine` given the small world's folder reader), the suite's own
engines through thin adapters (:mod:`.suite`: ``paged``, the continuous-batching engine with its
prefix cache and chunked prefill; ``speculative``, the speculative engine with a draft model) and
the adapters of real engines (:mod:`.hf`: transformers' ``generate``, and :mod:`.hf_continuous`: its
continuous batching, peer set "hf";
:mod:`.ctranslate2`, :mod:`.ort_genai`, :mod:`.vllm` and :mod:`.vllm_server` (``vllm serve`` judged
over HTTP by :mod:`.openai_server`, the adapter ``--engine-url`` uses for any OpenAI-compatible
server), peer set "engines"; :mod:`.openvino_genai`, OpenVINO GenAI's
ContinuousBatchingPipeline and LLMPipeline, peer set "openvino"; :mod:`.mistralrs`, mistral.rs's
Python ``Runner``, peer set "mistralrs"; :mod:`.transformers_server`, ``transformers serve`` with and
without continuous batching judged over HTTP, peer set "hf-serve"), each listed unavailable, with the
reason, outside its environment or where its package is missing."""
from __future__ import annotations


def implementations():
    from inference_conformance.conformance.registry import builtin
    from inference_conformance.optimized.inference_engine import (ctranslate2, hf, hf_continuous, mistralrs,
                                                                  openvino_genai, ort_genai, suite, transformers_server, vllm,
                                                                  vllm_server)

    return (
        builtin("inference_engine", "reference", suite.reference_engine()),
        builtin("inference_engine", "paged", suite.PagedAdapter()),
        builtin("inference_engine", "speculative", suite.SpeculativeAdapter()),
        *hf.registrations(),
        builtin("inference_engine", "hf_continuous", hf_continuous.HFContinuous(), needs="transformers", adapter=True,
                peer="hf"),
        builtin("inference_engine", "ctranslate2", ctranslate2.CT2Generate(), needs="ctranslate2", adapter=True,
                peer="engines"),
        builtin("inference_engine", "ort_genai", ort_genai.OrtGenAI(), needs="onnxruntime_genai", adapter=True,
                peer="engines"),
        builtin("inference_engine", "openvino_genai", openvino_genai.OpenVINOContinuous(), needs="openvino_genai",
                adapter=True, peer="openvino"),
        builtin("inference_engine", "openvino_genai_llm", openvino_genai.OpenVINOLLM(), needs="openvino_genai",
                adapter=True, peer="openvino"),
        builtin("inference_engine", "mistralrs", mistralrs.MistralRS(), needs="mistralrs", adapter=True,
                peer="mistralrs"),
        builtin("inference_engine", "vllm", vllm.VLLMEngine(), needs="vllm", adapter=True, peer="engines"),
        builtin("inference_engine", "vllm_server", vllm_server.VLLMServer(), needs="vllm", adapter=True, peer="engines"),
        # transformers[serving]'s server runs on uvicorn (absent from a plain transformers install)
        builtin("inference_engine", "transformers_server", transformers_server.TransformersServer(), needs="uvicorn",
                adapter=True, peer="hf-serve"),
        builtin("inference_engine", "transformers_server_cb", transformers_server.TransformersServer(True),
                needs="uvicorn", adapter=True, peer="hf-serve"),
    )
